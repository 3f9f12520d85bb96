"""The routed experts' base products as autograd nodes over kt's packed weights.

kt's kernels compute the products with the frozen expert weights (BF16, INT8, INT4, ... as
packed by the layer's backend) forward and, transposed, backward (plugin ABI 1.4's raw gate/up
tile and 1.5's transposed tiles, through `kt_core.MoE.grouped_*`); everything else of an
expert — its LoRA, the gated activation, the routing weights, gathering the tokens and summing
the picks — is ordinary torch, so autograd derives every other gradient itself and no
hand-written backward has to agree with a forward it does not see.

Rows are (token, pick) pairs grouped by expert: `kt_core.rows.Routing` makes that order once per forward.
"""

from __future__ import annotations

import weakref

import torch

from kt_core.lora import grouped_lora_backward, grouped_lora_forward
from kt_core.moe import MoE
from kt_core.rows import Routing, gated_rows_backward, gated_rows_forward, gather_rows, sum_rows


def _layer(ctx) -> MoE:
    # The graph holds the layer weakly: a strong reference from an autograd node keeps the native
    # layer alive past interpreter shutdown whenever a graph outlives its script (nanobind reports
    # it as a leak). The experts module that ran the forward owns the layer.
    moe = ctx.moe()
    if moe is None:
        raise RuntimeError("backward through kt experts whose layer has been freed (the LoRAExperts module that ran "
                           "the forward was deleted)")
    return moe


class BaseGateUp(torch.autograd.Function):
    """x [rows, H] (float32, grouped by expert) -> [rows, 2I]: x·gateᵀ | x·upᵀ with kt's weights."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, counts: torch.Tensor, moe: MoE):
        ctx.moe, ctx.counts = weakref.ref(moe), counts
        return moe.grouped_gate_up(x.detach(), counts)

    @staticmethod
    def backward(ctx, dgate_up: torch.Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return _layer(ctx).grouped_gate_up_transposed(dgate_up.float().contiguous(), ctx.counts), None, None


class BaseDown(torch.autograd.Function):
    """h [rows, I] (float32, grouped by expert) -> h·downᵀ [rows, H] with kt's weights."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, counts: torch.Tensor, moe: MoE):
        ctx.moe, ctx.counts = weakref.ref(moe), counts
        return moe.grouped_down(h.detach(), counts)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return _layer(ctx).grouped_down_transposed(dy.float().contiguous(), ctx.counts), None, None


class GroupedLoRA(torch.autograd.Function):
    """base [rows, N] += scaling * (x A_eᵀ) B_eᵀ per expert's rows, in place (kt_core.lora's loops):
    the adapter's delta added into the base product, which no node saved. blocks > 1: B block-diagonal
    given as its blocks (kt_core.lora)."""

    @staticmethod
    def forward(ctx, base: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, counts: torch.Tensor,
                scaling: float, blocks: int):
        x = x.detach().contiguous()
        a, b = a.detach().contiguous(), b.detach().contiguous()
        xa = torch.empty((x.shape[0], a.shape[1]), dtype=torch.float32)
        grouped_lora_forward(x, counts, a, b, scaling, xa, base, blocks=blocks)
        ctx.mark_dirty(base)
        ctx.save_for_backward(x, xa, a, b)
        ctx.counts, ctx.scaling, ctx.blocks = counts, scaling, blocks
        return base

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        x, xa, a, b = ctx.saved_tensors
        dx, da, db = torch.empty_like(x), torch.empty_like(a), torch.empty_like(b)
        grouped_lora_backward(dout.float().contiguous(), x, xa, ctx.counts, a, b, ctx.scaling, dx, da, db,
                              blocks=ctx.blocks)
        return dout, dx, da, db, None, None, None


class GatherRows(torch.autograd.Function):
    """x [T, H] -> rows [S, H], row i = x[token[i]] (kt_core.rows; backward: the rows summed per token)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, routing: Routing):
        rows = torch.empty((routing.token.numel(), x.shape[1]), dtype=torch.float32)
        gather_rows(x.detach().contiguous(), routing.token, rows)
        ctx.routing, ctx.tokens = routing, x.shape[0]
        return rows

    @staticmethod
    def backward(ctx, drows: torch.Tensor):
        dx = torch.empty((ctx.tokens, drows.shape[1]), dtype=torch.float32)
        sum_rows(drows.float().contiguous(), ctx.routing.row_of_slot, dx)
        return dx, None


class SumRows(torch.autograd.Function):
    """rows [S, H] -> out [T, H], each token the sum of its rows (kt_core.rows; backward: a gather)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, routing: Routing):
        out = torch.empty((routing.row_of_slot.shape[0], rows.shape[1]), dtype=torch.float32)
        sum_rows(rows.detach().contiguous(), routing.row_of_slot, out)
        ctx.routing = routing
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        drows = torch.empty((ctx.routing.token.numel(), dout.shape[1]), dtype=torch.float32)
        gather_rows(dout.float().contiguous(), ctx.routing.token, drows)
        return drows, None


class GatedRows(torch.autograd.Function):
    """gate_up [S, 2I], w [S] -> h [S, I] = SiLU(gate) * up * w, one pass each way (kt_core.rows)."""

    @staticmethod
    def forward(ctx, gate_up: torch.Tensor, w: torch.Tensor):
        gate_up, w = gate_up.detach().contiguous(), w.detach().float().contiguous()
        h = torch.empty((gate_up.shape[0], gate_up.shape[1] // 2), dtype=torch.float32)
        gated_rows_forward(gate_up, w, h)
        ctx.save_for_backward(gate_up, w)
        return h

    @staticmethod
    def backward(ctx, dh: torch.Tensor):
        gate_up, w = ctx.saved_tensors
        dgate_up, dw = torch.empty_like(gate_up), torch.empty_like(w)
        gated_rows_backward(dh.float().contiguous(), gate_up, w, dgate_up, dw)
        return dgate_up, dw
