"""kt-cuda: the GPU side of hybrid inference.

A layer's CPU experts driven from a CUDA stream (native/stream_bridge.h): KTMoEWrapper's
submit_forward / sync_forward on CUDA tensors enqueue device-to-host copies into pinned
staging, a host function that starts the forward on kt-core's pool, a host function that
waits for it and the copy back, so the Python thread never blocks, GPU work on other streams
overlaps the CPU experts, and the sequence can be captured in a CUDA graph and replayed.
kt-core finds this package through the entry point group `kt.device_bridges` and never
imports CUDA itself.

Importing kt_cuda needs no GPU (the CUDA runtime is linked statically); available() says
whether this host can use it and why not.
"""

from __future__ import annotations

__version__ = "0.1.0"

F32, BF16 = 0, 1   # kt_dtype codes (kt/plugin.h)


def _load_native():
    from . import _native as native
    return native


def available() -> tuple[bool, str]:
    """Whether kt-cuda can serve here, and why (not)."""
    try:
        native = _load_native()
    except ImportError as exc:
        return False, f"kt_cuda's native module does not load: {exc}"
    count, why = native.device_count()
    if count == 0:
        return False, f"the CUDA runtime finds no device ({why or 'none'})"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed (kt-cuda takes torch CUDA tensors and streams)"
    if not torch.cuda.is_available():
        return False, f"the CUDA runtime sees {count} device(s) but torch does not (a CPU build of torch?)"
    return True, f"{count} CUDA device(s), CUDA runtime {native.runtime_version()}"


def gpu_numa_node(device) -> int:
    """The NUMA node the GPU hangs off (sysfs, from its PCI address), where the bridge's pinned
    staging goes; -1 (first touch) where that is unknown or the machine has one node."""
    try:
        import torch
        p = torch.cuda.get_device_properties(device)
        address = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        with open(f"/sys/bus/pci/devices/{address}/numa_node") as f:
            return max(-1, int(f.read().strip()))
    except (ImportError, AttributeError, OSError, ValueError, RuntimeError, AssertionError):
        return -1


class Bridge:
    """The bridges of a process: one StreamBridge per (hidden size, top_k, dtype), shared by the
    layers of that shape (they run one after another on the stream), and the layers' output
    buffers per (token count, slot): slot = layer_idx % 2, as kt-kernel keeps them, so a
    layer's output stays valid while the next layer runs. Outputs are persistent: consume one
    before the layer two further on syncs the same token count."""

    def __init__(self):
        self._bridges: dict[tuple, object] = {}
        self._outputs: dict[tuple, object] = {}

    def available(self) -> tuple[bool, str]:
        return available()

    def _bridge(self, moe, dtype_code: int, capture_sizes, max_tokens: int, device=None):
        key = (moe.hidden_size, moe.top_k, dtype_code, max_tokens)
        if key not in self._bridges:
            from kt_core import _native as core
            ok, why = available()
            if not ok:
                raise RuntimeError(f"kt-cuda cannot serve here: {why}")
            self._bridges[key] = _load_native().StreamBridge(core.forward_api(), moe.hidden_size, moe.top_k, dtype_code,
                                                        list(capture_sizes), max_tokens, gpu_numa_node(device))
        return self._bridges[key]

    @staticmethod
    def _stream(torch, cuda_stream, device):
        if cuda_stream is None:
            return torch.cuda.current_stream(device)
        return torch.cuda.ExternalStream(int(cuda_stream), device=device)

    def submit(self, moe, hidden, topk_ids, topk_weights, cuda_stream, capture_sizes, max_tokens: int) -> None:
        import torch
        tokens = hidden.shape[0]
        dtype, code = (torch.float32, F32) if hidden.dtype == torch.float32 else (torch.bfloat16, BF16)
        stream = self._stream(torch, cuda_stream, hidden.device)
        with torch.cuda.stream(stream):   # conversions allocated on the stream that reads them
            h = hidden.reshape(tokens, moe.hidden_size).to(dtype).contiguous()
            ids = topk_ids.to(torch.int64).contiguous()
            w = topk_weights.to(torch.float32).contiguous()
            self._staged = (h, ids, w)     # alive until the next submit: the copies are enqueued before it
            if tokens:
                self._bridge(moe, code, capture_sizes, max_tokens, hidden.device).submit(stream.cuda_stream, moe.native_handle,
                                                                          h.data_ptr(), ids.data_ptr(), w.data_ptr(),
                                                                          tokens)

    def sync(self, moe, hidden, cuda_stream, slot: int, max_tokens: int):
        import torch
        tokens = hidden.shape[0]
        dtype, code = (torch.float32, F32) if hidden.dtype == torch.float32 else (torch.bfloat16, BF16)
        key = (tokens, moe.hidden_size, dtype, hidden.device, slot)
        out = self._outputs.get(key)
        if out is None:
            out = self._outputs[key] = torch.empty(tokens, moe.hidden_size, dtype=dtype, device=hidden.device)
        if tokens:
            stream = self._stream(torch, cuda_stream, hidden.device)
            bridge = self._bridges[(moe.hidden_size, moe.top_k, code, max_tokens)]
            bridge.sync(stream.cuda_stream, moe.native_handle, out.data_ptr(), tokens)
        return out if out.dtype == hidden.dtype else out.to(hidden.dtype)

    def pinned_bytes(self) -> int:
        return sum(b.pinned_bytes for b in self._bridges.values())


def bridge_provider() -> Bridge:
    """kt.device_bridges entry point: the process's bridge object."""
    global _PROVIDER
    if _PROVIDER is None:
        _PROVIDER = Bridge()
    return _PROVIDER


_PROVIDER: Bridge | None = None
