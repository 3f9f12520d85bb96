"""What hybrid GPU/CPU serving decides beside the layer, as kt-kernel 0.7.2 decides it: which
experts live on the GPU (generate_gpu_experts_masks) and which routed picks a layer defers to
the next one (select_deferred_experts). NumPy or torch in, the same kind out."""

from __future__ import annotations

import numpy as np

from . import _arrays


def _numpy(x, name: str) -> np.ndarray:
    if _arrays.is_torch(x):
        return x.detach().cpu().numpy()
    try:
        return np.asarray(x)
    except Exception as e:
        raise TypeError(f"{name} must be a torch tensor or an array, got {type(x).__name__}") from e


def _like(result: np.ndarray, template):
    if _arrays.is_torch(template):
        import torch
        return torch.from_numpy(result)
    return result


def generate_gpu_experts_masks(activation_freq, num_gpu_experts: int):
    """The `num_gpu_experts` most activated (layer, expert) pairs of activation_freq [L, E], over
    all layers at once (not per layer): a bool mask [L, E], True = on the GPU. Ties go to the
    lower flat index. A CPU torch.bool tensor for torch input, else a NumPy array."""
    freq = _numpy(activation_freq, "activation_freq")
    if freq.ndim != 2:
        raise ValueError(f"activation_freq must be [num_layers, num_experts], got shape {tuple(freq.shape)}")
    n = min(max(int(num_gpu_experts), 0), freq.size)
    flat = np.zeros(freq.size, dtype=bool)
    if n:
        order = np.argsort(-freq.reshape(-1).astype(np.float64), kind="stable")
        flat[order[:n]] = True
    return _like(flat.reshape(freq.shape), activation_freq)


def select_deferred_experts(expert_ids, expert_scores, protected_k: int):
    """Split a batch's picks [T, k] into (immediate, deferred), each [T, k] with -1 where the
    other holds the pick. Per token the protected_k highest-scored picks are protected, and an
    expert protected for any token of the batch stays immediate for every token routed to it
    (its weights are streamed for this layer anyway); the rest are deferred. protected_k is
    clamped to [0, k]; 0 defers everything."""
    ids = _numpy(expert_ids, "expert_ids").astype(np.int64, copy=False)
    scores = _numpy(expert_scores, "expert_scores").astype(np.float32, copy=False)
    if ids.ndim != 2 or scores.shape != ids.shape:
        raise ValueError(f"expert_ids and expert_scores must both be [tokens, k]; got {tuple(ids.shape)} and "
                         f"{tuple(scores.shape)}")
    k = ids.shape[1]
    p = min(max(int(protected_k), 0), k)
    protected = np.zeros(ids.shape, dtype=bool)
    if p:
        top = np.argsort(-scores, axis=1, kind="stable")[:, :p]
        picked = np.take_along_axis(ids, top, axis=1)
        experts = np.unique(picked[picked >= 0])
        protected = np.isin(ids, experts) & (ids >= 0)
    immediate = np.where(protected, ids, -1)
    deferred = np.where(protected, -1, ids)
    return _like(immediate, expert_ids), _like(deferred, expert_ids)
