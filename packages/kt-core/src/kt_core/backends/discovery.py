"""Find backends through the `kt.backends` entry-point group, lazily and fault-isolated.

Nothing happens at `import kt_core`; the first selection reads the entry points once. A
descriptor that fails to import, or is not a BackendDescriptor, is recorded with its
reason and skipped: one broken plugin never hides the others.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass

from .descriptor import BackendDescriptor

ENTRY_POINT_GROUP = "kt.backends"


@dataclass(frozen=True)
class Discovered:
    entry_point: str                       # "name = module:attr (distribution)"
    descriptor: BackendDescriptor | None   # None when broken
    error: str | None                      # why it is broken


def _describe(ep) -> str:
    dist = getattr(getattr(ep, "dist", None), "name", None)
    return f"{ep.name} = {ep.value}" + (f" ({dist})" if dist else "")


def _load(ep) -> Discovered:
    where = _describe(ep)
    try:
        obj = ep.load()
    except Exception as exc:  # a plugin's import error must not break discovery
        return Discovered(where, None, f"importing the descriptor raised {type(exc).__name__}: {exc}")
    if callable(obj) and not isinstance(obj, BackendDescriptor):
        try:
            obj = obj()
        except Exception as exc:
            return Discovered(where, None, f"calling the descriptor factory raised {type(exc).__name__}: {exc}")
    if not isinstance(obj, BackendDescriptor):
        return Discovered(where, None, f"expected a kt_core.backends.BackendDescriptor, found {type(obj).__name__}")
    problem = obj.problems()
    if problem:
        return Discovered(where, None, f"invalid descriptor: {problem}")
    if obj.name != ep.name:
        return Discovered(where, None, f"entry point is named {ep.name!r} but the descriptor says {obj.name!r}")
    return Discovered(where, obj, None)


@functools.cache
def discover() -> tuple[Discovered, ...]:
    """Every backend registered in this environment, sorted by name (cached per process)."""
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    found: dict[str, Discovered] = {}
    clashes: list[Discovered] = []
    for ep in eps:
        if ep.name in found:  # two distributions registering one name: the first one wins
            clashes.append(Discovered(_describe(ep), None, f"backend name {ep.name!r} is already registered by "
                                      f"{found[ep.name].entry_point}; this one is ignored"))
            continue
        found[ep.name] = _load(ep)
    return tuple(found[name] for name in sorted(found)) + tuple(clashes)
