"""The process-wide thread pool: one per process, shared by every layer and backend."""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import _native
from .errors import SettingError
from .host import host


@dataclass(frozen=True)
class PoolInfo:
    num_threads: int
    groups: tuple[tuple[int, int], ...]   # (numa_node, threads) per group
    pinned_cpus: tuple[int, ...]
    virtual_numa: int


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingError(f"{name} must be an integer, got {raw!r}") from None


# Bounds the native pool takes (C ints); past them a setting is a typo, not a choice.
MAX_THREADS = 4096
MAX_SPIN_US = 10_000_000   # 10 s


def _check_range(name: str, value: int, most: int, meaning: str) -> None:
    if not 0 <= value <= most:
        raise SettingError(f"{name} must be in [0, {most}] ({meaning}), got {value}")


def configure(num_threads: int = 0, virtual_numa: int | None = None, pin: bool = True,
              spin_us: int | None = None) -> None:
    """(Re)create the pool. num_threads 0 = one per physical core; virtual_numa splits the
    cores into that many groups (KT_VIRTUAL_NUMA is the default) to exercise multi-node
    placement on a single-node machine. spin_us: how long an idle worker spins before it parks
    (KT_SPIN_US, default 100). Between layers longer than that, the next forward pays the
    workers' wake-up: where kt's cores do nothing else between MoE layers (attention on a GPU),
    a few milliseconds keep them awake (docs/serving.md)."""
    if virtual_numa is None:
        virtual_numa = _env_int("KT_VIRTUAL_NUMA", 0)
    if spin_us is None:
        spin_us = _env_int("KT_SPIN_US", 100)
    _check_range("num_threads (cpuinfer_threads)", num_threads, MAX_THREADS, "0 = one per physical core")
    _check_range("virtual_numa (KT_VIRTUAL_NUMA)", virtual_numa, MAX_THREADS, "0 = the real NUMA nodes")
    _check_range("spin_us (KT_SPIN_US)", spin_us, MAX_SPIN_US, "microseconds an idle worker spins")
    host()  # the features plugins see must be set before any plugin runs
    _native.configure_pool(num_threads, virtual_numa, pin, spin_us)
    _native.pool_info()  # start the workers now, so later ensure() calls see a configured pool


def ensure(num_threads: int = 0, virtual_numa: int | None = None) -> None:
    """Create the pool with these settings unless one exists (the first wrapper wins, as in kt-kernel)."""
    if not _native.pool_exists():
        configure(num_threads, virtual_numa)


def info() -> PoolInfo:
    ensure()
    raw = _native.pool_info()
    return PoolInfo(
        num_threads=raw["num_threads"],
        groups=tuple((g["numa_node"], g["threads"]) for g in raw["groups"]),
        pinned_cpus=tuple(raw["pinned_cpus"]),
        virtual_numa=raw["virtual_numa"],
    )


def numa_usage() -> list[dict]:
    """Live and peak bytes per NUMA node of everything kt allocated (weights, scratch)."""
    return list(_native.numa_usage())
