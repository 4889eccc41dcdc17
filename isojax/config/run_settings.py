"""A run's settings as one typed tree: `RunSettings`, the sections each subsystem owns.

Each section is a frozen dataclass in the subsystem it configures (`tasks.settings`,
`models.settings`, `sampling.settings`, `rl.settings`, `eval_settings`,
`metric_writers`); each field carries its default and meaning there (`validation.field`)
and each section checks its own fields. This module adds the run's own fields (the
allocation, checkpoints, logging), the rules that span sections, and the facts derived
from several of them. `config_lib` maps the command line's ConfigDict to this tree and
back; everything below the command line reads the tree.

Allocation fields (the IsoCompute paper's symbols):
  rollouts_per_problem  n    parallel rollouts per problem (GRPO group size)
  problems_per_batch    B_p  distinct problems per update iteration
  num_steps             M    update iterations
  budget_rollouts       C    = B_p * n * M, sampling compute counted in rollouts
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from isojax import eval_settings, metric_writers, tasks, validation
from isojax.models import settings as model_settings
from isojax.rl import settings as rl_settings
from isojax.sampling import settings as sampling_settings

F = validation.field


def _section(cls):
  return dataclasses.field(default_factory=cls, metadata={"section": True})


@dataclasses.dataclass(frozen=True)
class RunSettings(validation.Section):
  """Every setting of a run (`config.json`); `from_config` builds it from a config."""
  seed: int = F(0, "RL seed: sampling keys, problem order, PODS and minibatch draws")
  rollouts_per_problem: int = F(8, "n, rollouts sampled per problem (the group size)")
  problems_per_batch: int = F(16, "B_p, distinct problems per step")
  num_steps: int | None = F(None, "M, update steps; derived from `budget_rollouts` when "
                            "unset", kind=int)
  budget_rollouts: int | None = F(None, "C = B_p * n * M, sampling compute in rollouts; "
                                  "filled in from the others", kind=int)
  task: tasks.TaskSettings = _section(tasks.TaskSettings)
  base_model: model_settings.BaseModelSettings = _section(model_settings.BaseModelSettings)
  model: model_settings.ModelSettings = _section(model_settings.ModelSettings)
  sampling: sampling_settings.SamplingSettings = _section(sampling_settings.SamplingSettings)
  rl: rl_settings.RLSettings = _section(rl_settings.RLSettings)
  critic: rl_settings.CriticSettings = _section(rl_settings.CriticSettings)
  optim: rl_settings.OptimSettings = _section(rl_settings.OptimSettings)
  eval: eval_settings.EvalSettings = _section(eval_settings.EvalSettings)
  mesh: model_settings.MeshSettings = _section(model_settings.MeshSettings)
  checkpoint_every: int = F(20, "steps between checkpoints")
  checkpoint_keep: int = F(2, "newest checkpoints kept, beside the one from before a "
                           "collapse; with 2 or more, a run whose newest checkpoint is "
                           "damaged resumes from the one before it "
                           "([run_directory.md](run_directory.md))")
  log_every: int = F(1, "steps between metrics lines (evaluation steps are always written)")
  guard: rl_settings.GuardSettings = _section(rl_settings.GuardSettings)
  metric_writers: metric_writers.MetricWritersSettings = _section(
      metric_writers.MetricWritersSettings)

  def __post_init__(self):
    for f in dataclasses.fields(self):
      if f.metadata.get("section"):
        object.__setattr__(self, f.name, _as_section(f.default_factory, getattr(self, f.name)))
    self._fill_allocation()
    self._check_spanning_rules()
    validation.positive_int("checkpoint_every", self.checkpoint_every)
    validation.positive_int("checkpoint_keep", self.checkpoint_keep)
    validation.positive_int("log_every", self.log_every)
    tasks.validate(self.task)  # the family's own fields (task.name is checked there)

  def _fill_allocation(self) -> None:
    """Checks n, B_p, M and C and fills the missing one of M and C."""
    n = validation.positive_int("rollouts_per_problem", self.rollouts_per_problem)
    b_p = validation.positive_int("problems_per_batch", self.problems_per_batch)
    steps, budget = self.num_steps, self.budget_rollouts
    if steps is None and budget is None:
      raise ValueError("set num_steps (M) or budget_rollouts (C = B_p * n * M)")
    if steps is None:
      validation.positive_int("budget_rollouts", budget)
      if budget % (n * b_p):
        raise ValueError(
            f"budget_rollouts={budget} is not a multiple of problems_per_batch * "
            f"rollouts_per_problem = {b_p} * {n} = {b_p * n}")
      steps = budget // (n * b_p)
    validation.positive_int("num_steps", steps)
    if budget is not None and budget != n * b_p * steps:
      raise ValueError(
          f"budget_rollouts={budget} disagrees with problems_per_batch * "
          f"rollouts_per_problem * num_steps = {b_p} * {n} * {steps} = {b_p * n * steps}")
    object.__setattr__(self, "num_steps", steps)
    object.__setattr__(self, "budget_rollouts", n * b_p * steps)

  def _check_spanning_rules(self) -> None:
    rl, sampling = self.rl, self.sampling
    rl.check_allocation(self.rollouts_per_problem, self.problems_per_batch,
                        sampling.max_new_tokens)
    if rl.max_staleness and rl.off_policy == "pipeline_in_flight" and sampling.decode_slots:
      raise ValueError(f"rl.off_policy='pipeline_in_flight' switches weights between lockstep "
                       f"decode segments: set sampling.decode_slots=0 (got "
                       f"{sampling.decode_slots})")
    if self.model.lora.rank and rl.uses_critic and self.critic.trunk == "own":
      raise ValueError("model.lora.rank > 0 with rl.advantage='gae' and critic.trunk='own': "
                       "the critic would train a full copy of the policy's weights; set "
                       "critic.trunk='policy' (a value head on the policy's trunk)")
    if self.mesh.rollout_fraction and not rl.max_staleness:
      raise ValueError(f"mesh.rollout_fraction={self.mesh.rollout_fraction} needs "
                       "rl.max_staleness > 0: devices that only sample would idle through "
                       "every synchronous update")
    for what, group in (("rollouts_per_problem", self.rollouts_per_problem),
                        ("eval.num_samples", self.eval.num_samples)):
      if 0 < sampling.max_rollouts_per_call < group:
        raise ValueError(f"sampling.max_rollouts_per_call={sampling.max_rollouts_per_call} "
                         f"is smaller than {what}={group}: a sampler call holds whole groups")

  @classmethod
  def from_config(cls, config: Mapping[str, Any]) -> RunSettings:
    """The tree of a config (a ConfigDict or its plain-dict form, as in `config.json`)."""
    as_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return validation.from_mapping(cls, as_dict)

  def to_dict(self) -> dict[str, Any]:
    """Plain nested dicts, the layout of `config.json` (tuples kept as tuples)."""
    return dataclasses.asdict(self)

  # Facts derived from several fields: each is computed here and nowhere else.
  @property
  def train_rollouts_per_problem(self) -> int:
    """m: rollouts per problem the update trains on (n unless PODS down-samples)."""
    return self.rl.train_rollouts(self.rollouts_per_problem)

  @property
  def rollouts_per_step(self) -> int:
    """B_p * n: the rollouts a step samples (before dynamic sampling's extra rounds)."""
    return self.problems_per_batch * self.rollouts_per_problem

  @property
  def trained_batch_rollouts(self) -> int:
    """B_p * m: the rollouts an update trains on (the batch the LR rule scales with)."""
    return self.problems_per_batch * self.train_rollouts_per_problem

  @property
  def warmup_steps(self) -> int:
    """The LR warm-up in RL steps (`optim.warmup_steps`, or `optim.warmup_rollouts` over
    the rollouts a step samples, rounded up)."""
    return self.optim.warmup(self.rollouts_per_step)

  @property
  def sampler_weights_dtype(self) -> str | None:
    """The dtype a sampler call casts the weights to (None: as stored, float32):
    `sampling.settings.cast_weights_dtype` of the sampler's activations."""
    return sampling_settings.cast_weights_dtype(self.sampling.weights_dtype,
                                                self.sampling.dtype or self.model.dtype)

  @property
  def generator_weights_dtype(self) -> str | None:
    """The dtype off-policy generation keeps each version's copy of the weights in: the
    sampler's (`off_policy.weight_snapshot` casts once per version, so its calls cast
    nothing), or None for a float32 copy. LoRA keeps float32: the sampler merges the
    adapters into the weights before it casts."""
    cast = self.sampler_weights_dtype
    return None if self.model.lora.enabled or cast in (None, "float32") else cast

  @property
  def learning_rate(self) -> float:
    """The peak LR: `optim.learning_rate` scaled with the trained batch B_p * m."""
    return self.optim.peak_learning_rate(self.trained_batch_rollouts)


def _as_section(cls, value):
  """A section given as a mapping (a config's) built into its dataclass."""
  return value if isinstance(value, cls) else cls.from_config(value)


def section_types() -> dict[str, type]:
  """Each section's field name and dataclass, in `config.json`'s order."""
  return {f.name: f.default_factory for f in dataclasses.fields(RunSettings)
          if f.metadata.get("section")}
