"""Packed copies of a converted folder's layers, in one backend layout: loading without packing.

A converted folder holds codes that any backend packs into its own layout at load
(converted.py). `kt convert --packed` (or `add_packed(folder)`) also stores every layer as the
kernels this host selects pack it:

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
from collections.abc import Callable
from pathlib import Path

from kt_core.errors import KTError

from .converted import ConvertedFolder, whole_files, write_atomically, write_manifest

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


def add_packed(folder: str | Path, *, backend: str | None = None, progress: bool = False,
               log: Callable[[str], None] = lambda _: None) -> str:
    """Store every layer of a complete converted folder in the packed layout of the kernels
    this host selects (or `backend`'s). Returns the layout id. Layers already packed in that
    layout are kept, so an interrupted run continues where it stopped. Peak RAM: one packed
    layer."""
    from kt_core.moe import MoE

    from .conversion import _progress

    conv = ConvertedFolder.open(folder)
    g = conv.geometry
    moe = MoE(num_experts=g["num_experts"], top_k=min(int(g.get("top_k") or 1), g["num_experts"]),
              hidden_size=g["hidden"], intermediate_size=g["intermediate"], method=conv.method,
              group_size=conv.group_size, zero_point=conv.zero_point, backend=backend)
    layout, expert_bytes = moe.layout_id, moe.expert_bytes
    stride = expert_stride(expert_bytes)
    entry = conv.manifest.setdefault("packed", {}).get(layout)
    if entry is None or (entry["expert_bytes"], entry["expert_stride"]) != (expert_bytes, stride):
        entry = conv.manifest["packed"][layout] = {"expert_bytes": expert_bytes, "expert_stride": stride, "layers": {}}
    want = g["num_experts"] * stride
    done = whole_files(conv.path, {k: v for k, v in entry["layers"].items() if v["bytes"] == want})
    todo = [L for L in g["moe_layers"] if str(L) not in done]
    log(f"packing {len(todo)} of {len(g['moe_layers'])} layers in {layout} ({moe.backend} kernels); peak RAM about "
        f"{want / 2**30:.2f} GiB (one packed layer)")
    bar = _progress("packing", len(g["moe_layers"]), len(g["moe_layers"]) - len(todo)) if progress and todo else None
    try:
        for layer in todo:
            name = packed_file(layer, layout)
            _pack_layer(conv, moe, layer, name, bytes(stride - expert_bytes))
            entry["layers"][str(layer)] = {"file": name, "bytes": want}
            try:
                write_manifest(conv.path, conv.manifest)
            except OSError as exc:
                raise KTError(f"writing {conv.path} manifest failed: {exc.strerror or exc}; the layers packed so far "
                              "are kept: fix that and run the same command again") from exc
            if bar:
                bar[0].advance(bar[1])
    finally:
        if bar:
            bar[0].stop()
    return layout


def _pack_layer(conv: ConvertedFolder, moe, layer: int, name: str, padding: bytes) -> None:
    """Pack `layer` (from the folder's codes, or its source model for packed copies of a
    checkpoint's own format) and write every logical expert's bytes to `name`, atomically."""
    from .loader import load_layer

    entry = conv.manifest["packed"][moe.layout_id]
    entry["layers"].pop(str(layer), None)      # this layer has no packed file yet: load_layer packs it
    load_layer(moe, conv, layer)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            for e in range(conv.geometry["num_experts"]):
                f.write(moe.packed_expert(e))
                f.write(padding)

    try:
        write_atomically(conv.path / name, write)
    except OSError as exc:
        raise KTError(f"writing {conv.path / name} failed: {exc.strerror or exc}; the layers packed so far are kept: "
                      "fix that and run the same command again") from exc
