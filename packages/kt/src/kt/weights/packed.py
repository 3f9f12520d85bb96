"""Packed copies of a converted folder's layers, in one backend layout: loading without packing.

A converted folder holds codes that any backend packs into its own layout at load
(converted.py). `kt convert --packed` (or `add_packed(folder)`, packing.py) also stores every
layer as the kernels this host selects pack it:

    layer-0003.kt-int4-p16-v2.packed   logical expert e's packed bytes at e * expert_stride
                                       (expert_bytes, zero-padded to a 4 KiB multiple)

listed in the manifest under `packed[layout_id] = {expert_bytes, expert_stride, layers: {L:
{file, bytes}}}`. A layer whose kernels read that layout id with that expert size then loads
without packing, one of two ways (KT_MAP_WEIGHTS):
  - mapped (default when the pool spans one NUMA node; KT_MAP_WEIGHTS=1 always): the file is
    mapped read-only and the experts are its page-cache pages — no copy, no new memory to
    zero, shared by every process serving the same folder. Like any memory-mapped weights,
    pages the kernel reclaims under memory pressure are read back from disk when next used;
  - copied (several NUMA nodes; KT_MAP_WEIGHTS=0 always): each expert is read (pread) by a
    thread of its NUMA node straight into memory on that node.
Every other host falls back to the codes, so the folder stays portable; the packed files cost
the codes' size again on disk.

The layout id is versioned by its backend (a changed layout gets a new id), so stale packed
bytes are never read by kernels that expect another layout. Nothing in a packed file depends
on the thread count or the NUMA layout of the host that wrote it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kt_core.errors import KTError

from .converted import ConvertedFolder

# Layout ids become file names: backends name them like "kt-int4-p16-v2".
_LAYOUT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def packed_file(layer: int, layout_id: str) -> str:
    if not _LAYOUT_NAME.fullmatch(layout_id):
        raise KTError(f"layout id {layout_id!r} cannot name a file (letters, digits, '.', '_', '-' only)")
    return f"layer-{layer:04d}.{layout_id}.packed"


PAGE = 4096


def expert_stride(expert_bytes: int) -> int:
    """Where expert e+1 starts after expert e: page aligned, so a mapped expert starts on a page
    (the kernels need 64-byte alignment; a page keeps each expert's pages its own)."""
    return -(-expert_bytes // PAGE) * PAGE


def packed_layer(folder: ConvertedFolder, layout_id: str, expert_bytes: int, layer: int) -> Path | None:
    """The packed file of `layer` in `layout_id` when the folder has it and its experts are
    `expert_bytes` long (the size a MoE of this geometry and method packs), else None."""
    entry = folder.manifest.get("packed", {}).get(layout_id)
    if entry is None or entry["expert_bytes"] != expert_bytes or entry["expert_stride"] != expert_stride(expert_bytes):
        return None
    file = entry["layers"].get(str(layer))
    if file is None:
        return None
    path = folder.path / file["file"]
    want = folder.geometry["num_experts"] * entry["expert_stride"]
    if file["bytes"] != want or not path.is_file() or path.stat().st_size != want:
        size = path.stat().st_size if path.is_file() else "missing"
        raise KTError(f"{path} should hold {want} bytes ({folder.geometry['num_experts']} experts x "
                      f"{entry['expert_stride']}), found {size}: the converted folder is damaged; delete the file and "
                      "its manifest entry, or run `kt convert --resume --packed` again")
    return path


def map_weights() -> bool:
    """Whether packed layers are mapped (KT_MAP_WEIGHTS=1/0; by default when the pool's threads
    all sit on one NUMA node, where a copy would gain no placement)."""
    from kt_core import pool

    setting = os.environ.get("KT_MAP_WEIGHTS", "auto").strip().lower()
    if setting in ("1", "true", "yes"):
        return True
    if setting in ("0", "false", "no"):
        return False
    if setting != "auto":
        raise KTError(f"KT_MAP_WEIGHTS must be 1, 0 or auto; found {setting!r}")
    return len({node for node, _ in pool.info().groups}) == 1


def load_packed_layer(moe, path: Path, physical_to_logical: list[int]) -> str:
    """Serve every CPU slot's expert from a packed layer file (see packed_layer): returns
    "mapped" or "copied" (see the module's docstring)."""
    stride = expert_stride(moe.expert_bytes)
    offsets = {p: physical_to_logical[p] * stride for p in moe.cpu_slots()}
    fd = os.open(path, os.O_RDONLY)
    try:
        if map_weights():
            moe.map_packed(offsets, fd)
            return "mapped"
        # A cold file: the disk streams the whole layer while the pool threads copy what arrived.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        moe.load_packed(offsets, fd)
        return "copied"
    finally:
        os.close(fd)
