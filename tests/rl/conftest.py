"""Fixtures of the RL tests."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from isojax import config_lib, tasks, train
from isojax.models import hf_checkpoint, lora, sharding
from isojax.models import tokenizer as tokenizer_lib
from isojax.rl import step as rl_step
from isojax.rl import update


def _run_parts(config):
  """What train.run builds before its loop, built here step by step: (resolved config,
  tokenizer, training problems, prompt book, verifier, graphdef, learner)."""
  config = config_lib.resolve(config)
  mesh = sharding.make_mesh(config.mesh)
  path = train.policy_path(config)
  tok = tokenizer_lib.load_tokenizer(path)
  train_problems, _, book, _, _ = train.load_task(config, tok)
  verifier = tasks.make_verifier(config.task)
  graphdef, params = nnx.split(hf_checkpoint.load_model(path, mesh, **config.model))
  use_lora = config.model.lora.rank > 0
  trained = lora.split(params)[0] if use_lora else params
  tx, _ = update.make_optimizer(config)
  opt_state = jax.jit(tx.init, out_shardings=update.opt_state_shardings(tx, trained, mesh))(
      trained)
  ref = None
  if config.rl.log_kl_to_base:
    ref = lora.disabled(params) if use_lora else jax.tree.map(jnp.copy, params)
  learner = rl_step.Learner(config, mesh, graphdef, params, opt_state, ref, tx)
  return config, tok, train_problems, book, verifier, graphdef, learner


@pytest.fixture
def run_parts():
  """`_run_parts`: a reference loop's starting point, the same as train.run's."""
  return _run_parts
