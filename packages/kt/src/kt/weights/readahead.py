"""Ask the kernel to start reading a batch of memory-mapped tensors from disk now.

Tensors from safetensors / GGUF files are views of file mappings: the first touch of each
page waits for the disk. The loader calls `readahead(next_batch)` before packing the current
batch, so with a cold page cache the disk reads the next experts while the CPUs pack these
(madvise MADV_WILLNEED starts the reads and returns at once). Harmless on memory that is not
file-backed; a no-op where madvise is unavailable.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap

_MADV_WILLNEED = 3
_PAGE = mmap.PAGESIZE


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def _ranges(obj, out: list) -> None:
    if obj is None:
        return
    if isinstance(obj, (tuple, list)):
        for x in obj:
            _ranges(x, out)
        return
    if hasattr(obj, "data_ptr"):                      # torch
        out.append((obj.data_ptr(), obj.numel() * obj.element_size()))
    elif hasattr(obj, "__array_interface__"):         # NumPy
        out.append((obj.__array_interface__["data"][0], obj.nbytes))


def readahead(batch: dict) -> None:
    """Start reading every tensor of {slot: weights tuple} (best effort)."""
    if _LIBC is None:
        return
    ranges: list[tuple[int, int]] = []
    for weights in batch.values():
        _ranges(weights, ranges)
    for ptr, size in ranges:
        if size <= 0:
            continue
        start = ptr - ptr % _PAGE
        _LIBC.madvise(start, ptr + size - start, _MADV_WILLNEED)
