"""Training's row passes around the expert products (what kt.training's autograd nodes and
kt_core.sft's wrapper run), and `Routing`, the order of those rows.

One pass over memory each, on kt's pool; arrays float32 (indices int64), C-contiguous, on the CPU,
outputs written in place:

    gather_rows(x [T, W], token [S], rows [S, W])                     rows[i] = x[token[i]]
    sum_rows(rows [S, W], row_of_slot [T, K], out [T, W])             out[t] = sum_j rows[row_of_slot[t, j]] (-1 skipped)
    gated_rows_forward(gate_up [S, 2I], w [S], h [S, I])              h = SiLU(gate) * up * w
    gated_rows_backward(dh, gate_up, w, dgate_up [S, 2I], dw [S])     its gradients

The gated passes take swiglu=(limit, alpha[, after[, gate_activation]]), the layer's activation
(kt_core.MoE.swiglu; kt_core.testing.reference.gated): (0, 0) is SiLU; limit > 0 clamps
g = min(gate, limit), u = clamp(up, -limit, limit) first (DeepSeek-V4's clamped SiLU with alpha 0:
h = SiLU(g) * u * w); alpha > 0 gives GPT-OSS's clamped SwiGLU h = (u + 1) * g * sigmoid(alpha * g) * w;
after (alpha 0) clamps SiLU(gate) instead: h = min(SiLU(gate), limit) * u * w (Step-3.5, Ling-2.5);
gate_activation "gelu_tanh" (limit, alpha 0): h = GELU-tanh(gate) * up * w (Gemma 4).

gather_rows and sum_rows are each other's backward; sum_rows adds a token's rows in slot order, so
the result does not depend on the thread count. `Routing.of(top_k_index, num_experts)` (torch)
groups a forward's (token, pick) pairs by expert once: the rows' order every pass above takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import _native, pool

if TYPE_CHECKING:   # torch is optional for kt-core; Routing is built by callers that have it
    import torch


def gather_rows(x, token, rows) -> None:
    pool.ensure()
    _native.gather_rows(x, token, rows)


def sum_rows(rows, row_of_slot, out) -> None:
    pool.ensure()
    _native.sum_rows(rows, row_of_slot, out)


def _gate(swiglu: tuple) -> tuple[float, float, bool, bool]:
    limit, alpha, *rest = swiglu
    after = bool(rest and rest[0])
    act = rest[1] if len(rest) > 1 else "silu"
    if act not in ("silu", "gelu_tanh"):
        raise ValueError(f"gate_activation is 'silu' or 'gelu_tanh', got {act!r}")
    return float(limit), float(alpha), after, act == "gelu_tanh"


def gated_rows_forward(gate_up, w, h, swiglu: tuple = (0.0, 0.0)) -> None:
    pool.ensure()
    _native.gated_rows_forward(gate_up, w, h, *_gate(swiglu))


def gated_rows_backward(dh, gate_up, w, dgate_up, dw, swiglu: tuple = (0.0, 0.0), *, counts=None, g=None,
                        da=None) -> None:
    """With counts (rows grouped by expert), g [rows, r] and da [E, r, I]: also the down adapter's
    da_e = Σ over e's rows of g[i]ᵀ·h[i], h recomputed in cache (kt_core.lora's dA left to it)."""
    pool.ensure()
    _native.gated_rows_backward(dh, gate_up, w, dgate_up, dw, *_gate(swiglu), counts, g, da)


@dataclass
class Routing:
    """The routed (token, pick) pairs of one forward, grouped by expert.

    slot: index into top_k_index.reshape(-1) of each row; token: its token; counts: rows per
    expert (int64 [E], what kt's grouped products take); splits: the same as a Python list;
    offsets: where each expert's rows end (int32 [E]); row_of_slot: the row of each (token, pick)."""
    slot: torch.Tensor
    token: torch.Tensor
    counts: torch.Tensor
    splits: list[int]
    offsets: torch.Tensor   # int32 [E]: end of each expert's rows
    row_of_slot: torch.Tensor   # int64 [T, k]: the row of each (token, pick), -1 for none

    @classmethod
    def of(cls, top_k_index: torch.Tensor, num_experts: int) -> Routing:
        import torch

        ids = top_k_index.reshape(-1).to(torch.int64)
        picks = top_k_index.shape[-1]
        # -1 marks "no expert" (a pick another device computes): sorted past every real expert.
        key = torch.where(ids >= 0, ids, num_experts)
        order = torch.argsort(key, stable=True)
        rows = int((ids >= 0).sum())
        slot = order[:rows]
        counts = torch.bincount(ids[slot], minlength=num_experts)
        row_of_slot = torch.full((ids.numel(),), -1, dtype=torch.int64)
        row_of_slot[slot] = torch.arange(rows)
        return cls(slot=slot, token=slot // picks, counts=counts, splits=counts.tolist(),
                   offsets=torch.cumsum(counts, 0).to(torch.int32), row_of_slot=row_of_slot.view(-1, picks))
