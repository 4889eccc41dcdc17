"""Field checks shared by the subsystems' typed settings (JAX-free).

Each subsystem owns a frozen dataclass of its `config.<section>` fields that validates
itself in `__post_init__`; these helpers keep the error messages uniform: they name the
dotted field, the value given and what was expected.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def is_int(value: Any) -> bool:
  """An int that is not a bool (config files often hold True where 1 was meant)."""
  return isinstance(value, int) and not isinstance(value, bool)


def positive_int(field: str, value: Any) -> int:
  if not is_int(value) or value <= 0:
    raise ValueError(f"config field {field}={value!r}: expected a positive integer")
  return value


def non_negative_int(field: str, value: Any, meaning: str) -> int:
  if not is_int(value) or value < 0:
    raise ValueError(f"{field}={value!r}: expected an integer >= 0 ({meaning})")
  return value


def boolean(field: str, value: Any) -> bool:
  if not isinstance(value, bool):
    raise ValueError(f"{field}={value!r}: expected True or False")
  return value


def choice(field: str, value: Any, choices) -> Any:
  if value not in choices:
    raise ValueError(f"{field}={value!r}: expected one of {sorted(choices)}")
  return value


def field(default: Any, doc: str, *, kind: type | None = None, shown: str = "") -> Any:
  """A settings field: its default and its meaning, the one place both are written.

  `doc` is the meaning as `docs/configs.md`'s field reference shows it (Markdown; that
  table is generated from these). `kind` types a field whose default is None (the
  command line parses an override of it by that type); `shown` replaces the default in the
  table where the value itself is too long to read there.
  """
  metadata = {"doc": doc, "kind": kind, "shown": shown}
  if isinstance(default, (dict, list)):
    return dataclasses.field(default_factory=lambda: copy.deepcopy(default),
                             metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


class Section:
  """Base of the settings dataclasses: one built from the same-named keys of its config
  section (`from_config`), checking itself in `__post_init__`. Every field has its
  default and meaning (`field`), so `cls()` is the section's defaults."""

  @classmethod
  def from_config(cls: type[T], section: Mapping[str, Any]) -> T:
    return from_mapping(cls, section)

  def as_kwargs(self) -> dict[str, Any]:
    """The fields by name, nested sections kept whole (for `f(**section.as_kwargs())`)."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def from_mapping(cls: type[T], section: Mapping[str, Any]) -> T:
  """`cls` (a dataclass) from the same-named keys of a config section."""
  return cls(**{f.name: section[f.name] for f in dataclasses.fields(cls)})
