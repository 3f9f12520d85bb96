"""kt_core.MoE — one MoE layer's routed experts on the CPU (the native-style API).

    layer = kt_core.MoE(num_experts=64, top_k=8, hidden_size=2048, intermediate_size=768, method="BF16")
    layer.load(gate, up, down)            # [E, I, H], [E, I, H], [E, H, I]; torch or NumPy
    out = layer(hidden, topk_ids, topk_weights)

Tensors may be torch (any float dtype, CPU or not) or NumPy; they cross into C++ through DLPack, or as
addresses when they are CPU torch tensors already in the kernels' dtypes and layout (_arrays.direct_forward_args).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np

from . import _arrays, _native, pool
from .backends.selection import canonical_method, selector
from .errors import BackendError, WeightsError
from .formats.codes import int4_group_for
from .formats.ggml import FLOAT_TYPES, STORED_TYPES, ggml_type, stored_method

log = logging.getLogger("kt_core")


class MoE:
    def __init__(self, *, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 method: str = "BF16", gpu_experts_mask: Sequence[bool] | None = None, max_tokens: int = 4096,
                 backend: str | None = None, group_size: int = 0, zero_point: bool = False,
                 fast_activations: bool | None = None, weight_types: Sequence[str] | None = None,
                 pool_groups: Sequence[int] | None = None, swiglu_limit: float = 0.0, swiglu_alpha: float = 0.0,
                 expert_bias: bool = False, trainable: bool = False, swiglu_limit_after_act: bool = False,
                 gate_activation: str = "silu"):
        for name, value in (("num_experts", num_experts), ("top_k", top_k), ("hidden_size", hidden_size),
                            ("intermediate_size", intermediate_size), ("max_tokens", max_tokens)):
            if int(value) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        if top_k > num_experts:
            raise ValueError(f"top_k ({top_k}) cannot exceed num_experts ({num_experts})")
        self.num_experts, self.top_k = int(num_experts), int(top_k)
        self.hidden_size, self.intermediate_size = int(hidden_size), int(intermediate_size)
        self.max_tokens = int(max_tokens)
        self.method = canonical_method(method)
        if group_size < 0:
            raise ValueError(f"group_size must be >= 0 (0 = the method's default), got {group_size}")
        self.group_size, self.zero_point = int(group_size), bool(zero_point)
        if self.method == "INT4" and not self.group_size:
            self.group_size = int4_group_for(self.hidden_size, self.intermediate_size)
            if self.group_size != 128:
                log.info("INT4 layer %dx%d: group size %d, the largest of 128/64/32 dividing both", self.hidden_size,
                         self.intermediate_size, self.group_size)
        # The clamped SwiGLU of GPT-OSS / DeepSeek-V4 instead of SiLU(gate) * up (kt/plugin.h); with
        # swiglu_limit_after_act the limit clamps SiLU(gate) rather than gate (Step-3.5, Ling-2.5:
        # min(SiLU(g), limit) * clamp(u, -limit, limit)), which kt-core applies to the kernels' raw
        # gate/up products itself, as it adds biases.
        self.swiglu_limit, self.swiglu_alpha = float(swiglu_limit), float(swiglu_alpha)
        self.swiglu_limit_after_act = bool(swiglu_limit_after_act)   # checked with the others by _native
        # What the gate goes through: "silu" (the kernels') or "gelu_tanh" (Gemma 4's experts: GELU's
        # tanh form, torch's gelu(approximate="tanh")), which kt-core applies to the raw products too.
        self.gate_activation = gate_activation   # checked with the swiglu settings by _native
        # Experts with gate/up/down biases (GPT-OSS): kt-core adds them around the kernels' raw
        # gate/up products (plugin ABI 1.4); `load(..., biases=...)` gives them.
        self.expert_bias = bool(expert_bias)
        # A layer that training runs through (kt.training): its kernels must have the raw gate/up
        # and the transposed tiles (plugin ABI 1.4, 1.5) that the grouped_* products use.
        self.trainable = bool(trainable)
        mask = [False] * self.num_experts if gpu_experts_mask is None else [bool(x) for x in list(gpu_experts_mask)]
        if len(mask) != self.num_experts:
            raise ValueError(f"gpu_experts_mask has {len(mask)} entries, expected num_experts={self.num_experts}")
        # The experts this layer holds on the CPU (fixed); which of them forwards compute can
        # change at run time (set_gpu_experts_mask).
        self.held_on_cpu = tuple(not g for g in mask)
        self.gpu_experts_mask = tuple(mask)
        self.weight_types = self._weight_types(weight_types)
        # The method whose kernels run this layer: its own, except GGUF experts of plain floats,
        # which run on their float method's kernels (BF16 GGUF files: formats/ggml.py).
        self.kernel_method = (stored_method(self.weight_types) if self.weight_types else None) or self.method
        # Integer kernels quantize activations in two int8 passes (~1e-3 of the output RMS) and
        # split-bf16 kernels (BF16, FP8) carry a low half; fast_activations=True allows one int8
        # pass (kt-kernel's choice: faster prefill) or bf16 alone (~1.5e-2). None (the default)
        # is two passes, except on GGUF blocks (LLAMAFILE) and BF16 files: there one pass carries
        # exactly the activations llama.cpp dots each type against, Q8_K, Q8_0 or bf16
        # (docs/formats.md). GGUF MXFP4 (GPT-OSS) runs MXFP4's kernels, whose one pass (an int8
        # plane per row) is coarser than the Q8_0 blocks llama.cpp dots it against: it keeps two.
        if fast_activations is None:
            fast_activations = bool(self.weight_types) and self.kernel_method != "MXFP4"
        self.fast_activations = bool(fast_activations)
        pool.ensure()
        shape = (self.hidden_size, self.intermediate_size, self.num_experts, self.top_k)
        sel = selector()
        if backend is None:
            self.candidate, native = sel.choose(self.kernel_method, shape, self.max_tokens,
                                                needs_raw_gate_up=self.raw_gate_up, needs_transposed=self.trainable)
        else:
            choices = [c for c in sel.ranked(self.kernel_method) if c.backend == backend]
            if not choices:
                own = [c for c in sel.candidates if c.backend == backend]
                provides = ", ".join(sorted({m for c in own for m in c.methods})) or "nothing (not installed)"
                why = "; ".join(f"{c.variant}: {c.reason}" for c in own if not c.runnable)
                raise BackendError(f"backend {backend!r} cannot run method {self.kernel_method} here; it provides {provides}"
                                   + (f" ({why})" if why else "") + "; see `kt backends`")
            self.candidate, native = choices[0], sel.load(choices[0])
        if self.trainable and not any(m["method"] == self.kernel_method and m["raw_gate_up"] and m["transposed"]
                                      for m in native.methods):
            raise BackendError(f"backend {self.candidate.backend}/{self.candidate.variant} has no transposed tiles "
                               f"(plugin ABI 1.5) for method {self.kernel_method}, which trainable=True needs; the reference "
                               "backend has them for every method, kt-backend-avx for BF16, INT8, the INT4 family (MXFP4 and "
                               "NVFP4 included) and the FP8 family; not LLAMAFILE's ggml types")
        if self.kernel_method == "LLAMAFILE":
            self._check_ggml_support(sel)
        self.packer_candidate, packer = self._borrowed_packer(sel, native)
        self._layer = _native.MoeLayer(native, self.kernel_method, self.hidden_size, self.intermediate_size,
                                       self.num_experts, self.top_k, [not g for g in mask], self.max_tokens,
                                       self.group_size, self.zero_point, self.fast_activations,
                                       self._ggml_dtypes(), self.swiglu_limit,
                                       self.swiglu_alpha, packer, self.expert_bias, self.swiglu_limit_after_act,
                                       self.gate_activation)
        if pool_groups is not None:   # the groups (NUMA nodes) this layer's experts live and run on
            self._layer.set_groups([int(g) for g in pool_groups])
        self.small_batch_candidate = self._attach_small_batch_kernels(sel, native, shape)
        self._pending = None
        self._training_biases = None

    def _borrowed_packer(self, sel, native):
        """Kernels that compute on another backend's layout and pack nothing (plugin ABI 1.3, e.g.
        kt-backend-blis on kt-backend-avx's layouts) get the best runnable variant that packs it."""
        mine = next(m for m in native.methods if m["method"] == self.kernel_method)
        if mine["packs"]:
            return None, None
        for c in sel.ranked(self.kernel_method):
            if (c.backend, c.variant) == (self.candidate.backend, self.candidate.variant):
                continue
            try:
                other = sel.load(c)
            except BackendError:
                continue
            if any(m["method"] == self.kernel_method and m["layout_id"] == mine["layout_id"] and m["packs"]
                   for m in other.methods):
                return c, other
        raise BackendError(f"{self.candidate.backend}/{self.candidate.variant} computes method {self.kernel_method} on layout "
                           f"{mine['layout_id']} but packs nothing itself, and no runnable backend here packs that "
                           f"layout (kt-backend-avx does); see `kt backends`")

    def _attach_small_batch_kernels(self, sel, native, shape):
        """A kernel that declines decode-sized batches (a matrix engine) gets the best other
        variant that reads the same packed layout for them, so one copy of the weights serves
        both; without one, the declining kernel runs small batches itself."""
        if not native.declines(self.kernel_method, *shape, 1):
            return None
        layout = self._layer.layout_id
        for c in sel.ranked(self.kernel_method):
            if (c.backend, c.variant) == (self.candidate.backend, self.candidate.variant):
                continue
            try:
                other = sel.load(c)
            except BackendError:
                continue
            same = any(m["method"] == self.kernel_method and m["layout_id"] == layout
                       and (m["raw_gate_up"] or not self.raw_gate_up) for m in other.methods)
            if same and not other.declines(self.kernel_method, *shape, 1):
                self._layer.set_small_batch_backend(other, self.kernel_method)
                return c
        return None

    def kernel_id_for(self, tokens: int) -> str:
        """The kernel a forward of `tokens` tokens runs (small batches may go to another variant)."""
        return self._layer.kernel_id_for(int(tokens))

    def _weight_types(self, weight_types) -> tuple[str, ...]:
        """LLAMAFILE's ggml types of (gate, up, down); every other method stores one format."""
        if self.method != "LLAMAFILE":
            if weight_types is not None:
                raise ValueError(f"weight_types names the ggml types of method LLAMAFILE; method {self.method} "
                                 "has none")
            return ()
        if weight_types is None or len(weight_types) != 3:
            raise ValueError("method LLAMAFILE needs weight_types=(gate, up, down), their ggml types such as "
                             "('Q4_K', 'Q4_K', 'Q6_K'); KTMoEWrapper and kt.gguf read them from the GGUF file")
        names = tuple(str(t).upper() if str(t).upper() in STORED_TYPES else ggml_type(t).name for t in weight_types)
        for name, t in zip(("gate", "up", "down"), names):
            if t in STORED_TYPES:
                continue
            k = self.intermediate_size if name == "down" else self.hidden_size
            block = ggml_type(t).block_elems
            if k % block:
                raise ValueError(f"{name} is {t}, whose blocks hold {block} elements along K; K = {k} "
                                 f"({'intermediate' if name == 'down' else 'hidden'}) is not a multiple of {block}")
        return names

    def _ggml_dtypes(self) -> list[int]:
        return [ggml_type(t).kt_dtype for t in self.weight_types] if self.kernel_method == "LLAMAFILE" else []

    def _check_ggml_support(self, sel) -> None:
        supported = self.candidate.spec.ggml_types
        missing = [t for t in dict.fromkeys(self.weight_types) if t not in supported]
        if missing:
            others = list(dict.fromkeys(c.backend for c in sel.ranked(self.method)
                                        if all(t in c.spec.ggml_types for t in self.weight_types)))
            raise BackendError(f"{self.backend} runs LLAMAFILE for ggml types {', '.join(supported) or 'none'}; this "
                               f"layer stores {', '.join(missing)}" +
                               (f" (backend={others[0]!r} can run it)" if others else ""))

    # -- identity -------------------------------------------------------------------------
    @property
    def raw_gate_up(self) -> bool:
        """kt-core applies this layer's gated activation to the kernels' raw gate/up products (biases,
        a limit after SiLU, GELU-tanh): its kernels must have gate_up_raw_tile (plugin ABI 1.4)."""
        return self.expert_bias or self.swiglu_limit_after_act or self.gate_activation != "silu"

    @property
    def swiglu(self) -> tuple[float, float, bool, str]:
        """(limit, alpha, limit after SiLU, gate activation): the gated activation, as kt_core.rows'
        passes take it."""
        return self.swiglu_limit, self.swiglu_alpha, self.swiglu_limit_after_act, self.gate_activation

    @property
    def backend(self) -> str:
        return f"{self.candidate.backend}/{self.candidate.variant}"

    @property
    def small_batch_backend(self) -> str | None:
        """The variant that runs the batches this layer's kernels decline, if any."""
        c = self.small_batch_candidate
        return None if c is None else f"{c.backend}/{c.variant}"

    @property
    def packer_backend(self) -> str:
        """The variant that packed this layer's experts: its own, or the one it borrows (ABI 1.3)."""
        c = self.packer_candidate or self.candidate
        return f"{c.backend}/{c.variant}"

    @property
    def native_handle(self) -> int:
        """The `layer` argument of kt/forward.h's table (kt_core._native.forward_api()), for
        device bridges such as kt-cuda; valid while this object lives."""
        return self._layer.handle

    @property
    def layout_id(self) -> str:
        return self._layer.layout_id

    @property
    def kernel_id(self) -> str:
        return self._layer.kernel_id

    @property
    def packed_bytes(self) -> int:
        """Bytes of packed weights loaded so far."""
        return self._layer.packed_bytes

    @property
    def expert_bytes(self) -> int:
        """Bytes one expert takes in this method's packed layout (known before loading)."""
        return self._layer.expert_bytes

    def expert_group(self, expert: int) -> int:
        """The pool group (NUMA node, or virtual node) holding an expert's weights."""
        return self._layer.expert_group(expert)

    # -- weights --------------------------------------------------------------------------
    @staticmethod
    def _parts(gate, up, down, scales, zeros) -> tuple:
        parts = [_arrays.weight_matrix(m, n) for m, n in ((gate, "gate"), (up, "up"), (down, "down"))]
        for extra, kind in ((scales, "scale"), (zeros, "zero")):
            if extra is None:
                parts += [None] * 3
                continue
            if len(extra) != 3:
                raise WeightsError(f"{kind}s must be a (gate, up, down) triple, got {len(extra)} items")
            parts += [None if m is None else _arrays.weight_matrix(m, f"{n}_{kind}")
                      for m, n in zip(extra, ("gate", "up", "down"))]
        return tuple(parts)

    def load_expert(self, expert: int, gate, up, down, scales=None, zeros=None, biases=None) -> None:
        """Pack one expert. gate/up [I, H], down [H, I] as floats; or, for checkpoint formats,
        their codes with scales=(gate_scale, up_scale, down_scale) and optional zeros=(...).
        A layer with expert_bias=True takes biases=(gate [I], up [I], down [H])."""
        self._check_biases(biases)
        gate, up, down = self._gguf_floats(gate, up, down)
        self._layer.load_expert(int(expert), *self._parts(gate, up, down, scales, zeros))
        if biases is not None:
            self._set_biases(int(expert), biases)

    def _gguf_floats(self, gate, up, down) -> tuple:
        """GGUF float experts arrive as the file's row bytes; the float method packs them as floats.
        (MXFP4 experts arrive as codes and scales: kt.gguf's reader reorders them.)"""
        if self.kernel_method == self.method or self.kernel_method not in FLOAT_TYPES.values():
            return gate, up, down
        return tuple(_arrays.bf16_rows(m, n) for m, n in ((gate, "gate"), (up, "up"), (down, "down")))

    def _check_biases(self, biases) -> None:
        if biases is not None and not self.expert_bias:
            raise WeightsError("biases given to a layer made without expert biases; create it with expert_bias=True")
        if biases is None and self.expert_bias:
            raise WeightsError("this layer's experts carry biases (expert_bias=True): pass biases=(gate, up, down)")
        if biases is not None and len(biases) != 3:
            raise WeightsError(f"biases must be a (gate, up, down) triple, got {len(biases)} items")

    def _set_biases(self, slot: int, biases) -> None:
        def f32(x):
            a = np.ascontiguousarray(x.detach().float().cpu().numpy() if _arrays.is_torch(x) else np.asarray(x),
                                     dtype=np.float32)
            return a.reshape(-1) if a.ndim == 2 and 1 in a.shape else a

        parts = tuple(f32(b) for b in biases)
        self._layer.set_expert_bias(slot, *parts)   # checks their shapes and values
        if self.trainable:   # training adds them around its grouped products (kt_core.training_step)
            if self._training_biases is None:
                self._training_biases = (np.zeros((self.num_experts, 2 * self.intermediate_size), np.float32),
                                         np.zeros((self.num_experts, self.hidden_size), np.float32))
            gate_up, down = self._training_biases
            gate_up[slot] = np.concatenate(parts[:2])
            down[slot] = parts[2]

    @property
    def training_biases(self) -> tuple[np.ndarray, np.ndarray] | None:
        """A trainable layer's expert biases as the grouped products' rows take them: (gate_up
        [E, 2I] float32, gate | up, and down [E, H]); zeros for slots never loaded; None without biases."""
        return self._training_biases

    def load_experts(self, experts: dict) -> None:
        """Pack many experts in parallel on the pool: {slot: (gate, up, down[, scales[, zeros[,
        biases]]])}. All land or, on the first bad one, none (biases are set after the weights)."""
        ids, parts, biases = [], [], {}
        for slot, weights in experts.items():
            gate, up, down, *rest = weights
            scales, zeros, bias = (list(rest) + [None, None, None])[:3]
            self._check_biases(bias)
            ids.append(int(slot))
            parts.append(self._parts(*self._gguf_floats(gate, up, down), scales, zeros))
            if bias is not None:
                biases[int(slot)] = bias
        if ids:
            self._layer.load_experts(ids, parts)
        for slot, bias in biases.items():
            self._set_biases(slot, bias)

    def load_packed(self, offsets: dict, fd: int) -> None:
        """Install experts from bytes packed in this layer's layout (`packed_expert`'s output):
        {slot: byte offset in the open file fd}, expert_bytes each, read in parallel by the
        threads of each slot's NUMA node. All land or none."""
        self._from_file(self._layer.load_packed, offsets, fd)

    def map_packed(self, offsets: dict, fd: int) -> None:
        """Serve experts from the page cache: the open file fd is mapped read-only and slot s's
        packed bytes are those at offsets[s] (64-byte aligned). The file must not shrink
        while the layer uses it."""
        self._from_file(self._layer.map_packed, offsets, fd)

    @staticmethod
    def _from_file(install, offsets: dict, fd: int) -> None:
        if offsets:
            install([int(s) for s in offsets], [int(o) for o in offsets.values()], int(fd))

    def packed_expert(self, slot: int) -> bytes:
        """A copy of a loaded expert's packed bytes (layout `layout_id`, `expert_bytes` long)."""
        return self._layer.copy_packed(int(slot))

    def load(self, gate, up, down, physical_to_logical_map=None, *, scales=None, zeros=None, biases=None) -> None:
        """Load every CPU expert. gate/up: [E_logical, I, H]; down: [E_logical, H, I] (stacked
        tensors or sequences of per-expert matrices); scales/zeros: (gate, up, down) triples of
        per-expert stacks for pre-quantized checkpoints. Physical slot p loads logical expert
        physical_to_logical_map[p] (identity by default); GPU-resident slots are skipped."""
        logical = len(gate)
        if len(up) != logical or len(down) != logical:
            raise WeightsError(f"gate, up and down must list the same number of experts; got {len(gate)}, "
                               f"{len(up)}, {len(down)}")
        for extra, kind in ((scales, "scales"), (zeros, "zeros")):
            if extra is not None and (len(extra) != 3 or any(m is not None and len(m) != logical for m in extra)):
                raise WeightsError(f"{kind} must be a (gate, up, down) triple of stacks of {logical} experts")
        p2l = self.physical_to_logical(physical_to_logical_map, logical)

        def pick(extra, e):
            return None if extra is None else tuple(None if m is None else m[e] for m in extra)

        self._check_biases(biases)
        if biases is not None and any(len(b) != logical for b in biases):
            raise WeightsError(f"biases must be a (gate, up, down) triple of stacks of {logical} experts")
        self.load_experts({p: (gate[e], up[e], down[e], pick(scales, e), pick(zeros, e), pick(biases, e))
                           for p, e in enumerate(p2l) if self.held_on_cpu[p]})

    def physical_to_logical(self, physical_to_logical_map, logical: int) -> list[int]:
        """The logical expert each physical slot holds (SGLang's expert-location map),
        checked against `logical` experts available; identity when None."""
        if physical_to_logical_map is None:
            if logical != self.num_experts:
                raise WeightsError(f"got weights for {logical} experts, the layer has num_experts={self.num_experts}; "
                                   "pass physical_to_logical_map to load a subset or a permutation")
            return list(range(self.num_experts))
        raw = physical_to_logical_map
        p2l = [int(x) for x in np.asarray(raw.cpu() if _arrays.is_torch(raw) else raw).reshape(-1)]
        if len(p2l) != self.num_experts:
            raise WeightsError(f"physical_to_logical_map has {len(p2l)} entries, expected num_experts={self.num_experts}")
        bad = [x for x in p2l if not 0 <= x < logical]
        if bad:
            raise WeightsError(f"physical_to_logical_map entry {bad[0]} is outside [0, {logical}) logical experts")
        return p2l

    def cpu_slots(self) -> list[int]:
        """Physical expert slots kt holds (not GPU-resident when the layer was made)."""
        return [p for p in range(self.num_experts) if self.held_on_cpu[p]]

    def set_gpu_experts_mask(self, gpu_experts_mask: Sequence[bool]) -> None:
        """From the next forward on, experts marked True are the GPU's (skipped here) and the
        others are computed here; only experts the layer holds (held_on_cpu) can be computed
        here. Between forwards only: a submitted forward must be synced first."""
        mask = [bool(x) for x in list(gpu_experts_mask)]
        if len(mask) != self.num_experts:
            raise ValueError(f"gpu_experts_mask has {len(mask)} entries, expected num_experts={self.num_experts}")
        if self._pending is not None:
            raise RuntimeError("set_gpu_experts_mask() with a forward in flight on this layer; sync() it first")
        self._layer.set_routed([not g for g in mask])
        self.gpu_experts_mask = tuple(mask)

    # -- forward --------------------------------------------------------------------------
    def _prepare(self, hidden, topk_ids, topk_weights):
        """The tensors as the native layer takes them, and an output for them. Only conversion:
        the native layer checks shapes, dtypes, the token count and the ids, naming the tensor."""
        h = _arrays.to_cpu_contiguous(hidden, "hidden_states")
        shape = _arrays.shape_of(h)
        tokens = shape[0] if len(shape) == 2 else 0
        ids = _arrays.as_int64(topk_ids, "topk_ids")
        w = _arrays.as_float32(topk_weights, "topk_weights")
        out = _arrays.output_like(h, tokens, self.hidden_size)
        return h, ids, w, out

    def _direct(self, hidden, topk_ids, topk_weights):
        """(forward_at arguments, output) when the tensors can go as addresses, else None."""
        return _arrays.direct_forward_args(hidden, topk_ids, topk_weights, self.hidden_size, self.top_k, self.max_tokens)

    def _finish(self, hidden, out):
        if _arrays.is_torch(hidden):
            if hidden.is_cpu and hidden.dtype == out.dtype:
                return out
            return out.to(device=hidden.device, dtype=hidden.dtype)
        return out.astype(hidden.dtype, copy=False) if isinstance(hidden, np.ndarray) else out

    def forward(self, hidden_states, topk_ids, topk_weights):
        """out[t] = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(hidden_states[t]); ids of -1
        and GPU-resident experts contribute nothing. Same dtype and device as hidden_states."""
        direct = self._direct(hidden_states, topk_ids, topk_weights)
        if direct is not None:
            self._layer.forward_at(*direct[0])
            return direct[1]
        h, ids, w, out = self._prepare(hidden_states, topk_ids, topk_weights)
        self._layer.forward(h, ids, w, out)
        return self._finish(hidden_states, out)

    __call__ = forward

    def submit(self, hidden_states, topk_ids, topk_weights) -> None:
        """Start a forward on the pool and return at once (the GIL is released while it runs)."""
        direct = self._direct(hidden_states, topk_ids, topk_weights)
        # The native layer (not self) and the arrays are pinned until sync, so dropping self runs __del__.
        if direct is not None:
            out = direct[1]
            self._layer.submit_forward_at(*direct[0], (self._layer, hidden_states, topk_ids, topk_weights, out))
        else:
            h, ids, w, out = self._prepare(hidden_states, topk_ids, topk_weights)
            self._layer.submit_forward(h, ids, w, out, (self._layer, h, ids, w, out))
        self._pending = (hidden_states, out, os.getpid())

    def sync(self):
        """Wait for the submitted forward (the calling thread joins the work) and return its output."""
        if self._pending is None:
            raise RuntimeError("sync() without a submitted forward on this layer; call submit() first")
        hidden, out, pid = self._pending
        self._pending = None
        if pid != os.getpid():
            # fork() with a forward in flight: it ran on the parent's pool, and `out` here is a
            # copy of the parent's memory taken at some point of that run.
            raise RuntimeError("sync() in a fork() child of the process that submitted the forward: it ran in the "
                               "parent, this process has no result for it; submit it again here")
        _native.pool_sync()
        return self._finish(hidden, out)

    def __del__(self):
        # A layer dropped with a forward in flight waits for it: the pool holds one job, and
        # nobody could sync this one any more, so every later submit() would be refused.
        pending = getattr(self, "_pending", None)
        if pending is not None and pending[2] == os.getpid():
            try:
                _native.pool_sync()
            except Exception:  # the result has no receiver, nor has its error
                pass


    # -- training's products -----------------------------------------------------------------
    # Rows grouped by expert: counts[e] rows of expert e, experts in index order (kt.training's
    # autograd node sorts the routed (token, slot) pairs so). float32 in, float32 out, same kind
    # (torch or NumPy) as the input; gradients are used as given, inputs are quantized as the
    # forward quantizes activations.
    def _grouped_args(self, first, counts, name):
        x = _arrays.to_cpu_contiguous(first, name)
        c = _arrays.as_int64(counts, "counts")
        return x, c

    @staticmethod
    def _result(out, x, width: int):
        """`out` when the caller gave one, else a new float32 [rows of x, width] of x's kind."""
        if out is not None:
            return out
        rows = _arrays.shape_of(x)[0]
        if _arrays.is_torch(x):
            import torch

            return torch.empty((rows, width), dtype=torch.float32)
        return np.empty((rows, width), dtype=np.float32)

    def grouped_gate_up(self, x, counts, out=None, *, token=None, lora=None):
        """x float32 [rows, hidden] -> float32 [rows, 2 * intermediate]: x·gateᵀ in the first half of each
        row, x·upᵀ in the second (transformers' fused gate_up order), no activation. Each grouped_*
        product writes into `out` when given (a float32 C-contiguous array of the result's shape).
        token int64 [rows]: x is [tokens, hidden] and the rows are x[token] (quantized straight from x,
        no gathered copy). lora: a kt_core.lora.ProductLora (blocks 1 or 2) whose term the product adds."""
        x = _arrays.to_cpu_contiguous(x, "x")
        c = _arrays.as_int64(counts, "counts")
        if token is not None:
            token = _arrays.as_int64(token, "token")
        gate_up = self._result(out, token if token is not None else x, 2 * self.intermediate_size)
        if lora is None:
            self._layer.grouped_gate_up(x, c, gate_up, token)
        else:
            self._layer.grouped_gate_up(x, c, gate_up, token, lora.a, lora.bt, float(lora.scaling), int(lora.blocks), lora.xa)
        return gate_up

    def grouped_down(self, h, counts, out=None, *, lora=None):
        """h float32 [rows, intermediate] -> h·downᵀ float32 [rows, hidden] (lora: a ProductLora, blocks 1)."""
        h, c = self._grouped_args(h, counts, "h")
        y = self._result(out, h, self.hidden_size)
        if lora is None:
            self._layer.grouped_down(h, c, y)
        else:
            if lora.blocks != 1:
                raise ValueError(f"the down adapter's blocks must be 1, got {lora.blocks}")
            self._layer.grouped_down(h, c, y, lora.a, lora.bt, float(lora.scaling), lora.xa)
        return y

    def grouped_gate_up_transposed(self, dgate_up, counts, out=None, *, lora=None):
        """dgate_up float32 [rows, 2 * intermediate] (dgate | dup) -> dgate·gate + dup·up float32 [rows, hidden]
        (+ g·A_e with lora, a kt_core.lora.ProductLoraGrad)."""
        g, c = self._grouped_args(dgate_up, counts, "dgate_up")
        dx = self._result(out, g, self.hidden_size)
        self._layer.grouped_gate_up_transposed(g, c, dx, *((lora.g, lora.a) if lora is not None else ()))
        return dx

    def grouped_down_transposed(self, dy, counts, out=None, *, lora=None):
        """dy float32 [rows, hidden] -> dy·down float32 [rows, intermediate] (+ g·A_e with lora)."""
        dy, c = self._grouped_args(dy, counts, "dy")
        dh = self._result(out, dy, self.intermediate_size)
        self._layer.grouped_down_transposed(dy, c, dh, *((lora.g, lora.a) if lora is not None else ()))
        return dh


def clear_buffer_cache() -> None:
    """Free the scratch buffers forwards and training's grouped products reuse (they are re-allocated
    on the next call)."""
    _native.clear_forward_scratch()
