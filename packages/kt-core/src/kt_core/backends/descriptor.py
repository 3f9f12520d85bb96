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
        object.__setattr__(self, "variants", tuple(self.variants))
        object.__setattr__(self, "arch", tuple(self.arch))
