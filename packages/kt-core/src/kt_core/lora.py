"""Per-expert LoRA products over rows grouped by expert (what kt.training's adapters compute).

Rows are grouped as for `kt_core.MoE.grouped_*`: counts[e] rows of expert e, in expert order. All
arrays float32, C-contiguous, on the CPU (torch tensors or NumPy arrays); outputs are written in
place. A rank-r adapter makes skinny products ([rows, 2048] x [2048, 8]); these run them as plain
loops on kt's pool, one pass over each large operand (a BLAS call per expert costs more in dispatch
than in arithmetic at these shapes).

    grouped_lora_forward(x [rows, K], counts [E], a [E, r, K], b [E, N, r], scaling, xa [rows, r], out [rows, N])
        out += scaling * (x A_eᵀ) B_eᵀ;  xa = x A_eᵀ (kept for the backward pass)
    grouped_lora_backward(dy [rows, N], x, xa, counts, a, b, scaling, dx [rows, K], da [E, r, K], db [E, N, r])
        the gradients of x, a and b from dy, the gradient of out (overwritten; zero for experts without rows;
        accumulate_dx=True adds dx's into what dx holds — the base product's share of the same gradient)

blocks=m makes B block-diagonal without its zeros: b is [E, N, r/m] and out's N columns are m equal
parts, part q taking rank slice q — separate gate and up adapters (A's stacked, B's concatenated along
N) as one call on the fused [rows, 2I] product, each half computed with its own adapter only.

An adapter can also ride on the base product it belongs to (`kt_core.MoE.grouped_*(..., lora=)`):
the product adds the adapter's term to each output tile while the tile is in cache, instead of a
pass of its own that reads and rewrites the whole output. Forward: ProductLora (x·A_eᵀ taken as the
product quantizes the rows, which it reads from x[token] where they lie); backward:
grouped_lora_backward(dx=None, g=...) gives g = scaling·dy·B_e and the factors' gradients, and
ProductLoraGrad(g, a) on the transposed product adds g·A_e. Measured alone (Qwen3-30B-A3B layer,
2048 tokens, rank 8, Zen 4, 2 threads): down's adapter 12-14 ms as a pass of its own, 1-3 ms
riding; gate/up's 20-24 ms plus 6 ms to gather the rows, 9-12 ms riding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _native, pool


@dataclass
class ProductLora:
    """An adapter on a forward grouped product: out += scaling·(x·A_eᵀ)·B_eᵀ, xa = x·A_eᵀ written.
    a [E, r, K]; bt [E, r / blocks, N] = B_eᵀ (blocks 2: the gate half takes rank slice 0, the up
    half slice 1); xa [rows, r]; all float32 C-contiguous."""
    a: Any
    bt: Any
    scaling: float
    xa: Any
    blocks: int = 1


@dataclass
class ProductLoraGrad:
    """An adapter's share of a transposed grouped product's output: dx += g·A_e (g [rows, r] from
    grouped_lora_backward(..., dx=None, g=g), a [E, r, K])."""
    g: Any
    a: Any


def grouped_lora_forward(x, counts, a, b, scaling: float, xa, out, *, blocks: int = 1) -> None:
    pool.ensure()
    _native.grouped_lora_forward(x, counts, a, b, float(scaling), xa, out, int(blocks))


def grouped_lora_backward(dy, x, xa, counts, a, b, scaling: float, dx, da, db, *, blocks: int = 1,
                          accumulate_dx: bool = False, g=None, token=None) -> None:
    """dx None: g [rows, r] receives scaling·dy·B_e instead (for ProductLoraGrad). token int64 [rows]:
    x is [tokens, K] and the rows are x[token] (no gathered copy). x and da None: dA left to the
    caller (down's adapter: kt_core.rows.gated_rows_backward(..., g=, da=))."""
    pool.ensure()
    _native.grouped_lora_backward(dy, x, xa, counts, a, b, float(scaling), dx, da, db, int(blocks), bool(accumulate_dx),
                                  g, token)
