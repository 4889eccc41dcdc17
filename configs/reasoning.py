r"""RL on a reasoning-gym task: the embedded demo of the real-task path, hard recipe.

  python -m isojax.main --config=configs/reasoning.py --workdir=/tmp/isojax/reasoning
  python -m isojax.main --config=configs/reasoning.py:micro --workdir=/tmp/isojax/rg_micro
  python -m isojax.main --config=configs/reasoning.py --workdir=... \
      --config.task.dataset=basic_arithmetic --config.base_model.path=/ckpt/Qwen2.5-1.5B-Instruct

With an empty `base_model.path` the run loads the tiny Qwen2-shaped demo base that
isojax ships (`isojax/assets/base_models/chain_sum`): a locally trained BPE tokenizer,
a Qwen-style chat template and two end-of-sequence ids, SFT-trained on chat-rendered
`chain_sum` problems with worked rationales ("3+4=7, 7-2=5 <answer>5</answer>"); RL
then samples it through the chat template, stops at either id and grades with
reasoning-gym's own `score_answer`. Nothing is downloaded or trained before RL. Any
other reasoning-gym dataset works with a real checkpoint.
"""

import ml_collections

from isojax.config import config_lib
from isojax.tasks import reasoning_gym_task


def get_config(arg=None):
  config = config_lib.apply_recipe(config_lib.base_config(), "hard")
  config.task.update(name="reasoning_gym", dataset=reasoning_gym_task.DEMO_DATASET,
                     num_train=2048, num_val=256, binary_reward=True)
  config.task.dataset_kwargs = ml_collections.ConfigDict(reasoning_gym_task.DEMO_KWARGS)
  config.sampling.max_new_tokens = 40
  # 64 problems x 4 rollouts per step at learning rate 6e-5: the tiny base is sure of
  # most of its answers (few groups carry a signal), so it needs larger steps than the
  # arithmetic demos, and much larger ones drift instead of learning.
  config.rollouts_per_problem = 4
  config.problems_per_batch = 64
  config.num_steps = 300
  config.optim.learning_rate = 6e-5
  config.eval.update(every=10, chunk_problems=128)
  return config_lib.apply_preset(config, arg)
