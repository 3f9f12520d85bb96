"""What this host can run: CPU features (CPU and OS), topology, and the KT_MAX_ISA cap.

`host()` returns one immutable description, detected once per process by kt-core's native
module (compiled for the baseline ISA, so detection itself never faults).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from . import _native
from .errors import BackendSelectionError

# Feature sets of the ISA levels KT_MAX_ISA accepts, each a superset of the one before
# (oneDNN-style). Features outside every level (sse4_2, popcnt, ...) are never capped.
_X86_LEVELS: dict[str, frozenset[str]] = {}
_x86_v2 = frozenset({"sse4_2", "popcnt"})
_x86_v3 = _x86_v2 | {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe"}
_x86_v4 = _x86_v3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
_x86_v4_vnni = _x86_v4 | {"avx512_vnni", "avx512_bf16", "avx512_vbmi"}
_x86_amx = _x86_v4_vnni | {"avx_vnni", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"}
_X86_LEVELS = {
    "x86-64": frozenset(),
    "x86-64-v2": _x86_v2,
    "x86-64-v3": _x86_v3,
    "x86-64-v4": _x86_v4,
    "x86-64-v4-vnni-bf16": _x86_v4_vnni,
    "x86-64-amx": _x86_amx,
}
_ARM_LEVELS = {
    "armv8-a": frozenset({"neon"}),
    "armv8.2-a+dotprod": frozenset({"neon", "asimddp"}),
    "armv8.6-a+i8mm": frozenset({"neon", "asimddp", "i8mm", "bf16"}),
    "armv8.6-a+i8mm+sve": frozenset({"neon", "asimddp", "i8mm", "bf16", "sve"}),
    "armv9-a+sve": frozenset({"neon", "asimddp", "i8mm", "bf16", "sve", "sve2"}),
}


def isa_levels(arch: str) -> dict[str, frozenset[str]]:
    """The ISA levels of an architecture, lowest first."""
    return _ARM_LEVELS if arch == "aarch64" else _X86_LEVELS


def _highest_level(arch: str, features: frozenset[str]) -> str:
    best = next(iter(isa_levels(arch)))
    for name, required in isa_levels(arch).items():
        if required <= features:
            best = name
    return best


@dataclass(frozen=True)
class NumaNode:
    id: int
    memory_bytes: int
    cores: tuple[int, ...]


@dataclass(frozen=True)
class Host:
    """An immutable description of this machine as kt sees it."""

    arch: str
    vendor: str
    brand: str
    features: frozenset[str]           # usable, after the KT_MAX_ISA cap
    detected_features: frozenset[str]  # usable by CPU and OS, before the cap
    isa_level: str                     # highest level `features` satisfies
    max_isa: str | None                # the cap in force, if any
    notes: tuple[str, ...]             # CPU features the OS (or the cap) withholds, and why
    sve_vector_bits: int               # aarch64 SVE vector length (0: no SVE)
    physical_cores: int
    logical_cpus: int
    numa_nodes: tuple[NumaNode, ...]
    l2_bytes: int
    l3_bytes: int
    memory_bytes: int
    topology_source: str

    def has(self, *features: str) -> bool:
        return all(f in self.features for f in features)

    def missing(self, features) -> list[str]:
        return sorted(f for f in features if f not in self.features)


def _cap(arch: str, detected: frozenset[str], max_isa: str | None) -> tuple[frozenset[str], list[str]]:
    if not max_isa:
        return detected, []
    levels = isa_levels(arch)
    if max_isa not in levels:
        raise BackendSelectionError(
            f"KT_MAX_ISA={max_isa!r} is not an ISA level of {arch}; expected one of: {', '.join(levels)}"
        )
    levelled = frozenset().union(*levels.values())
    allowed = levels[max_isa]
    removed = sorted(f for f in detected if f in levelled and f not in allowed)
    notes = [f"{f}: withheld by KT_MAX_ISA={max_isa}" for f in removed]
    return frozenset(f for f in detected if f not in removed), notes


@functools.cache
def host() -> Host:
    """Detect this host once; KT_MAX_ISA is read at the first call and fixed from then on."""
    cpu = _native.cpu_features()
    topo = _native.topology()
    detected = frozenset(cpu["features"])
    max_isa = os.environ.get("KT_MAX_ISA", "").strip().lower() or None
    features, cap_notes = _cap(cpu["arch"], detected, max_isa)
    _native.set_host_features(sorted(features))
    return Host(
        arch=cpu["arch"],
        vendor=cpu["vendor"],
        brand=cpu["brand"],
        features=features,
        detected_features=detected,
        isa_level=_highest_level(cpu["arch"], features),
        max_isa=max_isa,
        notes=tuple(cpu["notes"]) + tuple(cap_notes),
        sve_vector_bits=cpu["sve_vector_bits"] if "sve" in features else 0,
        physical_cores=len(topo["cores"]),
        logical_cpus=topo["num_cpus"],
        numa_nodes=tuple(NumaNode(n["id"], n["memory_bytes"], tuple(n["cores"])) for n in topo["nodes"]),
        l2_bytes=topo["l2_bytes"],
        l3_bytes=topo["l3_bytes"],
        memory_bytes=topo["total_memory_bytes"],
        topology_source=topo["source"],
    )
