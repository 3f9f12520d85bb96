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
"""

from __future__ import annotations

from . import _native, pool


def grouped_lora_forward(x, counts, a, b, scaling: float, xa, out, *, blocks: int = 1) -> None:
    pool.ensure()
    _native.grouped_lora_forward(x, counts, a, b, float(scaling), xa, out, int(blocks))


def grouped_lora_backward(dy, x, xa, counts, a, b, scaling: float, dx, da, db, *, blocks: int = 1,
                          accumulate_dx: bool = False) -> None:
    pool.ensure()
    _native.grouped_lora_backward(dy, x, xa, counts, a, b, float(scaling), dx, da, db, int(blocks), bool(accumulate_dx))
