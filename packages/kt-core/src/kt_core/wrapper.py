"""KTMoEWrapper — kt-kernel 0.7.2's wrapper API, on kt-core. (mode="sft" returns kt_core.sft's
training wrapper, as kt-kernel's factory does.)

Same constructor arguments, same methods, so SGLang-style callers switch by changing the
import (the `kt_kernel` import name itself is the kt-kernel-compat package's). Semantics as
kt-kernel's: every expert is held on the CPU and `gpu_experts_mask` (a bool tensor whose
in-place updates take effect on the next forward) says which the GPU computes; deferred
experts are added into the next layer's output; capture batch sizes are class-level.
Differences, all deliberate:
 - works with a CPU-only torch (kt-kernel asks for pinned memory and cannot even be built);
 - the method names a weight format; the backend comes from the hardware (AMXINT8 on a CPU
   without AMX runs on the best backend that has INT8, with a notice);
 - load_weights_from_tensors works for every method and writes nothing to weight_path;
 - a deferred output that no next layer collects is an error, not a silently lost sum.
"""

from __future__ import annotations

import logging
import warnings
from typing import ClassVar

import numpy as np

from . import _arrays, _native, device_bridge, pool
from .backends.selection import canonical_method
from .errors import KTError
from .host import host
from .hybrid import select_deferred_experts
from .moe import MoE
from .weight_source import has_weight_source, weight_source

log = logging.getLogger("kt_core")


def _bool_mask(values, like=None):
    """A CPU bool tensor (torch installed) or NumPy array: the wrapper's own copy, which
    callers update in place (`copy_` / `[:] =`)."""
    flags = np.array([bool(x) for x in values], dtype=bool)
    try:
        import torch
    except ImportError:
        return flags
    return torch.from_numpy(flags.copy())


def _mask_bytes(mask) -> bytes:
    return (mask.detach().cpu().numpy() if _arrays.is_torch(mask) else np.asarray(mask, dtype=bool)).tobytes()


def _add(out, carry):
    """out + carry, summed in f32 and returned in out's dtype (kt-kernel adds a deferred output
    into the next layer's f32 accumulation)."""
    if _arrays.is_torch(out):
        return (out.float() + carry.to(out.device).float()).to(out.dtype)
    return (np.asarray(out, np.float32) + np.asarray(carry, np.float32)).astype(out.dtype)


class KTMoEWrapper:
    # kt-kernel's class-level state: the CUDA-graph capture sizes (token counts) SGLang's
    # cuda_graph_runner sets before any layer exists, and the layers whose deferred experts are
    # still on the pool, by layer_idx, for the next layer to collect.
    _capture_batch_sizes: ClassVar[list[int]] = []
    _deferred: ClassVar[dict[int, KTMoEWrapper]] = {}

    def __new__(cls, *args, **kwargs):
        # kt-kernel's KTMoEWrapper is a factory: mode="sft" (the 15th argument) gives its SFT wrapper.
        mode = kwargs.get("mode", args[14] if len(args) > 14 else "inference")
        if mode == "sft":
            from .sft import SFTMoEWrapper

            return SFTMoEWrapper(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, layer_idx: int, num_experts: int, num_experts_per_tok: int, hidden_size: int,
                 moe_intermediate_size: int, gpu_experts_mask=None, cpuinfer_threads: int | None = None,
                 threadpool_count: int = 1, weight_path: str | None = None, chunked_prefill_size: int = 4096,
                 cpu_save: bool = False, max_deferred_experts_per_token: int | None = None, method: str = "AMXINT4",
                 numa_nodes=None, mode: str = "inference", *, num_gpu_experts: int | None = None,
                 swiglu_limit: float = 0.0, swiglu_alpha: float = 0.0, backend: str | None = None,
                 group_size: int = 0, zero_point: bool = False, fast_activations: bool | None = None,
                 cpu_copy_of_gpu_experts: bool = True, **unused):
        self.layer_idx = int(layer_idx)
        self.num_experts = int(num_experts)
        self.num_experts_per_tok = int(num_experts_per_tok)
        self.hidden_size = int(hidden_size)
        self.moe_intermediate_size = int(moe_intermediate_size)
        self.weight_path = weight_path
        self.chunked_prefill_size = int(chunked_prefill_size)
        self.cpu_save = bool(cpu_save)
        self.method = str(method).upper()
        self.numa_nodes = numa_nodes
        self.swiglu_limit, self.swiglu_alpha = float(swiglu_limit or 0.0), float(swiglu_alpha or 0.0)
        self._refuse_unsupported(mode, threadpool_count)
        defer = int(max_deferred_experts_per_token or 0)
        if not 0 <= defer <= self.num_experts_per_tok:
            raise ValueError(f"max_deferred_experts_per_token must be in [0, num_experts_per_tok="
                             f"{self.num_experts_per_tok}], got {max_deferred_experts_per_token}")
        self.max_deferred_experts_per_token = defer
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
            if len(mask) != self.num_experts:
                raise ValueError(f"gpu_experts_mask has {len(mask)} entries, expected num_experts={self.num_experts}")
        else:
            mask = [False] * self.num_experts
        self.gpu_experts_mask = _bool_mask(mask)
        self.num_gpu_experts = sum(mask)

        stored = self._stored_settings()
        group_size = group_size or stored.get("group_size", 0)
        zero_point = zero_point or stored.get("zero_point", False)
        # A checkpoint whose experts clamp their activation (GPT-OSS with its biases, DeepSeek-V4, Step-3.5's
        # limit after SiLU, which kt-kernel's API cannot say) fixes the layer's activation too; a caller's
        # other swiglu values are kept, and the load refuses them naming the checkpoint's.
        self.swiglu_limit_after_act = False
        if "swiglu_limit" in stored:
            if not (self.swiglu_limit or self.swiglu_alpha):
                self.swiglu_limit, self.swiglu_alpha = stored["swiglu_limit"], stored["swiglu_alpha"]
            if (self.swiglu_limit, self.swiglu_alpha) == (stored["swiglu_limit"], stored["swiglu_alpha"]):
                self.swiglu_limit_after_act = bool(stored.get("swiglu_limit_after_act"))
        # Gemma 4's GELU-tanh experts: kt-kernel's API has no word for it either; the folder says it.
        self.gate_activation = stored.get("gate_activation", "silu")
        self._configure_pool(cpuinfer_threads, threadpool_count)
        # kt-kernel holds every expert on the CPU, so a mask update can move any expert here;
        # cpu_copy_of_gpu_experts=False saves that memory and fixes the CPU's set at construction.
        self._moe = MoE(num_experts=self.num_experts, top_k=self.num_experts_per_tok, hidden_size=self.hidden_size,
                        intermediate_size=self.moe_intermediate_size, method=self.method,
                        gpu_experts_mask=None if cpu_copy_of_gpu_experts else mask,
                        max_tokens=self.chunked_prefill_size, backend=backend, group_size=group_size,
                        zero_point=zero_point, fast_activations=fast_activations,
                        weight_types=stored.get("weight_types"), pool_groups=self._pool_groups(),
                        swiglu_limit=self.swiglu_limit, swiglu_alpha=self.swiglu_alpha,
                        swiglu_limit_after_act=self.swiglu_limit_after_act, expert_bias=bool(stored.get("expert_bias")),
                        gate_activation=self.gate_activation)
        self._applied_mask = b""
        self._apply_mask()
        requested = canonical_method(self.method)
        if self.method.startswith("AMX") and "amx_tile" not in host().features:
            log.info("method %s runs as %s on %s: this CPU has no usable AMX", self.method, requested, self._moe.backend)
        self._bridge = None           # the device bridge of the submitted forward (kt-cuda), if any
        self._write_job = None        # (thread, outcome) of submit_write_weight_scale_to_buffer
        self._carry = None            # the previous layer's deferred output, added at sync
        self._deferred_job = None     # (hidden, deferred ids, weights) to submit after sync

    def _refuse_unsupported(self, mode: str, threadpool_count) -> None:
        """kt-kernel arguments kt cannot honour yet: refused by name, never computed wrongly."""
        if mode != "inference":
            raise ValueError(f"Unknown mode: {mode!r}. Supported modes: 'inference', 'sft'")
        if self.numa_nodes is not None and len(self.numa_nodes) != int(threadpool_count or 1):
            raise ValueError(f"numa_nodes lists {len(self.numa_nodes)} nodes; it must list one per thread pool "
                             f"(threadpool_count={threadpool_count})")

    def _pool_groups(self):
        """numa_nodes as the pool groups this layer's experts live and run on: the groups on those
        NUMA nodes, or, in a pool of virtual groups (KT_VIRTUAL_NUMA), those group indices."""
        if self.numa_nodes is None:
            return None
        nodes = [int(n) for n in self.numa_nodes]
        info = pool.info()
        if info.virtual_numa:
            bad = [n for n in nodes if not 0 <= n < len(info.groups)]
            if bad:
                raise KTError(f"numa_nodes={nodes}: kt's pool has {len(info.groups)} virtual groups "
                              f"(KT_VIRTUAL_NUMA), numbered 0..{len(info.groups) - 1}")
            return nodes
        groups = [g for g, (node, _) in enumerate(info.groups) if node in nodes]
        missing = sorted(set(nodes) - {node for node, _ in info.groups})
        if missing:
            raise KTError(f"numa_nodes={nodes}: kt's pool has no threads on NUMA node(s) {missing}; its groups are on "
                          f"node(s) {sorted({node for node, _ in info.groups})}")
        return groups

    def _stored_settings(self) -> dict:
        """Settings the files at weight_path fix: a kt converted folder's INT4 group and zero point
        (a conflicting choice is refused at load, naming both), a GGUF layer's ggml types, a model
        folder's expert biases and clamped SwiGLU (GPT-OSS)."""
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
        (BF16 / FP8 / RAWINT4 / GPTQ_INT4 / NVFP4 / MXFP8 as stored; INT8 / INT4 quantized at load
        when cpu_save=True), a `kt convert` folder (INT8 / INT4) or a folder kt-kernel quantized
        (AMXINT8 / AMXINT4). GGUF files arrive with the LLAMAFILE method."""
        if not self.weight_path:
            raise KTError("load_weights() reads experts from weight_path, and this KTMoEWrapper has none; pass "
                          "weight_path= (a model folder or a kt converted folder) or use load_weights_from_tensors()")
        weight_source().load_layer(self._moe, self.weight_path, self.layer_idx, physical_to_logical_map_cpu,
                   quantize_at_load=self.cpu_save)

    # -- GPU experts ----------------------------------------------------------------------
    def _apply_mask(self) -> None:
        """Hands gpu_experts_mask to the layer when it changed since the last forward."""
        now = _mask_bytes(self.gpu_experts_mask)
        if now == self._applied_mask:
            return
        if len(now) != self.num_experts:
            raise ValueError(f"gpu_experts_mask now has {len(now)} entries, expected num_experts={self.num_experts}")
        self._moe.set_gpu_experts_mask([bool(b) for b in now])
        self._applied_mask = now

    # -- forward --------------------------------------------------------------------------
    def forward(self, hidden_states, topk_ids, topk_weights, cuda_stream=None):
        self.submit_forward(hidden_states, topk_ids, topk_weights, cuda_stream)
        return self.sync_forward(hidden_states, cuda_stream)

    def _bridge_for(self, hidden_states):
        """The device bridge (kt-cuda) for CUDA tensors, when installed and usable here. Layers
        that defer experts take the synchronous path: their deferred part is not stream-ordered."""
        if not _arrays.is_torch(hidden_states) or hidden_states.device.type == "cpu":
            return None
        bridge = device_bridge.provider(hidden_states.device.type)
        if bridge is not None and self.max_deferred_experts_per_token:
            log.info("layer %d defers experts: its forwards copy to the CPU synchronously (the %s bridge does not "
                     "order deferred experts on the stream)", self.layer_idx, hidden_states.device.type)
            return None
        return bridge

    def submit_forward(self, hidden_states, topk_ids, topk_weights, cuda_stream=None) -> None:
        """Start this layer's forward on the pool. With max_deferred_experts_per_token, the
        picks select_deferred_experts defers run after sync_forward returns, and their output
        is added into the next layer's. CUDA tensors go through kt-cuda where it is installed:
        stream-ordered on cuda_stream (default: the current stream), nothing blocks."""
        self._apply_mask()
        self._bridge = self._bridge_for(hidden_states)
        if self._bridge is not None:
            self._bridge.submit(self._moe, hidden_states, topk_ids, topk_weights, cuda_stream,
                                KTMoEWrapper._capture_batch_sizes, self.chunked_prefill_size)
            return
        self._carry = self._collect_deferred()
        ids, self._deferred_job = topk_ids, None
        if self.max_deferred_experts_per_token:
            protected = self.num_experts_per_tok - self.max_deferred_experts_per_token
            ids, deferred = select_deferred_experts(topk_ids, topk_weights, protected)
            # Copies: the caller may overwrite its buffers before the deferred forward runs. In
            # f32, so the deferred sum is rounded once, when added into the next layer's output.
            self._deferred_job = (_arrays.cpu_copy_f32(hidden_states), deferred, _arrays.cpu_copy_f32(topk_weights))
        self._moe.submit(hidden_states, ids, topk_weights)

    def sync_forward(self, hidden_states=None, cuda_stream=None):
        """This layer's output (plus the previous layer's deferred experts); then starts this
        layer's deferred experts on the pool. Through kt-cuda: a persistent device buffer, valid
        until the layer two further on syncs as many tokens (kt-kernel's slots)."""
        if self._bridge is not None:
            return self._bridge.sync(self._moe, hidden_states, cuda_stream, self.layer_idx % 2,
                                     self.chunked_prefill_size)
        out = self._moe.sync()
        if self._carry is not None:
            out, self._carry = _add(out, self._carry), None
        if self._deferred_job is not None:
            hidden, ids, weights = self._deferred_job
            self._deferred_job = None
            self._moe.submit(hidden, ids, weights)
            KTMoEWrapper._deferred[self.layer_idx] = self
        return out

    def _collect_deferred(self):
        """The deferred output of layer layer_idx - 1, waited for; None if it deferred nothing.
        Any other layer's deferred output has lost its consumer: an error naming it."""
        pending = KTMoEWrapper._deferred
        if not pending:
            return None
        previous = pending.pop(self.layer_idx - 1, None)
        result = previous._moe.sync() if previous is not None else None
        if pending:
            lost = sorted(pending)
            for layer in lost:
                pending.pop(layer)._moe.sync()
            raise KTError(f"layer {lost[0]} deferred experts into layer {lost[0] + 1}, but layer {self.layer_idx} ran "
                          "next, so their output was dropped; set max_deferred_experts_per_token=0 on the last MoE "
                          "layer and on layers whose next layer is not a KTMoEWrapper")
        return result

    def select_deferred_experts(self, expert_ids, expert_scores, protected_k: int):
        return select_deferred_experts(expert_ids, expert_scores, protected_k)

    # -- layerwise prefill: an expert's weights for the GPU -----------------------------------
    def submit_write_weight_scale_to_buffer(self, gpu_tp_count: int, expert_id: int, w13_weight_ptrs,
                                            w13_scale_ptrs, w2_weight_ptrs, w2_scale_ptrs) -> None:
        """Start writing logical expert `expert_id` of this layer, as the checkpoint stores it
        (BF16, FP8, RAWINT4), into each GPU rank's host buffers in SGLang's tensor-parallel
        layout (kt.weights.gpu_buffers says which); sync_write_weight_scale_to_buffer() waits.
        Read from weight_path, off the calling thread."""
        import threading

        if self._write_job is not None:
            raise RuntimeError("a weight write is in flight; call sync_write_weight_scale_to_buffer() first")
        if not self.weight_path:
            raise KTError("submit_write_weight_scale_to_buffer reads the expert from weight_path, and this "
                          "KTMoEWrapper has none")
        if not 0 <= int(expert_id) < self.num_experts:
            raise ValueError(f"expert_id {expert_id} is outside [0, {self.num_experts})")
        source = weight_source()
        if not hasattr(source, "write_expert_for_gpu"):
            raise KTError("the installed weight source cannot write experts for the GPU; upgrade kt")
        args = (self.weight_path, self.layer_idx, int(expert_id), canonical_method(self.method),
                self.moe_intermediate_size, int(gpu_tp_count), list(w13_weight_ptrs), list(w13_scale_ptrs),
                list(w2_weight_ptrs), list(w2_scale_ptrs))
        outcome: list[BaseException] = []

        def write():
            try:
                source.write_expert_for_gpu(*args)
            except BaseException as exc:   # handed to sync_write_weight_scale_to_buffer
                outcome.append(exc)

        thread = threading.Thread(target=write, name=f"kt-write-expert-{self.layer_idx}-{expert_id}", daemon=True)
        thread.start()
        self._write_job = (thread, outcome)

    def sync_write_weight_scale_to_buffer(self) -> None:
        """Wait for the write submit_write_weight_scale_to_buffer started; its error is raised here."""
        if self._write_job is None:
            return
        (thread, outcome), self._write_job = self._write_job, None
        thread.join()
        if outcome:
            raise outcome[0]

    # -- kt-kernel's buffer management ----------------------------------------------------
    @staticmethod
    def set_capture_batch_sizes(capture_bs) -> None:
        """The token counts CUDA graphs are captured for (class-level, as SGLang calls it before
        any layer exists); kt-cuda keeps pinned staging buffers of each size."""
        sizes = sorted({int(s) for s in capture_bs})
        if any(s <= 0 for s in sizes):
            raise ValueError(f"capture batch sizes must be positive token counts, got {sizes}")
        KTMoEWrapper._capture_batch_sizes = sizes

    @staticmethod
    def get_capture_batch_sizes() -> list[int]:
        return list(KTMoEWrapper._capture_batch_sizes)

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
