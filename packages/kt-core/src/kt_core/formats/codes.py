"""kt's stored integer codes (docs/formats.md, "kt converted folders").

INT8: codes int8 [N, K] in [-127, 127], scales f32 [N, 1].
INT4: codes uint8 [N, K/2] (element 2j in the low nibble of byte j; u = q + 8 when
symmetric), scales f32 [N, K/G], zeros uint8 [N, K/G] when asymmetric.
Quantized natively on the kt pool with exactly the rules the packers use at load, so a
converted folder holds the codes online quantization would produce.
"""

from __future__ import annotations

import numpy as np

from .. import _arrays, _native, pool

INT4_GROUPS = (32, 64, 128)


def int4_group_for(hidden: int, intermediate: int) -> int:
    """INT4's group when none is asked for: the largest of INT4_GROUPS dividing both K's (hidden,
    gate/up's; intermediate, down's), as kt-kernel takes GPT-OSS's 2880 or a 320/96 layer."""
    fits = [g for g in sorted(INT4_GROUPS, reverse=True) if hidden % g == 0 and intermediate % g == 0]
    if not fits:
        raise ValueError(f"INT4 needs a group size in {INT4_GROUPS} dividing hidden ({hidden}) and intermediate "
                         f"({intermediate}), and none does: use INT8 or BF16 for this layer")
    return fits[0]


def _float_source(matrix, name: str):
    x = _arrays.to_cpu_contiguous(matrix, name)
    if _arrays.is_torch(x):
        import torch

        if x.dtype not in (torch.float32, torch.bfloat16):
            x = x.to(torch.float32)
        return x
    return x.astype(np.float32, copy=False)


def layout(method: str, n: int, k: int, group_size: int = 0, zero_point: bool = False) -> dict[str, tuple]:
    """The stored arrays of one [N, K] matrix: {part: (shape, dtype)} — what the quantizers
    write, `kt convert` stacks per layer, and a converted folder's files hold."""
    if method == "INT8":
        return {"codes": ((n, k), np.int8), "scales": ((n, 1), np.float32)}
    parts = {"codes": ((n, k // 2), np.uint8), "scales": ((n, k // group_size), np.float32)}
    if zero_point:
        parts["zeros"] = ((n, k // group_size), np.uint8)
    return parts


def _empty(parts: dict[str, tuple]) -> dict[str, np.ndarray]:
    return {part: np.empty(shape, dtype) for part, (shape, dtype) in parts.items()}


def quantize_int8(matrix, name: str = "weight", out: dict | None = None) -> dict[str, np.ndarray]:
    """[N, K] float -> {"codes": int8 [N, K], "scales": f32 [N, 1]}, written into `out`'s
    arrays when given (kt convert passes slices of the layer it is building)."""
    pool.ensure()
    src = _float_source(matrix, name)
    n, k = _arrays.shape_of(src)
    out = out or _empty(layout("INT8", n, k))
    _native.quantize_int8_codes(src, out["codes"], out["scales"])
    return out


def quantize_int4(matrix, group_size: int, zero_point: bool, name: str = "weight",
                  out: dict | None = None) -> dict[str, np.ndarray]:
    """[N, K] float -> {"codes": uint8 [N, K/2], "scales": f32 [N, K/G], ["zeros": uint8 [N, K/G]]},
    written into `out`'s arrays when given."""
    if group_size not in INT4_GROUPS:
        raise ValueError(f"INT4 group size must be one of {INT4_GROUPS}, got {group_size}")
    pool.ensure()
    src = _float_source(matrix, name)
    n, k = _arrays.shape_of(src)
    if k % group_size:
        raise ValueError(f"{name}: group size {group_size} does not divide K = {k}")
    out = out or _empty(layout("INT4", n, k, group_size, zero_point))
    _native.quantize_int4_codes(src, group_size, zero_point, out["codes"], out["scales"], out.get("zeros"))
    return out
