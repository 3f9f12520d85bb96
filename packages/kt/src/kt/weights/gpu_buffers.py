"""One expert's weights written into SGLang's GPU tensor-parallel layout, for layerwise prefill
(kt-kernel's submit_/sync_write_weight_scale_to_buffer, which KTMoEWrapper forwards here through
the weight source): SGLang copies them to the GPU and runs the whole layer there.

Per rank r of tp, with I_r = I / tp (the rows r * I_r .. (r + 1) * I_r of gate and up, the same
columns of down), in the checkpoint's own format:
  BF16            w13 [2 I_r, H] bf16 (gate rows, then up rows)   w2 [H, I_r] bf16
  FP8 (128x128)   w13 [2 I_r, H] E4M3, scale_inv [2 I_r/128, H/128] f32
                  w2 [H, I_r] E4M3, scale_inv [H/128, I_r/128] f32
  RAWINT4         w13 [2 I_r, H/8] int32, scales [2 I_r, H/g] bf16
                  w2 [H, I_r/8] int32, scales [H, I_r/g] bf16
The destinations are host addresses (SGLang's pinned staging), each big enough for its part.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from kt_core.errors import KTError, WeightsError

from .checkpoint import Checkpoint, _torch
from .converted import MANIFEST, ConvertedFolder
from .experts import checkpoint_experts

METHODS = ("BF16", "FP8", "RAWINT4")   # the checkpoint formats kt reads as stored


def _checkpoint(path) -> Checkpoint:
    path = Path(path)
    if (path / MANIFEST).is_file():
        folder = ConvertedFolder.open(path)
        if not folder.as_stored:
            raise KTError(f"{path} holds kt convert's {folder.method} codes, not the checkpoint's tensors; "
                          "layerwise prefill writes experts as the checkpoint stores them (BF16, FP8, RAWINT4)")
        return folder.source_checkpoint("the experts as stored, for the GPU")
    return Checkpoint(path)


def _raw(t) -> np.ndarray:
    """A tensor's bytes as a NumPy array of the same shape (bf16 and E4M3 as 2- and 1-byte ints)."""
    torch = _torch()
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    elif t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    return t.numpy()


def _write(address: int, parts: list[np.ndarray]) -> None:
    """The parts' bytes, one after another, at host address `address`."""
    at = int(address)
    if at == 0:
        raise ValueError("a destination address is 0 (null)")
    for part in parts:
        data = np.ascontiguousarray(part)
        ctypes.memmove(at, data.ctypes.data, data.nbytes)
        at += data.nbytes


def _rows(m: np.ndarray, r: int, tp: int) -> np.ndarray:
    n = m.shape[0] // tp
    return m[r * n:(r + 1) * n]


def write_expert(path, layer: int, expert: int, method: str, intermediate: int, tp: int, w13_weight, w13_scale,
                 w2_weight, w2_scale) -> None:
    """Write logical expert `expert` of model layer `layer` into each rank's buffers."""
    if method not in METHODS:
        raise KTError(f"layerwise prefill writes experts as the checkpoint stores them ({', '.join(METHODS)}); "
                      f"method {method} keeps only its own packed layout (kt-kernel refuses AMXINT4/AMXINT8 too)")
    for name, ptrs in (("w13_weight_ptrs", w13_weight), ("w13_scale_ptrs", w13_scale), ("w2_weight_ptrs", w2_weight),
                       ("w2_scale_ptrs", w2_scale)):
        if len(ptrs) != tp:
            raise ValueError(f"{name} lists {len(ptrs)} addresses; gpu_tp_count is {tp}, one per rank")
    gate, up, down, scales, _ = checkpoint_experts(_checkpoint(path), layer, expert)
    gate, up, down = _raw(gate), _raw(up), _raw(down)
    if intermediate % tp:
        raise WeightsError(f"intermediate size {intermediate} does not split over gpu_tp_count={tp} ranks")
    share = intermediate // tp
    # Column slices of down (and of its scales) for rank r, in the stored units per column.
    k_unit = {"RAWINT4": 8}.get(method, 1)
    if method == "FP8" and share % 128:
        raise WeightsError(f"FP8's 128x128 blocks cannot split intermediate {intermediate} over {tp} ranks "
                           f"({share} per rank is not a multiple of 128)")
    for r in range(tp):
        cols = slice(r * share // k_unit, (r + 1) * share // k_unit)
        _write(w13_weight[r], [_rows(gate, r, tp), _rows(up, r, tp)])
        _write(w2_weight[r], [down[:, cols]])
        if scales is None:
            continue      # BF16: no scales; SGLang passes 0 for them
        gs, us, ds = (_raw(s) if s.dtype != _torch().float32 else s.numpy() for s in scales)
        if method == "FP8":
            _write(w13_scale[r], [_rows(gs, r, tp), _rows(us, r, tp)])
            _write(w2_scale[r], [ds[:, r * share // 128:(r + 1) * share // 128]])
        else:   # RAWINT4: scales per group of g along K
            g = intermediate // ds.shape[1]
            if share % g:
                raise WeightsError(f"RAWINT4's groups of {g} cannot split intermediate {intermediate} over {tp} ranks")
            _write(w13_scale[r], [_rows(gs, r, tp), _rows(us, r, tp)])
            _write(w2_scale[r], [ds[:, r * share // g:(r + 1) * share // g]])
