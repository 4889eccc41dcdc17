"""How many memory mappings a test worker holds, and when the suite clears JAX's
caches to stay below the kernel's limit (`conftest.py` says why)."""

_MAPS = "/proc/self/maps"
# Well below vm.max_map_count's default of 65,530: a test compiles at most a few
# thousand programs, so it cannot cross the limit from here.
MAPPINGS_BEFORE_CLEARING = 30_000


def process_mappings(path: str = _MAPS) -> int:
  """The number of memory mappings this process holds (0 where /proc is missing)."""
  try:
    with open(path, "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return 0
