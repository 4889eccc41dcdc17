"""The update (`update.train_step`): tokens/s, model FLOP/s and its fraction of a
measured float32 matmul peak."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from isojax.bench import datasheets, op_profile, roofline
from isojax.bench.options import Options
from isojax.bench.timing import rate, timed_rounds
from isojax.rl import optimizer, update


def matmul_peak(size: int, calls: int = 5) -> Callable[[], float]:
  """A callable returning the FLOP/s of the fastest of `calls` jitted float32
  [size, size] x [size, size] matmuls (the first call compiles it)."""
  x = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
  f = jax.jit(jnp.matmul)
  return lambda: roofline.fastest_rate(lambda: f(x, x), 2 * size**3, calls)


def bench_update(model, counts: dict, o: Options, rng) -> dict:
  """`train_step` on B sequences of S tokens (one minibatch, one epoch, PPO clip)."""
  graphdef, state = model
  b, s, p = o.update_batch, o.update_seq_len, o.update_prompt_len
  tokens = jnp.asarray(rng.integers(1, o.vocab, (b, s)), jnp.int32)
  mask = jnp.ones((b, s), bool)
  logp = update.score(graphdef, state, tokens, mask, prompt_len=p, temperature=1.0)
  batch = update.TrainBatch(
      tokens=tokens, mask=mask, response_mask=jnp.ones((b, s - p), bool), sampler_logp=logp,
      old_logp=logp, ref_logp=logp, advantages=jnp.asarray(rng.normal(size=b), jnp.float32),
      keep_pg=jnp.ones(b, bool), keep_reg=jnp.ones(b, bool), shuffle_rng=jax.random.key(1))
  settings = update.UpdateSettings(
      group_size=1, prompt_len=p, temperature=1.0, policy_loss="ppo_clip", clip_eps=0.2,
      clip_eps_high=0.2, cispo_eps_max=4.0, aggregation="token_mean",
      constant_normalizer=float(s - p), kl_coef=0.0, kl_form="k3", entropy_coef=0.0,
      tis_threshold=2.0, num_minibatches=1, num_epochs=1, log_entropy=False, log_kl=False)
  tx = optax.adam(1e-5)
  params = jax.tree.map(jnp.copy, state)   # train_step donates its parameters
  mesh = jax.tree.leaves(params)[0].sharding.mesh
  # Moments beside their parameters, as `train.run` places them: the step's outputs
  # then match its inputs and the second call does not compile again.
  init = jax.jit(tx.init, out_shardings=optimizer.opt_state_shardings(tx, params, mesh))
  carry = [params, init(params)]

  def step():
    carry[0], carry[1], stats = update.train_step(graphdef, carry[0], carry[1], batch, tx=tx,
                                                  settings=settings)
    return jax.block_until_ready(stats)

  # Forward + backward = 6 FLOPs per parameter per token; the LM head sees only the
  # response positions; attention scores are not counted.
  flops = 6 * (counts["body"] * b * s + counts["head"] * b * (s - p))
  # Each round measures the peak right before its update step and takes the fraction
  # per round: the peak moves with the machine's drift as the step does.
  best = matmul_peak(o.matmul_size)
  peaks = []
  _, timing = timed_rounds([lambda: peaks.append(best()), step], o.repeats)
  peaks = peaks[1:]   # the warm-up round's left out, as its step's time is
  fractions = [flops / sec / peak for sec, peak in zip(timing.times_s, peaks)]
  kind = jax.devices()[0].device_kind
  datasheet = datasheets.nominal_flops(kind)  # None on a CPU or an unknown card
  profile = None
  if o.update_profile:
    hlo = update.train_step.lower(graphdef, carry[0], carry[1], batch, tx=tx,
                                  settings=settings).compile().as_text()
    seconds = op_profile.kinds(op_profile.traced_events(step, o.update_profile), hlo)
    profile = dict(seconds=seconds, matmul_flops_per_s=flops / seconds["matmul"]
                   if seconds["matmul"] else None)
  return dict(batch=b, seq_len=s, prompt_len=p, **rate(b * s, timing), flops=flops,
              profile=profile,
              flops_per_s=flops / timing.median_s,
              matmul_peak_flops_per_s=float(np.median(peaks)), matmul_peaks=peaks,
              fraction_of_peak=float(np.median(fractions)), device_kind=kind,
              mfu=None if datasheet is None else flops / timing.median_s / datasheet)

