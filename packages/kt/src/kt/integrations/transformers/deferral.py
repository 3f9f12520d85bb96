"""Deferred experts (kt-kernel's max_deferred_experts_per_token).

Each token's lowest-weight CPU experts of MoE layer n are left out of layer n's output; kt
computes them while torch runs layer n+1's attention, and their weighted sum is added to layer
n+1's routed-experts output. The last MoE layer never defers, so nothing crosses a forward pass.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def lowest_weight_picks(weights: torch.Tensor, exclude: torch.Tensor, count: int) -> torch.Tensor:
    """[tokens, top_k] bool: each row's `count` lowest-weight picks among those not excluded
    (GPU-resident experts are never deferred); ties go to the earlier top-k slot."""
    keyed = weights.float().masked_fill(exclude, float("inf"))
    slots = torch.sort(keyed, dim=1, stable=True).indices[:, :count]
    chosen = torch.zeros_like(exclude)
    return chosen.scatter_(1, slots, ~exclude.gather(1, slots))


class Handoff:
    """Carries one layer's deferred output to the next MoE layer of the same forward pass."""

    def __init__(self):
        self._pending: tuple[int, int, Callable[[], torch.Tensor]] | None = None

    def put(self, order: int, tokens: int, result: Callable[[], torch.Tensor]) -> None:
        self._pending = (order, tokens, result)

    def take(self, order: int, tokens: int) -> torch.Tensor | None:
        """The deferred output of MoE layer `order - 1`, or None. A forward still running on the
        pool is always finished here, before this layer submits its own."""
        if self._pending is None:
            return None
        source, source_tokens, result = self._pending
        self._pending = None
        out = result()
        # Anything else was left by a forward pass that stopped between layers (an exception):
        # it belongs to no token of this pass.
        return out if (source, source_tokens) == (order - 1, tokens) else None
