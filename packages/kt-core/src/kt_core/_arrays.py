"""Array plumbing for torch tensors and NumPy arrays without importing torch unless given one."""

from __future__ import annotations

import numpy as np


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def to_cpu_contiguous(x, name: str):
    """A CPU, C-contiguous view or copy of x (torch tensor or array-like)."""
    if is_torch(x):
        if x.device.type != "cpu":
            x = x.to("cpu")
        return x.contiguous()
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    try:
        return np.ascontiguousarray(np.asarray(x))
    except Exception as exc:
        raise TypeError(f"{name} must be a torch tensor or a NumPy array, got {type(x).__name__}") from exc


def weight_matrix(x, name: str):
    """A CPU contiguous weight matrix; torch float8 codes are passed on as their bytes."""
    x = to_cpu_contiguous(x, name)
    if is_torch(x) and "float8" in str(x.dtype):
        import torch

        return x.view(torch.uint8)
    return x


def as_int64(x, name: str):
    x = to_cpu_contiguous(x, name)
    if is_torch(x):
        import torch

        if x.dtype.is_floating_point or x.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer expert ids, got {x.dtype}")
        return x if x.dtype == torch.int64 else x.to(torch.int64)
    if x.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer expert ids, got {x.dtype}")
    return x.astype(np.int64, copy=False)


def as_float32(x, name: str):
    x = to_cpu_contiguous(x, name)
    if is_torch(x):
        import torch

        if not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be floating point, got {x.dtype}")
        return x if x.dtype == torch.float32 else x.to(torch.float32)
    if x.dtype.kind != "f":
        raise TypeError(f"{name} must be floating point, got {x.dtype}")
    return x.astype(np.float32, copy=False)


def output_like(hidden, tokens: int, hidden_size: int):
    """The output buffer: bf16 for bf16 input, f32 otherwise (converted back by the caller)."""
    if is_torch(hidden):
        import torch

        dtype = torch.bfloat16 if hidden.dtype == torch.bfloat16 else torch.float32
        return torch.empty((tokens, hidden_size), dtype=dtype)
    return np.empty((tokens, hidden_size), dtype=np.float32)


def shape_of(x) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)
