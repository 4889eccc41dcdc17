r"""RL on the recall task: keys whose answers share nothing, hard recipe at temperature 1.

  python -m isojax.main --config=configs/recall.py --workdir=/tmp/isojax/recall
  python -m isojax.main --config=configs/recall.py:micro --workdir=/tmp/isojax/recall_micro

The study's testbed for coverage and sharpening (`isojax.tasks.recall`, docs/study.md):
512 keys, 64 at each level 1..8, each answered right by the shipped base with
probability 2^-level (`isojax/assets/base_models/recall`, constructed by
`launch.build_base`). The base's pass rates hold at temperature 1, so sampling and
evaluation use 1 (the hard recipe's 0.6 would sharpen every key before RL starts). A
completion is one answer token and EOS. The embedding is frozen (`optim.frozen`), so a
key's logits move only when that key is trained. Evaluation is on the training problems
themselves: nothing transfers to held-out keys.
"""

from isojax.config import config_lib


def get_config(arg=None):
  config = config_lib.apply_recipe(config_lib.base_config(), "hard")
  config.task.update(name="recall", num_train=512, num_val=512)
  config.sampling.update(temperature=1.0, max_new_tokens=2)
  # Each key's logits are a few parameters of their own, not a shared network's, so
  # a step must move them by tenths of a nat: a learning rate far above the
  # arithmetic demos'. The embedding stays one-hot: trained, a key's embedding would
  # pick up other keys' dimensions, and Adam, which moves every parameter by about the
  # learning rate whatever its gradient's size, would then drag their rows at random.
  config.optim.learning_rate = LEARNING_RATE
  config.optim.frozen = ("embed",)
  config.rollouts_per_problem = 16
  config.problems_per_batch = 16
  config.num_steps = 200
  config.eval.update(every=20, chunk_problems=512, train_problems=512)
  return config_lib.apply_preset(config, arg)


LEARNING_RATE = 1e-2
