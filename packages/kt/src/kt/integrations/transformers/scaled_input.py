"""Llama 4's MoE block on kt: the routing score scales the experts' input, not their output.

Llama4TextMoe runs every expert over every token on `hidden * score` (the score of an expert
that did not route the token is sigmoid(-inf) = 0, whose SwiGLU output is 0) and sums the
results. For the routed experts that is sum_j expert_{id_j}(hidden * s_j): kt's experts module
computes sum_j w_j * expert_{id_j}(x) over one x, so the block calls it once per routing slot
with that slot's scaled input, a weight of 1 and the other slots' ids -1 — one call for Scout and
Maverick (top-1)."""

from __future__ import annotations

import types

import torch
from torch import nn

from kt_core.errors import KTError


def _forward_on_kt(self, hidden_states):
    hidden = hidden_states.reshape(-1, self.hidden_dim)
    scores, logits = self.router(hidden)   # scores [T, E]: sigmoid of the top-k logits, 0 elsewhere
    ids = torch.topk(logits, self.router.top_k, dim=1).indices
    picked = scores.gather(1, ids)
    out = self.shared_expert(hidden)
    if ids.shape[1] == 1:
        return out + self.experts(hidden * picked, ids, torch.ones_like(picked)), logits
    for j in range(ids.shape[1]):   # slot j alone: the other slots' ids -1 (they contribute nothing)
        alone = torch.full_like(ids, -1)
        alone[:, j] = ids[:, j]
        out = out + self.experts(hidden * picked[:, j:j + 1], alone, torch.ones_like(picked))
    return out, logits


def run_scaled_input_on(block: nn.Module) -> None:
    """Route the Llama 4 block's experts through kt (its `experts` already kt's module)."""
    missing = [n for n in ("router", "shared_expert", "hidden_dim") if not hasattr(block, n)]
    if missing or not hasattr(getattr(block, "router", None), "top_k"):
        raise KTError(f"{type(block).__name__} lacks {', '.join(missing) or 'router.top_k'}: kt runs Llama 4's "
                      "block form (router returning scores and logits, shared_expert, hidden_dim)")
    block.forward = types.MethodType(_forward_on_kt, block)   # MethodType: deepcopy rebinds it
