"""Fixtures of the RL tests."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from isojax import tasks
from isojax.config import config_lib
from isojax.models import hf_checkpoint, lora, sharding
from isojax.models import tokenizer as tokenizer_lib
from isojax.rl import optimizer
from isojax.rl import step as rl_step
from isojax.run import run_inputs
from isojax.tasks import prompts


def _run_parts(config):
  """What train.run builds before its loop, built here step by step: (resolved config,
  tokenizer, training problems, prompt book, verifier, graphdef, learner)."""
  config = config_lib.resolve(config)
  s = config_lib.settings(config)
  mesh = sharding.make_mesh(config.mesh)
  path = run_inputs.policy_path(s)
  tok = tokenizer_lib.load_tokenizer(path)
  loaded = prompts.load_task(s.task, tok, problems_per_batch=s.problems_per_batch)
  train_problems, book = loaded.train, loaded.book
  verifier = tasks.make_verifier(config.task)
  graphdef, params = nnx.split(hf_checkpoint.load_model(path, mesh, **config.model))
  use_lora = config.model.lora.rank > 0
  trained = lora.trained_and_frozen(params, enabled=use_lora)[0]
  tx, _ = optimizer.make_optimizer(s.optim, peak_learning_rate=s.learning_rate,
                                warmup_steps=s.warmup_steps,
                                updates_per_step=s.rl.updates_per_step)
  opt_state = jax.jit(tx.init, out_shardings=optimizer.opt_state_shardings(tx, trained, mesh))(
      trained)
  ref = None
  if config.rl.log_kl_to_base:
    ref = lora.disabled(params) if use_lora else jax.tree.map(jnp.copy, params)
  learner = rl_step.Learner(s.rl, s.sampling, s.rollouts_per_problem, lora=use_lora, mesh=mesh,
                            graphdef=graphdef, params=params, opt_state=opt_state,
                            ref_params=ref, tx=tx)
  return config, tok, train_problems, book, verifier, graphdef, learner


@pytest.fixture
def run_parts():
  """`_run_parts`: a reference loop's starting point, the same as train.run's."""
  return _run_parts
