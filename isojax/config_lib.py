"""The config schema, the recipe table, and config validation: one place for each.

Config files under `configs/` start from `base_config()`, apply a row of `RECIPES`
and a preset, and return an `ml_collections.ConfigDict`. `isojax.main` calls
`resolve(config)` before any compilation: it rejects unknown fields and impossible
allocations with errors that name the field, and derives `num_steps` from
`budget_rollouts` when only the budget is given.

Allocation fields (the IsoCompute paper's symbols):
  rollouts_per_problem  n    parallel rollouts per problem (GRPO group size)
  problems_per_batch    B_p  distinct problems per update iteration
  num_steps             M    update iterations
  budget_rollouts       C    = B_p * n * M, sampling compute counted in rollouts
"""

from __future__ import annotations

import difflib
import importlib.util
from typing import Any

import ml_collections
from ml_collections import config_dict

from isojax import eval_settings, storage, tasks, validation
from isojax.models import settings as model_settings
from isojax.rl import settings as rl_settings
from isojax.sampling import settings as sampling_settings

# The IsoCompute paper's regularisation table: the easy recipe adds a KL anchor and an
# entropy bonus, the hard recipe neither. Entropy is never used without the KL anchor.
# Coefficients are the tiny-model values; the paper-scale presets keep the same switches.
RECIPES: dict[str, dict[str, Any]] = {
    "easy": dict(kl_coef=0.01, entropy_coef=0.001, zero_variance_filter="off"),
    "hard": dict(kl_coef=0.0, entropy_coef=0.0, zero_variance_filter="off"),
}


def base_config() -> ml_collections.ConfigDict:
  """Every field isojax knows, with the tiny-CPU defaults."""
  c = ml_collections.ConfigDict()
  c.seed = 0

  # Allocation: C = B_p * n * M.
  c.rollouts_per_problem = 8
  c.problems_per_batch = 16
  c.num_steps = config_dict.placeholder(int)  # derived from budget when unset
  c.budget_rollouts = config_dict.placeholder(int)

  c.task = ml_collections.ConfigDict(dict(
      name="arithmetic",
      min_digits=1,          # difficulty knob: operand digits drawn in [min, max]
      max_digits=3,
      num_train=2048,        # distinct training problems
      num_val=256,           # held-out validation problems
      # > 0: train on this many of the training problems (the first of a fixed shuffle
      # by task.seed), whatever the source: the problem-set-size experiment's knob.
      max_train_problems=0,
      seed=1234,
      split="",              # a profiled split's name (launch.profile); "" generates
      splits_dir="~/.cache/isojax/splits",
      # reasoning_gym: a reasoning-gym dataset by name and its keyword arguments.
      dataset="",
      dataset_kwargs=ml_collections.ConfigDict(),
      # math: local files (comma-separated JSONL / JSON / Parquet / CSV, or a
      # `datasets.save_to_disk` directory) or a TFDS dataset prepared under data_dir.
      format="generic",      # field mapping: generic | gsm8k | math | dapo | polaris | deepscaler
      train_files="",
      val_files="",          # "" holds out num_val training problems (deterministic in seed)
      tfds_name="",
      data_dir="",
      train_split="train",   # split names inside a DatasetDict / TFDS dataset
      val_split="",
      question_field="",     # generic mapping (or an override of a named one)
      answer_field="",
      answer_pattern="",     # regex with one group; "" = the family's default extraction
      binary_reward=False,   # reasoning_gym: 1 only for full marks (no partial credit)
      # Prompts: the checkpoint's chat template (auto: when it has one) or plain text.
      prompt_format="auto",  # auto | chat | plain
      system_prompt="",
      instruction=config_dict.placeholder(str),  # None = the family's default instruction
      max_prompt_tokens=1024,  # longer prompts are dropped (and counted) at load time
      # Verification in worker processes, each completion cut off after the timeout.
      verifier_timeout_s=5.0,
      verifier_workers=0,    # 0 = min(4, CPU count)
  ))

  # The base policy: a Hugging Face checkpoint directory, or (when `path` is empty)
  # the demo base model isojax ships for task.name (`tasks.demo_bases`).
  c.base_model = ml_collections.ConfigDict(dict(path=""))
  c.model = ml_collections.ConfigDict(dict(
      dtype="float32",       # activations; parameters stay float32
      fp32_lm_head=True,     # logits in float32 (ScaleRL)
      remat="none",          # none | full | a models.settings.REMAT_POLICIES name
      attention_chunk=0,     # queries per attention block (memory [B, N, chunk, S]); 0: all
      # Low-rank adapters (models/lora.py): rank 0 trains every weight; rank r > 0 trains
      # only A [in, r] and B [r, out] beside each target projection, scaled by alpha / r.
      lora=ml_collections.ConfigDict(dict(
          rank=0, alpha=16.0, targets=model_settings.LORA_TARGETS, dropout=0.0)),
  ))

  c.sampling = ml_collections.ConfigDict(dict(
      temperature=0.6,
      top_p=1.0,
      top_k=0,               # 0 disables top-k
      max_new_tokens=8,
      max_rollouts_per_call=0,  # 0: a step's rollouts in one sampler call
      weights_dtype="",      # "" (as trained) or "bfloat16": weights cast for sampling
      dtype="",              # "" (model.dtype) or "bfloat16": the sampler's activations,
                             # hence its KV caches
      decode_slots=0,        # > 0: continuous batching in this many decode rows per call
      decode_slots_min=0,    # > 0: halve the slots, down to this many, once nothing is
                             # queued and at most half are busy; 0: never
      decode_block=0,        # > 0: attend over the generated cache in blocks of this many
                             # tokens, only the filled ones; 0: the whole cache each step
      stop_token_ids=(),     # ids that end a rollout besides the checkpoint's EOS ids
      # Forced interruptions (ScaleRL): a rollout that has not generated think_end_text
      # within think_budget tokens gets interruption_text written in by the sampler
      # (context, not actions) and may then generate answer_budget more tokens.
      think_budget=0,        # 0: off
      answer_budget=0,
      interruption_text=("Okay, time is up. Let me stop thinking and formulate a final "
                         "answer now. </think>"),
      think_end_text="</think>",
  ))

  c.rl = ml_collections.ConfigDict(dict(
      advantage="grpo",
      advantage_eps=1e-6,
      policy_loss="ppo_clip",
      clip_eps=0.2,
      clip_eps_high=0.28,    # DAPO's upper clip
      cispo_eps_max=4.0,     # CISPO's IS-weight cap
      # Sampler/trainer mismatch correction: rho = pi_trainer / pi_sampler per token or
      # per sequence (the product, or geometric mean, of its token ratios); "truncate"
      # weighs by min(rho, c), "mask" by rho inside [1/c, c] and drops the rest.
      tis_threshold=2.0,     # c > 1; <= 0 disables
      is_level="token",      # token | sequence
      is_mode="truncate",    # truncate | mask
      is_sequence_ratio="product",  # product | geometric (is_level=sequence)
      aggregation="token_mean",
      kl_coef=0.0,
      kl_form="k3",
      log_kl_to_base=True,   # keep the base model to log train/kl even when kl_coef=0
      entropy_coef=0.0,
      zero_variance_filter="off",
      num_minibatches=1,     # per rollout batch; each holds whole groups
      num_epochs=1,
      # PODS: generate n rollouts per problem, train on m of them.
      downsample="none",     # none | max_variance | max_reward | random
      train_rollouts_per_problem=0,  # m; 0 means m = n
      advantages_on="selected",      # selected | generated (decoupled baseline)
      # No-Positive-Resampling: retire problems whose historical pass rate reaches
      # this value (ScaleRL: 0.9); 0 disables it.
      retire_pass_rate=0.0,
      # What a rollout that hits max_new_tokens earns: its verified reward ("reward"),
      # 0 ("zero"), or the verified reward plus DAPO's soft overlong penalty ("dapo",
      # linear from 0 to -1 over the last overlong_cache_tokens tokens).
      overlong="reward",
      overlong_cache_tokens=0,
      # Memory: rollouts per gradient-accumulation micro-batch (0 = the whole minibatch)
      # and the sequence chunk of the log-prob / entropy passes (0 = unchunked).
      micro_batch_size=0,
      logprob_chunk_size=0,
      # Off-policy generation (isojax.rl.off_policy): the rollouts of a step may come
      # from a policy up to max_staleness updates old, so sampling runs beside the
      # update; 0 samples each step with the policy it updates (synchronous). The
      # schedule: "pipeline" samples step s with version max(0, s - k); "ppo_off_policy"
      # samples steps v..v+k-1 with version v (v a multiple of k); "pipeline_in_flight"
      # samples without pause, switching to the newest weights every in_flight_tokens
      # tokens, and drops batches older than k (not reproducible).
      max_staleness=0,
      off_policy="pipeline",
      in_flight_tokens=16,
      # DAPO's dynamic sampling (isojax.rl.dynamic_sampling): sample further rounds of
      # B_p problems until B_p groups have non-zero reward variance, or the cap of rounds
      # is reached (then the rest of the batch is left out of the loss). Every sampled
      # rollout counts in `rollouts`.
      dynamic_sampling=False,
      dynamic_sampling_max_rounds=8,
      # advantage="gae" (PPO with a critic): discount and GAE's lambda over the tokens of
      # a response whose outcome reward arrives on its last token.
      gamma=1.0,
      gae_lambda=1.0,
  ))

  # PPO's value model (`isojax.rl.critic`), built when rl.advantage == "gae": a scalar
  # value head on a decoder of its own, initialised from the policy's weights ("" path)
  # or loaded from a checkpoint directory with the policy's vocabulary; or on the
  # policy's own trunk (trunk="policy": no second decoder, only the head learns).
  c.critic = ml_collections.ConfigDict(dict(
      trunk="own",           # own | policy
      path="",
      train_trunk=True,      # False: only the value head learns
      learning_rate=1e-4,    # its own AdamW (the rest of `optim` as the policy's)
      warmup_steps=0,        # RL steps at the start that train the critic alone
      value_clip=0.2,        # PPO value clipping around the values before the update; 0: off
  ))

  c.optim = ml_collections.ConfigDict(dict(
      learning_rate=1e-4,          # at the reference batch lr_reference_batch
      lr_reference_batch=128,      # B_ref, in rollouts
      lr_scaling="sqrt",
      warmup_steps=10,
      weight_decay=0.0,
      b1=0.9,
      b2=0.99,
      grad_clip_norm=1.0,
  ))

  c.eval = ml_collections.ConfigDict(dict(
      # When to evaluate (`eval_steps`): "linear" every `every` steps, "log" at `count`
      # log-spaced steps (dense early, where the metric moves fastest).
      schedule="linear",     # linear | log
      every=10,              # linear: steps between evaluations
      count=16,              # log: evaluations after step 0 (at most)
      k=4,
      num_samples=8,         # N >= k samples per validation problem
      chunk_problems=256,    # problems per sampler call
      train_problems=128,    # training problems in the pass@1 histogram; 0 disables
  ))

  # Logical mesh: -1 fills with the remaining devices. With rollout_fraction > 0 (and
  # rl.max_staleness > 0) that share of the devices only samples, on its own mesh
  # (data-parallel, `tensor` as here), and the axes above span the rest.
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, rollout_fraction=0.0))

  c.checkpoint_every = 20
  # Newest checkpoints kept: with 2 or more, a run whose latest checkpoint is damaged
  # resumes from the one before it (isojax.checkpointing).
  c.checkpoint_keep = 2
  c.log_every = 1
  # Divergence guard (isojax.rl.guard): a non-finite loss, gradient or parameter always
  # stops the run before it is checkpointed. Zero reward and zero gradient norm for
  # collapse_steps steps in a row log a `collapse` event (0 disables), and stop the run
  # when stop_on_collapse is set.
  c.guard = ml_collections.ConfigDict(dict(
      collapse_steps=5,
      stop_on_collapse=False,
  ))
  # Where metrics are watched besides metrics.jsonl (the record analysis reads):
  # TensorBoard event files in the workdir; W&B when enabled (needs `pip install wandb`).
  c.metric_writers = ml_collections.ConfigDict(dict(
      tensorboard=True,
      wandb=False,
      wandb_project="isojax",
      wandb_entity="",       # "" = your default W&B entity
      wandb_name="",         # "" = the workdir's name
  ))
  return c


def apply_recipe(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  if name not in RECIPES:
    raise ValueError(f"recipe {name!r}: expected one of {sorted(RECIPES)}")
  config.rl.update(RECIPES[name])
  return config


def apply_preset(config: ml_collections.ConfigDict, name: str | None) -> ml_collections.ConfigDict:
  """Applies a size preset: default (laptop CPU), micro (smoke test), paper (7B)."""
  name = name or "default"
  if name == "default":
    return config
  if name == "micro":
    config.rollouts_per_problem = 4
    config.problems_per_batch = 4
    config.num_steps = 3
    config.task.num_train = 64
    config.task.num_val = 16
    config.eval.every = 2
    config.eval.train_problems = 16  # the histogram's path, at the validation set's size
    config.checkpoint_every = 2
    return config
  if name == "paper":
    # Qwen2.5-7B-Instruct on H200s, as in the IsoCompute paper; point base_model.path at
    # a local copy of the checkpoint. LR 1e-6 at B_ref = 1024, scaled by sqrt(B / B_ref).
    config.base_model.path = "/path/to/Qwen2.5-7B-Instruct"
    config.rollouts_per_problem = 64
    config.problems_per_batch = 256
    config.num_steps = 200
    config.model.dtype = "bfloat16"
    config.sampling.max_new_tokens = 8192
    config.optim.update(learning_rate=1e-6, lr_reference_batch=1024, warmup_steps=10,
                        weight_decay=0.0)
    config.eval.update(every=10, num_samples=4, k=4)
    config.mesh.update(data=1, fsdp=-1, tensor=1)
    # Memory (docs/paper_scale.md; checked by `python -m launch.aot`): 64 rollouts per
    # gradient micro-batch, the LM head 512 positions at a time, layers rematerialised,
    # queries attended 1,024 at a time, 4,096 rollouts per sampler call; decode reads
    # the generated cache 512 slots at a time, only as far as it is filled.
    config.rl.update(micro_batch_size=64, logprob_chunk_size=512)
    config.model.update(remat="full", attention_chunk=1024)
    config.sampling.update(max_rollouts_per_call=4096, weights_dtype="bfloat16",
                           decode_block=512)
    config.rl.log_kl_to_base = config.rl.kl_coef > 0  # no second 7B copy unless needed
    config.checkpoint_every = 10
    return config
  raise ValueError(f"preset {name!r}: expected one of default, micro, paper")


def config_from_json(path: storage.PathLike) -> ml_collections.ConfigDict:
  """A config from a JSON file (local or gs://) of (a subset of) its fields over
  `base_config()`."""
  try:
    fields = storage.read_json(path)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"config file {e}") from e
  except ValueError as e:
    raise ValueError(f"config file {e}") from e
  return override(base_config(), fields, f"config file {path}")


def override(config: ml_collections.ConfigDict, fields: dict[str, Any],
             source: str) -> ml_collections.ConfigDict:
  """`config` with the nested `fields` set in place; a field the schema lacks is an
  error naming `source` and the closest known field."""
  extra = unknown_fields(fields, base_config().to_dict())
  if extra:
    raise ValueError(f"{source}: unknown field(s) {describe_unknown(extra)}")
  _merge(config, fields)
  return config


def _merge(config: ml_collections.ConfigDict, fields: dict[str, Any]) -> None:
  for key, value in fields.items():
    if isinstance(value, dict):
      _merge(config[key], value)
    else:
      config[key] = value


# Free-form dicts whose keys belong to another library (a reasoning-gym dataset's
# keyword arguments), checked by the task family instead of this schema.
FREE_FORM_FIELDS = ("task.dataset_kwargs",)


def unknown_fields(config: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> list[str]:
  """Dotted names in `config` that `schema` does not have."""
  unknown = []
  for key, value in config.items():
    name = f"{prefix}{key}"
    if key not in schema:
      unknown.append(name)
    elif name in FREE_FORM_FIELDS:
      continue
    elif isinstance(value, dict) and isinstance(schema[key], dict):
      unknown += unknown_fields(value, schema[key], name + ".")
  return unknown


def _known_fields(schema: dict[str, Any], prefix: str = "") -> list[str]:
  names = []
  for key, value in schema.items():
    names.append(f"{prefix}{key}")
    if isinstance(value, dict):
      names += _known_fields(value, f"{prefix}{key}.")
  return names


def describe_unknown(names: list[str]) -> str:
  """'rl.klcoef (did you mean rl.kl_coef?), foo' for unknown dotted field names."""
  known = _known_fields(base_config().to_dict())
  described = []
  for name in names:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    described.append(f"{name} (did you mean {close[0]}?)" if close else name)
  return ", ".join(described)


def check_overrides(argv: list[str], flag: str = "config") -> None:
  """Rejects `--config.<field>=...` overrides of fields the schema lacks, naming the
  field and the closest known one (ml_collections alone raises a bare KeyError)."""
  schema = base_config().to_dict()
  for arg in argv[1:]:
    if not arg.startswith(f"--{flag}."):
      continue
    name = arg[len(flag) + 3:].split("=", 1)[0]
    if any(name.startswith(f"{free}.") for free in FREE_FORM_FIELDS):
      continue
    if unknown_fields(_nested(name), schema):
      raise ValueError(f"--{flag}.{name}: unknown config field {describe_unknown([name])}")


def unknown_names(names: list[str]) -> list[str]:
  """The dotted field or section names (`optim.learning_rate`, `optim`) the schema lacks."""
  schema = base_config().to_dict()
  return [name for name in names if unknown_fields(_nested(name), schema)]


def _nested(dotted: str) -> dict[str, Any]:
  """'a.b.c' -> {'a': {'b': {'c': None}}}."""
  out: dict[str, Any] = {}
  node = out
  *parents, leaf = dotted.split(".")
  for part in parents:
    node = node.setdefault(part, {})
  node[leaf] = None
  return out


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Validates `config` and fills derived fields; returns a new locked ConfigDict.

  Each section is checked by the typed settings of the subsystem that owns it
  (`models.settings`, `sampling.settings`, `rl.settings`, `eval_settings`, the task
  families); this function adds the allocation and the rules that span sections.
  """
  as_dict = config.to_dict()
  extra = unknown_fields(as_dict, base_config().to_dict())
  if extra:
    raise ValueError(f"unknown config field(s): {describe_unknown(extra)}")
  c = ml_collections.ConfigDict(as_dict)
  n, b_p = _allocation(c)

  model_settings.ModelSettings.from_config(as_dict["model"])
  sampling = sampling_settings.SamplingSettings.from_config(as_dict["sampling"])
  rl = rl_settings.RLSettings.from_config(as_dict["rl"])
  rl_settings.OptimSettings.from_config(as_dict["optim"])
  rl_settings.CriticSettings.from_config(as_dict["critic"])
  evaluation = eval_settings.EvalSettings.from_config(as_dict["eval"])
  rl.check_allocation(n, b_p, sampling.max_new_tokens)
  if rl.max_staleness and rl.off_policy == "pipeline_in_flight" and sampling.decode_slots:
    raise ValueError(f"rl.off_policy='pipeline_in_flight' switches weights between lockstep "
                     f"decode segments: set sampling.decode_slots=0 (got "
                     f"{sampling.decode_slots})")
  if (as_dict["model"]["lora"]["rank"] and rl.uses_critic
      and as_dict["critic"]["trunk"] == "own"):
    raise ValueError("model.lora.rank > 0 with rl.advantage='gae' and critic.trunk='own': "
                     "the critic would train a full copy of the policy's weights; set "
                     "critic.trunk='policy' (a value head on the policy's trunk)")
  mesh = model_settings.MeshSettings.from_config(as_dict["mesh"])
  if mesh.rollout_fraction and not rl.max_staleness:
    raise ValueError(f"mesh.rollout_fraction={mesh.rollout_fraction} needs rl.max_staleness > "
                     "0: devices that only sample would idle through every synchronous update")
  for what, group in (("rollouts_per_problem", n), ("eval.num_samples", evaluation.num_samples)):
    if 0 < sampling.max_rollouts_per_call < group:
      raise ValueError(f"sampling.max_rollouts_per_call={sampling.max_rollouts_per_call} is "
                       f"smaller than {what}={group}: a sampler call holds whole groups")
  _check_task(c.task)
  _check_metric_writers(c.metric_writers)
  _check_robustness(c)
  c.lock()
  return c


def resolve_dict(fields: dict[str, Any]) -> dict[str, Any]:
  """`resolve` of a whole config given as a plain nested dict (a planner prescription,
  `prescribe.to_config`); the resolved config as a plain dict, as written to JSON."""
  return resolve(ml_collections.ConfigDict(fields)).to_dict()


def _allocation(c: ml_collections.ConfigDict) -> tuple[int, int]:
  """Checks n, B_p, M and C and fills the missing one of M and C; returns (n, B_p)."""
  n = validation.positive_int("rollouts_per_problem", c.rollouts_per_problem)
  b_p = validation.positive_int("problems_per_batch", c.problems_per_batch)
  if c.num_steps is None and c.budget_rollouts is None:
    raise ValueError("set num_steps (M) or budget_rollouts (C = B_p * n * M)")
  if c.num_steps is None:
    budget = validation.positive_int("budget_rollouts", c.budget_rollouts)
    if budget % (n * b_p):
      raise ValueError(
          f"budget_rollouts={budget} is not a multiple of problems_per_batch * "
          f"rollouts_per_problem = {b_p} * {n} = {b_p * n}")
    c.num_steps = budget // (n * b_p)
  steps = validation.positive_int("num_steps", c.num_steps)
  if c.budget_rollouts is not None and c.budget_rollouts != n * b_p * steps:
    raise ValueError(
        f"budget_rollouts={c.budget_rollouts} disagrees with problems_per_batch * "
        f"rollouts_per_problem * num_steps = {b_p} * {n} * {steps} = {b_p * n * steps}")
  c.budget_rollouts = n * b_p * steps
  return n, b_p


def _check_task(t: ml_collections.ConfigDict) -> None:
  """The fields every family shares; `isojax.tasks.validate` checks each family's own
  (importing its family, and so `datasets` or reasoning-gym, only when used)."""
  validation.choice("task.prompt_format", t.prompt_format, tasks.PROMPT_FORMATS)
  if not t.verifier_timeout_s > 0:
    raise ValueError(f"task.verifier_timeout_s={t.verifier_timeout_s}: expected > 0")
  validation.non_negative_int("task.verifier_workers", t.verifier_workers,
                              "0 = min(4, CPU count)")
  validation.positive_int("task.max_prompt_tokens", t.max_prompt_tokens)
  validation.non_negative_int("task.max_train_problems", t.max_train_problems,
                              "0: every training problem")
  tasks.validate(t)  # the family's own fields (task.name is checked there)


def _check_metric_writers(w: ml_collections.ConfigDict) -> None:
  for field in ("tensorboard", "wandb"):
    validation.boolean(f"metric_writers.{field}", w[field])
  if w.wandb and importlib.util.find_spec("wandb") is None:
    raise ValueError("metric_writers.wandb=True but the wandb package is not installed: "
                     "`pip install wandb`, or set --config.metric_writers.wandb=False")
  if w.wandb and not w.wandb_project:
    raise ValueError("metric_writers.wandb=True needs metric_writers.wandb_project")


def _check_robustness(c: ml_collections.ConfigDict) -> None:
  """Checkpoints and the divergence guard (isojax.checkpointing, rl/guard.py)."""
  validation.positive_int("checkpoint_every", c.checkpoint_every)
  validation.positive_int("checkpoint_keep", c.checkpoint_keep)
  steps = validation.non_negative_int("guard.collapse_steps", c.guard.collapse_steps,
                                      "0 disables the collapse detector")
  validation.boolean("guard.stop_on_collapse", c.guard.stop_on_collapse)
  if c.guard.stop_on_collapse and not steps:
    raise ValueError("guard.stop_on_collapse=True needs guard.collapse_steps > 0")


def train_rollouts_per_problem(config: ml_collections.ConfigDict) -> int:
  """m: rollouts per problem the update trains on (n unless PODS down-samples)."""
  return config.rl.train_rollouts_per_problem or config.rollouts_per_problem


def learning_rate(config: ml_collections.ConfigDict) -> float:
  """The peak LR of a resolved config, scaled with the trained batch B_p * m."""
  return rl_settings.scaled_learning_rate(
      config.optim.learning_rate,
      train_rollouts_per_problem(config) * config.problems_per_batch,
      config.optim.lr_reference_batch, config.optim.lr_scaling)
