"""Array plumbing for torch tensors and NumPy arrays without importing torch unless given one."""

from __future__ import annotations

import sys
import warnings

import numpy as np

# kt_dtype codes (kt/plugin.h) of the hidden-state dtypes the native layer takes as addresses.
_KT_DTYPE_F32, _KT_DTYPE_BF16 = 0, 1


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def cpu_copy_f32(x):
    """A float32 CPU copy of x that no caller holds (a torch tensor stays one)."""
    if is_torch(x):
        import torch
        return x.detach().to("cpu", torch.float32, copy=True).contiguous()
    return np.array(x, dtype=np.float32, copy=True)


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


def bf16_rows(x, name: str):
    """A GGUF BF16 matrix (its rows' bytes, uint8 [N, 2K], or bits, uint16 [N, K]) as bfloat16
    for the BF16 packer: a torch view where torch is installed (no copy of a file's experts),
    else the exact float32 values. Floating input passes through."""
    x = to_cpu_contiguous(x, name)
    if is_torch(x):
        import torch

        if x.dtype.is_floating_point:
            return x
        if x.dtype == torch.bool or x.element_size() > 2 or x.ndim != 2 or x.shape[-1] * x.element_size() % 2:
            raise TypeError(f"{name} must be a 2-D matrix of GGUF BF16 bytes (uint8 [N, 2K]) or bits (16-bit ints "
                            f"[N, K]), got {x.dtype} {list(x.shape)}")
        return x.view(torch.int16).view(torch.bfloat16)
    if x.dtype.kind == "f":
        return x
    if x.dtype not in (np.uint8, np.uint16, np.int16) or x.ndim != 2 or x.shape[-1] * x.itemsize % 2:
        raise TypeError(f"{name} must be a 2-D matrix of GGUF BF16 bytes (uint8 [N, 2K]) or bits (uint16 [N, K]), got "
                        f"{x.dtype} {list(x.shape)}")
    bits = x.view(np.uint16)
    try:
        import torch
    except ImportError:
        return (bits.astype(np.uint32) << 16).view(np.float32)
    with warnings.catch_warnings():   # a file's read-only mapping: the packer only reads it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)


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


def direct_forward_args(hidden, topk_ids, topk_weights, hidden_size: int, top_k: int, max_tokens: int):
    """The arguments of the native forward_at for torch tensors that need no conversion and no
    check in C++ (plain CPU tensors, C-contiguous, [T, hidden_size] bf16/f32 hidden states,
    [T, top_k] int64 ids and f32 weights, T <= max_tokens), with the output allocated: (args, out).
    None for anything else, which takes the checked path (it converts, or says what is wrong).
    Exporting the four tensors through DLPack instead cost ~10 us per call warm and more cold."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    if type(hidden) is not tensor or type(topk_ids) is not tensor or type(topk_weights) is not tensor:
        return None
    dtype = hidden.dtype
    code = _KT_DTYPE_BF16 if dtype is torch.bfloat16 else _KT_DTYPE_F32 if dtype is torch.float32 else None
    if code is None or topk_ids.dtype is not torch.int64 or topk_weights.dtype is not torch.float32:
        return None
    if not (hidden.is_cpu and topk_ids.is_cpu and topk_weights.is_cpu):
        return None
    if not (hidden.is_contiguous() and topk_ids.is_contiguous() and topk_weights.is_contiguous()):
        return None
    shape = hidden.shape
    if len(shape) != 2 or shape[1] != hidden_size or shape[0] > max_tokens:
        return None
    tokens = shape[0]
    if topk_ids.shape != (tokens, top_k) or topk_weights.shape != (tokens, top_k):
        return None
    out = torch.empty((tokens, hidden_size), dtype=dtype)
    args = (hidden.data_ptr(), code, tokens, topk_ids.data_ptr(), topk_weights.data_ptr(), out.data_ptr(), code)
    return args, out
