"""Multi-host start-up: `jax.distributed` from the environment the launchers set.

`isojax.main` calls `initialize()` before anything touches a device. The cluster
scripts of `launch.sweep` describe the job in environment variables:

  ISOJAX_COORDINATOR=host:port, ISOJAX_NUM_PROCESSES=N, ISOJAX_PROCESS_ID=i
      explicit coordinates (the generated SLURM script: the first node of the
      allocation, $SLURM_NTASKS, $SLURM_PROCID)
  ISOJAX_DISTRIBUTED=auto
      `jax.distributed.initialize()` with no arguments, which detects the cluster
      itself (Cloud TPU VMs; also SLURM and Open MPI environments)
  none of them
      a single process; nothing is initialised

`initialize_kwargs` is the pure part (an env mapping in, the keyword arguments of
`jax.distributed.initialize` or None out), so it is tested without any process.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

COORDINATOR = "ISOJAX_COORDINATOR"
NUM_PROCESSES = "ISOJAX_NUM_PROCESSES"
PROCESS_ID = "ISOJAX_PROCESS_ID"
MODE = "ISOJAX_DISTRIBUTED"
_EXPLICIT = (COORDINATOR, NUM_PROCESSES, PROCESS_ID)
_OFF = ("", "0", "off", "false", "none")


def _int(env: Mapping[str, str], name: str) -> int:
  try:
    return int(env[name])
  except ValueError:
    raise ValueError(f"{name}={env[name]!r}: expected an integer") from None


def initialize_kwargs(env: Mapping[str, str]) -> dict[str, Any] | None:
  """Keyword arguments for `jax.distributed.initialize`, or None for one process."""
  mode = env.get(MODE, "").strip().lower()
  if mode not in _OFF + ("auto",):
    raise ValueError(f"{MODE}={env[MODE]!r}: expected 'auto' or unset")
  given = [name for name in _EXPLICIT if env.get(name, "") != ""]
  if given and mode == "auto":
    raise ValueError(f"{MODE}=auto and {', '.join(given)} are both set: use either "
                     "explicit coordinates or auto-detection")
  if mode == "auto":
    return {}
  if not given:
    return None
  missing = [name for name in _EXPLICIT if name not in given]
  if missing:
    raise ValueError(f"{', '.join(given)} set but {', '.join(missing)} missing: explicit "
                     f"jax.distributed coordinates need all of {', '.join(_EXPLICIT)}")
  address = env[COORDINATOR]
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise ValueError(f"{COORDINATOR}={address!r}: expected host:port")
  num_processes, process_id = _int(env, NUM_PROCESSES), _int(env, PROCESS_ID)
  if num_processes < 1:
    raise ValueError(f"{NUM_PROCESSES}={num_processes}: expected >= 1")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"{PROCESS_ID}={process_id}: expected in [0, {num_processes})")
  return dict(coordinator_address=address, num_processes=num_processes,
              process_id=process_id)


def initialize(env: Mapping[str, str] | None = None) -> bool:
  """Initialises `jax.distributed` when the environment asks; True if it did."""
  kwargs = initialize_kwargs(os.environ if env is None else env)
  if kwargs is None:
    return False
  import jax  # pylint: disable=g-import-not-at-top
  try:  # CPU processes need a collectives backend (older JAX defaults to none)
    if jax.config.jax_cpu_collectives_implementation in (None, "none"):
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
  except AttributeError:
    pass
  jax.distributed.initialize(**kwargs)
  return True
