"""Backend descriptors: pure-Python data a backend's entry point names.

Loading a descriptor must never import native code: selection decides from the data alone
whether a variant can run here, and only the winner's native module is ever imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum


class Tier(IntEnum):
    """What kind of implementation a backend is; a higher tier wins when both can run."""

    REFERENCE = 1       # portable C++, the correctness oracle
    GENERIC_SIMD = 2    # hand-written SIMD kernels (AVX2/AVX-512, NEON)
    VENDOR_LIBRARY = 3  # built on a tuned vendor library (BLIS, KML)
    MATRIX_ENGINE = 4   # matrix units (AMX)


@dataclass(frozen=True)
class Variant:
    """One build of a backend's kernels for one CPU target."""

    name: str                    # "x86-64-v4", "baseline"
    module: str                  # dotted name of the native module with backend_api(variant)
    requires: frozenset[str] = frozenset()   # host features it executes
    methods: tuple[str, ...] = ()            # methods (weight formats) it provides
    rank: int = 0                # order among this backend's variants; higher is better
    ggml_types: tuple[str, ...] = ()         # ggml block types its LLAMAFILE kernels read ("Q4_K", ...)

    def __post_init__(self):
        # A bare string would become a set of its letters ("sse2" -> {"s", "e", "2"}).
        for field_name in ("requires", "methods", "ggml_types"):
            if isinstance(getattr(self, field_name), str | bytes):
                raise TypeError(f"Variant {self.name!r}: {field_name} must be a collection of names, not the "
                                f"string {getattr(self, field_name)!r}")
        object.__setattr__(self, "requires", frozenset(self.requires))
        object.__setattr__(self, "methods", tuple(m.upper() for m in self.methods))
        object.__setattr__(self, "ggml_types", tuple(t.upper() for t in self.ggml_types))


@dataclass(frozen=True)
class BackendDescriptor:
    """What the `kt.backends` entry point of a backend package points at."""

    name: str
    abi_version: tuple[int, int]
    tier: Tier
    variants: tuple[Variant, ...]
    device: str = "cpu"
    arch: tuple[str, ...] = ("x86_64", "aarch64")
    description: str = ""
    # Conditions beyond CPU features (a library, a GPU): returns None when usable, else
    # the reason it is not. Must be cheap and must not import the native module.
    probe: Callable[[], str | None] | None = field(default=None, compare=False)

    def __post_init__(self):
        for field_name in ("variants", "arch"):
            if isinstance(getattr(self, field_name), str | bytes):
                raise TypeError(f"backend {self.name!r}: {field_name} must be a collection, not the string "
                                f"{getattr(self, field_name)!r}")
        object.__setattr__(self, "variants", tuple(self.variants))
        object.__setattr__(self, "arch", tuple(self.arch))

    def problems(self) -> str | None:
        """Why selection cannot use this descriptor (a field of the wrong type), or None.
        Discovery checks it: a plugin's data must not be able to break selection (fuzzing
        found ranks and tiers of other types raising TypeError inside sorting)."""
        def is_int(x):
            return isinstance(x, int) and not isinstance(x, bool)

        def names(xs):
            return all(isinstance(x, str) and x for x in xs)

        if not isinstance(self.name, str) or not self.name:
            return f"name should be a non-empty string, found {self.name!r}"
        if not (isinstance(self.abi_version, tuple) and len(self.abi_version) == 2 and all(map(is_int, self.abi_version))):
            return f"abi_version should be a (major, minor) tuple of integers, found {self.abi_version!r}"
        if not isinstance(self.tier, Tier):
            return f"tier should be a kt_core.backends.Tier, found {self.tier!r}"
        if not names(self.arch):
            return f"arch should list architecture names, found {self.arch!r}"
        if self.probe is not None and not callable(self.probe):
            return f"probe should be None or a callable, found {self.probe!r}"
        for v in self.variants:
            if not isinstance(v, Variant):
                return f"variants should hold kt_core.backends.Variant objects, found {v!r}"
            if not (isinstance(v.name, str) and v.name and isinstance(v.module, str) and v.module):
                return f"variant {v.name!r}: name and module should be non-empty strings (module {v.module!r})"
            if not (names(v.requires) and names(v.methods) and names(v.ggml_types) and is_int(v.rank)):
                return (f"variant {v.name!r}: requires, methods and ggml_types should list names and rank be an "
                        f"integer (rank {v.rank!r})")
        return None
