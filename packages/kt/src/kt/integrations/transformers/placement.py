"""Hybrid placement: which routed experts of each MoE layer are "GPU-resident", computed by
torch on the model's device, while kt computes the rest on the CPU.

`num_gpu_experts` is a per-layer average: every strategy places `num_gpu_experts × layers`
experts in all, and all but `frequency` and `front-loading` place exactly that many per layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from kt_core.errors import KTError

STRATEGIES = ("uniform", "frequency", "front-loading", "random")


def gpu_expert_masks(strategy: str, *, layers: Sequence[int], num_experts: int, num_gpu_experts: int,
                     counts: Mapping[int, Sequence[int]] | None = None, seed: int = 42) -> dict[int, tuple[bool, ...]]:
    """One mask per layer, True = GPU-resident.

    uniform        the `num_gpu_experts` lowest ids of every layer (what KTMoEWrapper's
                   num_gpu_experts means; without statistics no choice of ids is better).
    frequency      the budget's most activated (layer, expert) pairs over the whole model, from
                   recorded counts (ties: earlier layer, then lower id), so hot layers get more —
                   kt-kernel's generate_gpu_experts_masks.
    front-loading  whole layers in order, lowest ids first, until the budget runs out: the first
                   layers' routing does not depend on deferred or quantized results of later ones.
    random         `num_gpu_experts` distinct ids per layer drawn with numpy's generator at `seed`.
    """
    if strategy not in STRATEGIES:
        raise KTError(f"unknown placement {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if isinstance(num_gpu_experts, bool) or not isinstance(num_gpu_experts, int) or not 0 <= num_gpu_experts <= num_experts:
        raise KTError(f"num_gpu_experts must be an integer in [0, {num_experts}] (per layer), got {num_gpu_experts!r}")
    layers = list(layers)
    chosen: dict[int, set[int]] = {layer: set() for layer in layers}
    budget = num_gpu_experts * len(layers)
    if strategy == "uniform":
        for layer in layers:
            chosen[layer] = set(range(num_gpu_experts))
    elif strategy == "front-loading":
        for layer in layers:
            take = min(budget, num_experts)
            chosen[layer] = set(range(take))
            budget -= take
    elif strategy == "random":
        rng = np.random.default_rng(seed)
        for layer in layers:
            chosen[layer] = {int(e) for e in rng.choice(num_experts, size=num_gpu_experts, replace=False)}
    else:
        if counts is None:
            raise KTError("placement 'frequency' needs expert activation counts: record them with "
                          "patch_model(..., record_stats=PATH) on representative prompts, then pass stats_file=PATH")
        missing = [layer for layer in layers if layer not in counts]
        if missing:
            raise KTError(f"the expert statistics have no counts for MoE layer(s) {missing}; they were recorded on "
                          "a different model")
        for layer in layers:
            if len(counts[layer]) != num_experts:
                raise KTError(f"the expert statistics list {len(counts[layer])} experts for layer {layer}, the model "
                              f"has {num_experts}")
        pairs = sorted(((-int(counts[layer][e]), i, e) for i, layer in enumerate(layers) for e in range(num_experts)))
        for _, i, e in pairs[:budget]:
            chosen[layers[i]].add(e)
    return {layer: tuple(e in chosen[layer] for e in range(num_experts)) for layer in layers}
