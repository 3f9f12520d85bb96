"""Folders in the form kt-kernel 0.7.2 writes its AMXINT8 / AMXINT4 experts (kt.weights.kt_kernel_folder
describes it), made from float weights for tests: the merged safetensors of `convert_cpu_weights.py`
(with a config.json) or the unmerged `_layer_L/_numa_N/*.kt` dumps.

    truth = write_kt_kernel_folder(tmp_path, gate, up, down, bits=4, slices=2)
    truth -> (gate, up, down) float64: the weights the stored codes stand for

Each NUMA slice's rows are quantized on their own, as kt-kernel does: INT8 s = max|w| / 127,
INT4 s = max|w| / 7 (stored as s / 16), codes rounded half away from zero.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kt_core.testing.quantize import round_half_away

from ..weights.kt_kernel_folder import tile_order


def _quantize(w: np.ndarray, bits: int):
    """(codes int8, stored scale f32, dequantized float64) of one slice [n, k], per row."""
    w = np.asarray(w, np.float32)
    top = 127 if bits == 8 else 7
    s = (np.max(np.abs(w), axis=1) / np.float32(top)).astype(np.float32)
    safe = np.where(s == 0, np.float32(1), s)
    q = np.clip(round_half_away(w / safe[:, None]), -top, top).astype(np.int8)
    stored = s if bits == 8 else (s / np.float32(16)).astype(np.float32)
    return q, stored, q.astype(np.float64) * s.astype(np.float64)[:, None]


def tile(q: np.ndarray, bits: int) -> np.ndarray:
    """Row-major codes [n, k] -> kt-kernel's tiled bytes (int8, 1-D)."""
    n, k = q.shape
    flat = q.reshape(-1)[tile_order(n, k, bits)]
    if bits == 8:
        return flat.astype(np.int8)
    nib = (flat.astype(np.int16) & 15).astype(np.uint8)
    return (nib[0::2] | (nib[1::2] << 4)).view(np.int8)


def write_kt_kernel_folder(folder, gate, up, down, *, bits: int, slices: int = 1, layer: int = 0,
                           merged: bool = True, model_type: str = "qwen3_moe", top_k: int = 2) -> tuple:
    """Write one MoE layer (gate/up [E, I, H], down [E, H, I] floats) as kt-kernel stores it."""
    import torch
    from safetensors.torch import save_file

    from .checkpoints import make_config

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    E, I, H = np.shape(gate)
    width = I // slices
    tensors, truth = {}, [np.zeros((E, I, H)), np.zeros((E, I, H)), np.zeros((E, H, I))]
    for e in range(E):
        for proj, stack, t in (("gate", gate, truth[0]), ("up", up, truth[1]), ("down", down, truth[2])):
            for j in range(slices):
                rows = slice(j * width, (j + 1) * width)
                part = stack[e][rows] if proj != "down" else stack[e][:, rows]
                q, s, deq = _quantize(part, bits)
                if proj != "down":
                    t[e][rows] = deq
                else:
                    t[e][:, rows] = deq
                tensors[(proj, e, j)] = (tile(q, bits), s)
    kind = "INT8" if bits == 8 else "INT4"
    if merged:
        out = {}
        for (proj, e, j), (w, s) in tensors.items():
            out[f"blk.{layer}.ffn_{proj}_exps.{e}.numa.{j}.weight"] = torch.from_numpy(np.ascontiguousarray(w))
            out[f"blk.{layer}.ffn_{proj}_exps.{e}.numa.{j}.scale"] = torch.from_numpy(np.ascontiguousarray(s))
        out["output_norm.weight"] = torch.ones(H, dtype=torch.bfloat16)   # non-expert tensors ride along
        save_file(out, str(folder / "model.safetensors"))
        cfg = make_config(model_type, hidden=H, intermediate=I, experts=E, top_k=top_k, layers=layer + 1, dense_prefix=0)
        (folder / "config.json").write_text(json.dumps(cfg))
    else:
        for (proj, e, j), (w, s) in tensors.items():
            d = folder / f"_layer_{layer}" / f"_numa_{j}"
            d.mkdir(parents=True, exist_ok=True)
            w.tofile(d / f"{kind}_{proj}_{e}_{w.nbytes}Byte_quant_.kt")
            s.tofile(d / f"{kind}_{proj}_{e}_{s.nbytes}Byte_scale_.kt")
    return tuple(truth)
