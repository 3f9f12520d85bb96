"""The routed experts' training step as one explicit forward and backward (torch tensors, float32).

    step = ExpertStep(moe)                                  # moe: kt_core.MoE(..., trainable=True), loaded
    out, saved = step.forward(x, ids, weights, adapters)    # x [T, H], ids int64 [T, k], weights [T, k]
    grads = step.backward(saved, grad_out)                  # StepGrads: x, weights, the adapters' factors

kt's grouped products with the frozen packed weights (`MoE.grouped_*`, forward and transposed),
kt_core.lora's per-expert adapters riding on them (each adapter's term added to its product's
output tiles) and kt_core.rows' row passes:

    rows = x[token]                                         (grouped by expert: Routing)
    gu   = rows·[gate|up]ᵀ + s·(rows·A_guᵀ)·B_guᵀ (+ b_gu)  (B_gu block-diagonal for separate gate/up adapters)
    h    = SiLU(gu_gate) · gu_up · w                        (the routing weight scales down's input: equal by linearity)
    y    = h·downᵀ + s·(h·A_dᵀ)·B_dᵀ (+ w·b_d),   out[t] = Σ over t's picks of y

Experts with biases and the clamped SwiGLU (GPT-OSS: MoE(expert_bias=True, swiglu_limit=...)) add
their frozen biases per expert around the products and gate with that activation instead of SiLU;
the routing weights' gradient then carries down's bias too (dw = <dy, h_u·downᵀ + b_d>).

Backward runs the same chain in reverse: each adapter's factor gradients first (reading x[token]
where x lies, never a gathered copy), then its share g·A_e of the input gradient added by the base
transposed product. A saved forward holds x, the routing, gu ([rows, 2I]), the routing weights per
row and the adapters' x·Aᵀ; backward recomputes h inside the gated backward pass (down's adapter
needs it for dA) instead of keeping it. The rows
x[token] are never gathered into a [rows, H] copy, except for full fine-tuning's weight gradients.

The step's large temporaries ([rows, H], [rows, 2I], [rows, I]) come from `ExpertStep.buffers`, a
pool shared by every layer and reused across steps: a fresh 100 MB tensor costs ~35 ms of page
faults on first touch, and a step of a Qwen3-30B-A3B layer at 2048 tokens makes ~1 GB of them.

Used by kt_core.sft (kt-kernel's SFT wrapper API) and kt.training.LoRAExperts (one autograd node
over the whole expert block).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .lora import ProductLora, ProductLoraGrad, grouped_lora_backward
from .moe import MoE
from .rows import Routing, gated_rows_backward, gated_rows_forward, gather_rows, sum_rows


class BufferPool:
    """Float32 [rows, width] buffers reused across steps; a buffer serves any request of its width up
    to its capacity. Holds one step's peak; clear() frees it. A buffer handed out and never given back
    (a forward that is never backwarded) is not referenced here: it is freed with its last user. Only
    views of the pool's own buffers are taken back (a saved-tensor hook may hand back something else),
    and each once."""

    def __init__(self):
        self._free: list[torch.Tensor] = []
        self._made: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def take(self, rows: int, width: int) -> torch.Tensor:
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.shape[1] == width and b.shape[0] >= rows]
            base = self._free.pop(min(fits, key=lambda i: self._free[i].shape[0])) if fits else None
            if base is None:
                base = torch.empty((max(rows, 1), width))
                self._made[id(base)] = base
        return base[:rows]   # a view: its ._base is the buffer give() takes back

    def give(self, *views) -> None:
        with self._lock:
            for v in views:
                base = v._base if v is not None else None
                if base is not None and self._made.get(id(base)) is base and all(b is not base for b in self._free):
                    self._free.append(base)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


@dataclass
class Adapters:
    """A step's LoRA factors, float32 C-contiguous: the fused gate/up product's (A [E, r', H],
    B [E, 2I, r' / blocks], blocks: 2 for separate gate and up adapters) and down's (A [E, r, I],
    B [E, H, r]); either pair may be None."""
    scaling: float
    gate_up_a: torch.Tensor | None = None
    gate_up_b: torch.Tensor | None = None
    blocks: int = 1
    down_a: torch.Tensor | None = None
    down_b: torch.Tensor | None = None


@dataclass
class Saved:
    """What one forward keeps for its backward."""
    x: torch.Tensor              # f32 [T, H]
    routing: Routing
    gate_up: torch.Tensor        # f32 [rows, 2I], the adapter's delta included (a pool buffer)
    picked: torch.Tensor         # f32 [rows]: each row's routing weight
    adapters: Adapters | None
    xa_gate_up: torch.Tensor | None
    xa_down: torch.Tensor | None


@dataclass
class StepGrads:
    x: torch.Tensor              # f32 [T, H]
    weights: torch.Tensor        # f32 [T, k] (0 for picks of -1)
    gate_up_a: torch.Tensor | None = None
    gate_up_b: torch.Tensor | None = None
    down_a: torch.Tensor | None = None
    down_b: torch.Tensor | None = None


# weight_grads(routing, rows [S, H], dgate_up [S, 2I], h [S, I], dy [S, H], picked [S]): the expert
# weights' (and biases') gradients from the step's pieces (full fine-tuning), called before they go
# back to the pool; picked is each row's routing weight.
WeightGrads = Callable[[Routing, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def expert_weight_grads(routing: Routing, rows: torch.Tensor, dgate_up: torch.Tensor, h: torch.Tensor,
                        dy: torch.Tensor):
    """(expert, d [gate|up] [2I, H], d down [H, I]) of each expert with rows, from a WeightGrads
    callback's pieces: dgate_upᵀ·rows and dyᵀ·h over the expert's rows (torch GEMMs). dy carries the
    routing weight already (h is scaled by it), so these are the full expert weights' gradients."""
    for e, r in _expert_rows(routing.splits):
        yield e, dgate_up[r].T @ rows[r], dy[r].T @ h[r]


def expert_bias_grads(routing: Routing, dgate_up: torch.Tensor, dy: torch.Tensor, picked: torch.Tensor):
    """(expert, d [gate|up] bias [2I], d down bias [H]) of each expert with rows, from a WeightGrads
    callback's pieces: the gate/up gradient summed over the expert's rows, and dy weighted by each
    row's routing weight (the down bias enters each row's output times it)."""
    for e, r in _expert_rows(routing.splits):
        yield e, dgate_up[r].sum(dim=0), picked[r] @ dy[r]


def _transposed(b: torch.Tensor) -> torch.Tensor:
    """An adapter's B [E, N, r'] as the products take it, B_eᵀ [E, r', N]."""
    return b.transpose(1, 2).contiguous()


def _expert_rows(splits: list[int]):
    """(expert, its rows as a slice) of each expert with rows, in the rows' order."""
    start = 0
    for e, n in enumerate(splits):
        if n:
            yield e, slice(start, start + n)
        start += n


def _expert_rows_add(t: torch.Tensor, splits: list[int], bias: torch.Tensor, scale: torch.Tensor | None = None) -> None:
    """t[rows of expert e] += bias[e] (times each row's scale when given), in place."""
    for e, rows in _expert_rows(splits):
        if scale is None:
            t[rows].add_(bias[e])
        else:
            t[rows].addr_(scale[rows], bias[e])


class ExpertStep:
    buffers = BufferPool()   # shared: layers run one after another

    def __init__(self, moe: MoE):
        self.moe = moe
        self.swiglu = moe.swiglu

    def _biases(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        b = self.moe.training_biases   # set as the experts load, so read at each step
        return None if b is None else (torch.from_numpy(b[0]), torch.from_numpy(b[1]))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, adapters: Adapters | None,
                save: bool = True, pooled_output: bool = False) -> tuple[torch.Tensor, Saved | None]:
        """out f32 [T, H] (a pool buffer when pooled_output: the caller gives it back) and, with save,
        what backward needs (give it to backward() or release())."""
        moe, buf = self.moe, self.buffers
        H, I = moe.hidden_size, moe.intermediate_size
        x = x.float().contiguous()
        routing = Routing.of(ids.to(torch.int64), moe.num_experts)
        S, counts = routing.token.numel(), routing.counts
        # The rows x[token] are quantized straight from x, and each adapter rides on its base product.
        xa_gate_up = xa_down = lora = None
        if adapters is not None and adapters.gate_up_a is not None:
            xa_gate_up = torch.empty((S, adapters.gate_up_a.shape[1]), dtype=torch.float32)
            lora = ProductLora(adapters.gate_up_a, _transposed(adapters.gate_up_b), adapters.scaling, xa_gate_up,
                               adapters.blocks)
        gate_up = moe.grouped_gate_up(x, counts, out=buf.take(S, 2 * I), token=routing.token, lora=lora)
        biases = self._biases()
        if biases is not None:
            _expert_rows_add(gate_up, routing.splits, biases[0])
        picked = weights.float().reshape(-1).index_select(0, routing.slot).contiguous()
        h = buf.take(S, I)
        gated_rows_forward(gate_up, picked, h, self.swiglu)
        lora = None
        if adapters is not None and adapters.down_a is not None:
            xa_down = torch.empty((S, adapters.down_a.shape[1]), dtype=torch.float32)
            lora = ProductLora(adapters.down_a, _transposed(adapters.down_b), adapters.scaling, xa_down)
        y = moe.grouped_down(h, counts, out=buf.take(S, H), lora=lora)
        if biases is not None:
            _expert_rows_add(y, routing.splits, biases[1], picked)
        buf.give(h)
        out = buf.take(x.shape[0], H) if pooled_output else torch.empty((x.shape[0], H), dtype=torch.float32)
        sum_rows(y, routing.row_of_slot, out)
        buf.give(y)
        if not save:
            buf.give(gate_up)
            return out, None
        return out, Saved(x, routing, gate_up, picked, adapters, xa_gate_up, xa_down)

    def release(self, saved: Saved) -> None:
        """A saved forward that will not be backwarded: its buffer back to the pool."""
        self.buffers.give(saved.gate_up)

    def backward(self, saved: Saved, grad_out: torch.Tensor, *, weight_grads: WeightGrads | None = None,
                 pooled_output: bool = False) -> StepGrads:
        """The gradients from grad_out f32 [T, H] (consumes `saved`). grads.x is a pool buffer when
        pooled_output (the caller gives it back)."""
        moe, buf, routing, ad = self.moe, self.buffers, saved.routing, saved.adapters
        counts = routing.counts
        S, H, I = routing.token.numel(), moe.hidden_size, moe.intermediate_size
        lora_gu = ad is not None and ad.gate_up_a is not None
        lora_d = ad is not None and ad.down_a is not None
        g = grad_out.float().contiguous()
        dy = buf.take(S, H)
        gather_rows(g, routing.token, dy)
        h = None
        if weight_grads is not None:
            h = buf.take(S, I)
            gated_rows_forward(saved.gate_up, saved.picked, h, self.swiglu)
        grads = StepGrads(x=None, weights=None)
        # Each adapter's factors' gradients first; its share of the input gradient, g·A_e, rides on
        # the base transposed product. Down's dA = gᵀ·h comes with the gated backward pass, which
        # recomputes h in cache (unless h is at hand for the weights' gradients).
        lora = g_down = None
        if lora_d:
            grads.down_a, grads.down_b = torch.empty_like(ad.down_a), torch.empty_like(ad.down_b)
            g_down = torch.empty_like(saved.xa_down)
            grouped_lora_backward(dy, h, saved.xa_down, counts, ad.down_a, ad.down_b, ad.scaling, None,
                                  grads.down_a if h is not None else None, grads.down_b, g=g_down)
            lora = ProductLoraGrad(g_down, ad.down_a)
        dh = moe.grouped_down_transposed(dy, counts, out=buf.take(S, I), lora=lora)
        dgate_up, dpicked = buf.take(S, 2 * I), torch.empty_like(saved.picked)
        if lora_d and h is None:
            gated_rows_backward(dh, saved.gate_up, saved.picked, dgate_up, dpicked, self.swiglu, counts=counts, g=g_down,
                                da=grads.down_a)
        else:
            gated_rows_backward(dh, saved.gate_up, saved.picked, dgate_up, dpicked, self.swiglu)
        biases = self._biases()
        if biases is not None:   # y's w·b_d term
            for e, rows in _expert_rows(routing.splits):
                dpicked[rows].addmv_(dy[rows], biases[1][e])
        buf.give(dh, saved.gate_up)
        lora = None
        if lora_gu:
            grads.gate_up_a, grads.gate_up_b = torch.empty_like(ad.gate_up_a), torch.empty_like(ad.gate_up_b)
            g_gate_up = torch.empty_like(saved.xa_gate_up)
            grouped_lora_backward(dgate_up, saved.x, saved.xa_gate_up, counts, ad.gate_up_a, ad.gate_up_b, ad.scaling,
                                  None, grads.gate_up_a, grads.gate_up_b, blocks=ad.blocks, g=g_gate_up,
                                  token=routing.token)
            lora = ProductLoraGrad(g_gate_up, ad.gate_up_a)
        drows = moe.grouped_gate_up_transposed(dgate_up, counts, out=buf.take(S, H), lora=lora)
        rows = None
        if weight_grads is not None:
            rows = buf.take(S, H)
            gather_rows(saved.x, routing.token, rows)
        T = saved.x.shape[0]
        grads.x = buf.take(T, H) if pooled_output else torch.empty((T, H), dtype=torch.float32)
        sum_rows(drows, routing.row_of_slot, grads.x)
        dw = torch.zeros(routing.row_of_slot.numel(), dtype=torch.float32)
        dw[routing.slot] = dpicked
        grads.weights = dw.view(routing.row_of_slot.shape)
        if weight_grads is not None:
            weight_grads(routing, rows, dgate_up, h, dy, saved.picked)
        buf.give(dy, h, dgate_up, drows, rows)
        return grads
