"""`kt doctor`: the host as kt sees it, and recommended settings with their reasons."""

from __future__ import annotations

from pathlib import Path

from .. import pool
from ..backends import explain
from ..device_bridge import report as bridge_report
from ..errors import KTError
from ..host import host


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _meminfo() -> dict[str, int]:
    out = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def _thp_mode(path: str) -> str | None:
    text = _read(path)
    if text and "[" in text:
        return text.split("[", 1)[1].split("]", 1)[0]
    return text


def recommended(h=None) -> dict:
    """cpuinfer_threads and threadpool_count for this host, with the reasons (`kt doctor`
    prints them; `kt run` uses them as its defaults)."""
    h = h or host()
    pools = max(1, len(h.numa_nodes))
    return {
        "cpuinfer_threads": h.physical_cores,
        "cpuinfer_threads_reason": (
            f"{h.physical_cores} physical cores ({h.logical_cpus} logical CPUs): one thread per physical core; "
            "SMT siblings share a core's vector units, and the calling thread works too, so no core is "
            "left for a dispatcher"),
        "threadpool_count": pools,
        "threadpool_count_reason": (
            f"{pools} NUMA node(s) with cores: one thread group per node, so each streams the experts "
            "placed in its own memory"),
    }


def collect() -> dict:
    h = host()
    mem = _meminfo()
    info = pool.info()
    try:
        backends = explain()
        backend_error = None
    except KTError as exc:
        backends, backend_error = [], str(exc)
    return {
        "cpu": {"arch": h.arch, "vendor": h.vendor, "brand": h.brand, "isa_level": h.isa_level,
                "max_isa": h.max_isa, "features": sorted(h.features), "notes": list(h.notes),
                "sve_vector_bits": h.sve_vector_bits},
        "cores": {"physical": h.physical_cores, "logical": h.logical_cpus, "topology_source": h.topology_source,
                  "l2_bytes": h.l2_bytes, "l3_bytes": h.l3_bytes},
        "numa": [{"node": n.id, "memory_bytes": n.memory_bytes, "cores": list(n.cores)} for n in h.numa_nodes],
        "memory": {"total_bytes": mem.get("MemTotal", h.memory_bytes), "available_bytes": mem.get("MemAvailable"),
                   "hugepages_total": mem.get("HugePages_Total"), "hugepage_bytes": mem.get("Hugepagesize"),
                   "transparent_hugepages": _thp_mode("/sys/kernel/mm/transparent_hugepage/enabled")},
        "pool": {"threads": info.num_threads, "groups": [list(g) for g in info.groups],
                 "pinned_cpus": list(info.pinned_cpus)},
        "backends": backends,
        "backend_error": backend_error,
        "device_bridges": [{"kind": k, "entry_point": ep, "usable": ok, "why": why} for k, ep, ok, why in bridge_report()],
        "recommended": recommended(h),
    }
