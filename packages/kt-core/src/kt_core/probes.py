"""What this host can do, measured: read bandwidth and the multiply-add peak of the arithmetic
kt's kernels use. The roofline of `kt bench`, and a public helper for other benchmarks."""

from __future__ import annotations

from . import _native, pool


def read_bandwidth(mib: int, repeats: int = 5) -> list[float]:
    """GB/s of each repeat: the pool's threads summing an interleaved buffer of `mib` MiB."""
    pool.ensure()
    return list(_native.bench_read_bandwidth(mib * 2**20, repeats))


def read_bandwidth_per_group(mib_per_group: int, repeats: int = 5) -> list[list[float]]:
    """[repeat][group] GB/s, every NUMA group reading a buffer on its own node at once."""
    pool.ensure()
    return [list(r) for r in _native.bench_read_bandwidth_per_group(mib_per_group * 2**20, repeats)]


def compute_peak_kinds() -> list[str]:
    """The kinds this host measures: "f32_fma" (AVX2/AVX-512 FMA), "bf16_dot" (AVX512_BF16),
    "int8_dot" (AVX512_VNNI, or AVX2's two-instruction int8 dot)."""
    pool.ensure()   # host detection (and KT_MAX_ISA) first
    return list(_native.compute_peak_kinds())


def compute_peak(kind: str, seconds: float = 0.2) -> float:
    """GMAC/s of `kind` on all of the pool's threads: independent register-only instruction
    streams, the best of three rounds of about `seconds` each."""
    pool.ensure()
    return _native.compute_peak_macs(kind, seconds) / 1e9
