"""KTExperts: the module that takes the place of a transformers MoE block's routed experts.

The block keeps its router, shared experts and everything else; it calls
`experts(hidden [T, H], top_k_index [T, k], top_k_weights [T, k])` as before, and gets the
weighted sum of the chosen experts. Each pick is computed either by kt on the CPU or, for
GPU-resident experts, by torch on the model's device — overlapped: kt's forward is submitted,
torch computes its experts, then the two are added after kt's sync.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kt_core.moe import MoE

from .deferral import Handoff, lowest_weight_picks
from .stats import ExpertStats


def resident_slots(gpu_mask) -> torch.Tensor:
    """Each expert's slot among the GPU-resident ones (int64 [E]; -1: an expert kt computes)."""
    resident = [e for e, g in enumerate(gpu_mask) if g]
    slots = torch.full((len(gpu_mask),), -1, dtype=torch.int64)
    slots[resident] = torch.arange(len(resident))
    return slots


def resident_weights(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, gpu_mask) -> tuple[torch.Tensor, torch.Tensor]:
    """The GPU-resident experts' weights, in slot order: gate|up [G, 2I, H] and down [G, H, I]."""
    resident = torch.tensor([e for e, g in enumerate(gpu_mask) if g], dtype=torch.int64, device=gate.device)
    return (torch.cat([gate.index_select(0, resident), up.index_select(0, resident)], dim=1),
            down.index_select(0, resident))


def resident_biases(biases, gpu_mask) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The GPU-resident experts' biases in slot order, gate|up [G, 2I] and down [G, H], from (gate
    [E, I], up [E, I], down [E, H]); None for experts without biases."""
    if biases is None:
        return None
    gate, up, down = biases
    resident = torch.tensor([e for e, g in enumerate(gpu_mask) if g], dtype=torch.int64, device=gate.device)
    return torch.cat([gate.index_select(0, resident), up.index_select(0, resident)], dim=1), down.index_select(0, resident)


def gated(gate: torch.Tensor, up: torch.Tensor, swiglu: tuple = (0.0, 0.0, False, "silu")) -> torch.Tensor:
    """The experts' activation as kt's kernels compute it (kt/formats/gated_activation.h): SiLU(gate) *
    up; a limit > 0 clamps gate from above and up both ways first; alpha > 0 gives GPT-OSS's
    gate * sigmoid(alpha gate) * (up + 1); with the limit after the activation (swiglu's third,
    Step-3.5 / Ling-2.5) it clamps SiLU(gate) instead; swiglu's fourth "gelu_tanh": GELU-tanh(gate) *
    up (Gemma 4)."""
    limit, alpha, *after = swiglu
    if len(after) > 1 and after[1] == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    if after and after[0]:
        return F.silu(gate).clamp(max=limit) * up.clamp(-limit, limit)
    if limit > 0:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    if alpha > 0:
        return gate * torch.sigmoid(alpha * gate) * (up + 1)
    return F.silu(gate) * up


# delta(slot, product, input): what an adapter adds to a resident expert's "gate_up" or "down"
# product of `input`, or None.
Delta = Callable[[int, str, torch.Tensor], "torch.Tensor | None"]


def resident_picks(hidden: torch.Tensor, slot: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, delta: Delta | None = None, *,
                   biases: tuple[torch.Tensor, torch.Tensor] | None = None,
                   swiglu: tuple = (0.0, 0.0, False, "silu")) -> torch.Tensor:
    """The picks of GPU-resident experts (slot >= 0), computed as transformers' eager experts do, on
    hidden's device in its dtype, summed per token; `delta` adds an adapter's share (training);
    `biases` (gate|up [G, 2I], down [G, H]) and `swiglu` for GPT-OSS's experts."""
    out = torch.zeros_like(hidden)
    for s in torch.unique(slot[slot >= 0]).tolist():
        token, pick = torch.where(slot == s)
        x = hidden[token]
        gu = F.linear(x, gate_up[s], None if biases is None else biases[0][s])
        d = delta(s, "gate_up", x) if delta is not None else None
        gate, up = (gu if d is None else gu + d).chunk(2, dim=-1)
        h = gated(gate, up, swiglu)
        y = F.linear(h, down[s], None if biases is None else biases[1][s])
        d = delta(s, "down", h) if delta is not None else None
        y = (y if d is None else y + d) * weights[token, pick, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


class KTExperts(nn.Module):
    def __init__(self, *, layer: int, order: int, num_experts: int, moe: MoE | None, gpu_mask: tuple[bool, ...],
                 resident_gate_up: torch.Tensor, resident_down: torch.Tensor, defer: int, handoff: Handoff | None,
                 stats: ExpertStats | None, original: nn.Module | None,
                 resident_bias: tuple[torch.Tensor, torch.Tensor] | None = None, swiglu: tuple = (0.0, 0.0, False, "silu")):
        super().__init__()
        self.layer, self.order, self.num_experts = layer, order, num_experts
        self.moe = moe                      # None when every expert of the layer is GPU-resident
        self.gpu_mask = gpu_mask
        self.defer, self.handoff, self.stats = defer, handoff, stats
        # The torch experts module this one replaced, kept only with free_originals=False (to
        # compare against); stored outside _modules so the model's parameters do not include it.
        self.__dict__["original"] = original
        # Buffers, so model.to(device) takes the GPU-resident experts and their slot map along;
        # not persistent: a checkpoint of the patched model keeps its original expert names.
        self.register_buffer("resident_slot", resident_slots(gpu_mask).to(resident_gate_up.device), persistent=False)
        self.register_buffer("resident_gate_up", resident_gate_up, persistent=False)   # [G, 2I, H]
        self.register_buffer("resident_down", resident_down, persistent=False)         # [G, H, I]
        self.register_buffer("resident_gate_up_bias", None if resident_bias is None else resident_bias[0],
                             persistent=False)   # [G, 2I]
        self.register_buffer("resident_down_bias", None if resident_bias is None else resident_bias[1],
                             persistent=False)   # [G, H]
        self.swiglu = swiglu

    def extra_repr(self) -> str:
        kt = f"{self.moe.method} on {self.moe.backend}" if self.moe is not None else "none"
        return (f"layer={self.layer}, experts={self.num_experts}, gpu_resident={sum(self.gpu_mask)}, kt={kt}, "
                f"deferred_per_token={self.defer}")

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        tokens = hidden_states.shape[0]
        if self.stats is not None:
            self.stats.record(self.layer, top_k_index)
        carried = self.handoff.take(self.order, tokens) if self.handoff is not None else None
        slot = self.resident_slot[top_k_index]          # GPU-resident slot of each pick; -1: kt's
        # A pick of weight 0 contributes nothing, so kt skips it (id -1) rather than compute an expert to
        # multiply it by 0: LongCat-Flash's zero-computation experts reach the experts so, as real ids.
        live = top_k_index.masked_fill(top_k_weights == 0, -1)
        kt_ids, deferred = live, None
        if self.defer and self.moe is not None:
            deferred = lowest_weight_picks(top_k_weights, slot >= 0, self.defer)
            kt_ids = live.masked_fill(deferred, -1)
        # kt skips GPU-resident ids itself (its gpu_experts_mask), so they need no masking here.
        kt_result = self._start_kt(hidden_states, kt_ids, top_k_weights)
        out = self._resident(hidden_states, slot, top_k_weights)
        if kt_result is not None:
            cpu = kt_result()
            out = cpu if out is None else out + cpu
        if deferred is not None:
            # The input is copied: the deferred forward outlives this call and its caller's tensors.
            later = self._start_kt(hidden_states.clone(), live.masked_fill(~deferred, -1), top_k_weights)
            self.handoff.put(self.order, tokens, later)
        if out is None:      # no kt experts and no resident pick: nothing routed contributes
            out = torch.zeros_like(hidden_states)
        return out if carried is None else out + carried

    def _start_kt(self, hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> Callable[[], torch.Tensor] | None:
        """Start kt's share; returns the function that waits for it and gives its output."""
        if self.moe is None:
            return None
        step = self.moe.max_tokens
        if hidden.shape[0] <= step:
            self.moe.submit(hidden, ids, weights)
            return self.moe.sync
        # Longer than one kt forward takes (chunked prefill): chunk by chunk, not overlapped.
        out = torch.cat([self.moe.forward(hidden[i:i + step], ids[i:i + step], weights[i:i + step])
                         for i in range(0, hidden.shape[0], step)])
        return lambda: out

    def _resident(self, hidden: torch.Tensor, slot: torch.Tensor, weights: torch.Tensor) -> torch.Tensor | None:
        """The GPU-resident picks, computed as transformers' eager experts do, or None if there are none."""
        if self.resident_gate_up.shape[0] == 0:
            return None
        biases = None if self.resident_gate_up_bias is None else (self.resident_gate_up_bias, self.resident_down_bias)
        return resident_picks(hidden, slot, weights, self.resident_gate_up, self.resident_down, biases=biases,
                              swiglu=self.swiglu)
