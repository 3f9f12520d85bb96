"""KTMoEWrapper — kt-kernel 0.7.2's wrapper API, on kt-core.

Same constructor arguments, same methods, so SGLang-style callers switch by changing the
import. Differences, all deliberate:
 - works with a CPU-only torch (kt-kernel asks for pinned memory and cannot even be built);
 - the method names a weight format; the backend comes from the hardware (AMXINT8 on a CPU
   without AMX runs on the best backend that has INT8, with a notice);
 - load_weights_from_tensors works for every method and writes nothing to weight_path.
"""

from __future__ import annotations

import logging
import warnings

from . import _native, pool
from .backends.selection import canonical_method
from .errors import KTError
from .host import host
from .moe import MoE
from .weight_source import has_weight_source, weight_source

log = logging.getLogger("kt_core")


class KTMoEWrapper:
    def __init__(self, layer_idx: int, num_experts: int, num_experts_per_tok: int, hidden_size: int,
                 moe_intermediate_size: int, gpu_experts_mask=None, cpuinfer_threads: int | None = None,
                 threadpool_count: int = 1, weight_path: str | None = None, chunked_prefill_size: int = 4096,
                 cpu_save: bool = False, max_deferred_experts_per_token: int | None = None, method: str = "AMXINT4",
                 numa_nodes=None, *, num_gpu_experts: int | None = None, backend: str | None = None,
                 group_size: int = 0, zero_point: bool = False, fast_activations: bool = False, **unused):
        self.layer_idx = int(layer_idx)
        self.num_experts = int(num_experts)
        self.num_experts_per_tok = int(num_experts_per_tok)
        self.hidden_size = int(hidden_size)
        self.moe_intermediate_size = int(moe_intermediate_size)
        self.weight_path = weight_path
        self.chunked_prefill_size = int(chunked_prefill_size)
        self.cpu_save = bool(cpu_save)
        self.max_deferred_experts_per_token = max_deferred_experts_per_token
        self.method = str(method).upper()
        self.numa_nodes = numa_nodes
        if unused:
            log.debug("KTMoEWrapper ignores kt-kernel arguments it has no use for: %s", sorted(unused))

        if gpu_experts_mask is not None and num_gpu_experts is not None:
            raise ValueError("pass either gpu_experts_mask or num_gpu_experts, not both")
        if num_gpu_experts is not None:
            if not 0 <= num_gpu_experts <= self.num_experts:
                raise ValueError(f"num_gpu_experts must be in [0, {self.num_experts}], got {num_gpu_experts}")
            mask = [i < num_gpu_experts for i in range(self.num_experts)]
        elif gpu_experts_mask is not None:
            raw = gpu_experts_mask.cpu().tolist() if hasattr(gpu_experts_mask, "cpu") else list(gpu_experts_mask)
            mask = [bool(x) for x in raw]
        else:
            mask = [False] * self.num_experts
        self.gpu_experts_mask = mask

        stored = self._stored_settings()
        group_size = group_size or stored.get("group_size", 0)
        zero_point = zero_point or stored.get("zero_point", False)
        self._configure_pool(cpuinfer_threads, threadpool_count)
        self._moe = MoE(num_experts=self.num_experts, top_k=self.num_experts_per_tok, hidden_size=self.hidden_size,
                        intermediate_size=self.moe_intermediate_size, method=self.method, gpu_experts_mask=mask,
                        max_tokens=self.chunked_prefill_size, backend=backend, group_size=group_size,
                        zero_point=zero_point, fast_activations=fast_activations,
                        weight_types=stored.get("weight_types"))
        requested = canonical_method(self.method)
        if self.method.startswith("AMX") and "amx_tile" not in host().features:
            log.info("method %s runs as %s on %s: this CPU has no usable AMX", self.method, requested, self._moe.backend)
        self._capture_batch_sizes: list[int] = []

    def _stored_settings(self) -> dict:
        """Settings the files at weight_path fix: a kt converted folder's INT4 group and zero point
        (a conflicting choice is refused at load, naming both), a GGUF layer's ggml types."""
        if canonical_method(self.method) == "LLAMAFILE" and not self.weight_path:
            raise KTError("method LLAMAFILE reads its experts from a GGUF file: pass weight_path= (a .gguf file, one "
                          "file of a split set, or their folder)")
        if not self.weight_path:
            return {}
        if canonical_method(self.method) != "LLAMAFILE" and not has_weight_source():
            return {}     # kt-kernel passes weight_path even to layers loaded from tensors; load_weights() explains
        return weight_source().layer_settings(self.weight_path, self.layer_idx, canonical_method(self.method))

    @staticmethod
    def _configure_pool(cpuinfer_threads, threadpool_count) -> None:
        # One pool per process, as in kt-kernel: the first wrapper's settings win.
        threads = int(cpuinfer_threads or 0)
        groups = int(threadpool_count or 1)
        real_nodes = len(host().numa_nodes)
        virtual = groups if groups != real_nodes and groups > 1 else 0
        if not _native.pool_exists():
            pool.configure(threads, virtual)
            return
        info = pool.info()
        if (threads and threads != info.num_threads) or (virtual and virtual != len(info.groups)):
            warnings.warn(f"kt thread pool already exists with {info.num_threads} threads in {len(info.groups)} "
                          f"groups; cpuinfer_threads={cpuinfer_threads}, threadpool_count={threadpool_count} ignored "
                          "(the first KTMoEWrapper of a process configures the pool)", stacklevel=3)

    # -- weights --------------------------------------------------------------------------
    def load_weights_from_tensors(self, gate_proj, up_proj, down_proj, physical_to_logical_map_cpu=None) -> None:
        """gate_proj/up_proj [E, I, H], down_proj [E, H, I], any float dtype; quantized (or
        copied) into this method's packed layout. Nothing is written to weight_path."""
        self._moe.load(gate_proj, up_proj, down_proj, physical_to_logical_map_cpu)

    def load_weights(self, physical_to_logical_map_cpu=None) -> None:
        """Load layer `layer_idx`'s experts from weight_path: a Hugging Face model folder
        (BF16 / FP8 / RAWINT4 as stored; INT8 / INT4 quantized at load when cpu_save=True) or
        a `kt convert` folder (INT8 / INT4). GGUF files arrive with the LLAMAFILE method."""
        if not self.weight_path:
            raise KTError("load_weights() reads experts from weight_path, and this KTMoEWrapper has none; pass "
                          "weight_path= (a model folder or a kt converted folder) or use load_weights_from_tensors()")
        weight_source().load_layer(self._moe, self.weight_path, self.layer_idx, physical_to_logical_map_cpu,
                   quantize_at_load=self.cpu_save)

    # -- forward --------------------------------------------------------------------------
    def forward(self, hidden_states, topk_ids, topk_weights, cuda_stream=None):
        return self._moe.forward(hidden_states, topk_ids, topk_weights)

    def submit_forward(self, hidden_states, topk_ids, topk_weights, cuda_stream=None) -> None:
        self._moe.submit(hidden_states, topk_ids, topk_weights)

    def sync_forward(self, hidden_states=None, cuda_stream=None):
        return self._moe.sync()

    # -- kt-kernel's buffer management ----------------------------------------------------
    def set_capture_batch_sizes(self, sizes) -> None:
        sizes = sorted({int(s) for s in sizes})
        if any(s <= 0 or s > self.chunked_prefill_size for s in sizes):
            raise ValueError(f"capture batch sizes must be in [1, {self.chunked_prefill_size}], got {sizes}")
        self._capture_batch_sizes = sizes

    def get_capture_batch_sizes(self) -> list[int]:
        return list(self._capture_batch_sizes)

    @staticmethod
    def clear_buffer_cache() -> None:
        _native.clear_forward_scratch()

    # -- introspection ----------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self._moe.backend

    def __repr__(self) -> str:
        return (f"KTMoEWrapper(layer_idx={self.layer_idx}, experts={self.num_experts}, top_k={self.num_experts_per_tok}, "
                f"hidden={self.hidden_size}, intermediate={self.moe_intermediate_size}, method={self.method}, "
                f"backend={self.backend}, layout={self._moe.layout_id}"
                + (f", group_size={self._moe.group_size}" if self._moe.group_size else "") + ")")
