"""Writing packed copies of a converted folder's layers (`kt convert --packed`); their file
format and how they load are in packed.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kt_core.errors import KTError
from kt_core.moe import MoE

from .converted import ConvertedFolder, whole_files, write_atomically, write_manifest
from .loader import load_layer
from .packed import expert_stride, packed_file
from .progress import layer_progress


def add_packed(folder: str | Path, *, backend: str | None = None, progress: bool = False,
               log: Callable[[str], None] = lambda _: None) -> str:
    """Store every layer of a complete converted folder in the packed layout of the kernels
    this host selects (or `backend`'s). Returns the layout id. Layers already packed in that
    layout are kept, so an interrupted run continues where it stopped. Peak RAM: one packed
    layer."""
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
    bar = layer_progress("packing", len(g["moe_layers"]), len(g["moe_layers"]) - len(todo)) if progress and todo else None
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
