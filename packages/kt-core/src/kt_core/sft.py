"""KTMoEWrapper(mode="sft"): kt-kernel 0.7.2's SFT wrapper API, on kt-core's training primitives.

kt-kernel trains routed-expert LoRA through an explicit wrapper (no autograd): the caller owns
bf16 LoRA factors and their gradient buffers, calls forward(save_for_backward=True) and later
backward(grad_output), and gets the gradients of the hidden states and of the routing weights back
while the LoRA gradients land in its buffers. This is that API — same constructor arguments, the
same methods, shapes and dtypes — so code written against kt-kernel's SFT classes runs on kt.

Each call is one kt_core.training_step.ExpertStep (kt's grouped products with the frozen packed
weights, kt_core.lora's adapters, kt_core.rows' row passes, in float32, the step's temporaries from a
pool reused across steps), the gate and up adapters run as one call on the fused product.

Differences from kt-kernel, all deliberate (docs/training.md):
 - every method runs on the best backend with transposed tiles (kt-backend-avx, amx, reference);
   AMXFP8_SFT (LoRA on frozen block-FP8 experts, avx's or amx's transposed FP8 products) takes
   its experts as kt-kernel's does, from load_block_fp8_weights() or an FP8 weight_path; MXFP4_SFT
   (LoRA on frozen E2M1 experts with UE8M0 scales, DeepSeek-V4-Flash's format, and its clamped SiLU:
   swiglu_limit) from load_mxfp4_weights() or a weight_path whose experts are stored that way;
 - max_cache_depth forwards are kept, newest first; backward consumes the newest (a forward past
   the depth drops the oldest, whose backward then finds no cache — an error, not other gradients);
 - optimizer-owned gradients ("authoritative" in kt-kernel) whenever the six LoRA factors are
   nn.Parameters, for every method: a backward overwrites the grad buffers when the Parameters'
   .grad is None and adds into them when .grad is the buffer (gradient accumulation), then sets
   .grad; with plain tensors each backward overwrites the buffers;
 - lora_dropout > 0 and num_gpu_experts > 0 are refused by name (kt-kernel's RAWINT4/FP8 paths
   refuse them too); the checkpoint-reuse caches and distributed helpers of kt-kernel's layer
   wrapper are not part of this class (kt's patch_model(mode="train") is the layer integration).
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

import torch

from .errors import KTError
from .moe import MoE, clear_buffer_cache
from .rows import Routing
from .training_step import Adapters, ExpertStep, Saved, expert_weight_grads

log = logging.getLogger("kt_core")

# kt-kernel 0.7.2's SFT method names -> (kt's method, INT4 zero point, INT4 group taken from group_size)
SFT_METHODS = {
    "AMXBF16_SFT": ("BF16", False, False),
    "INT8_SFT": ("INT8", False, False),
    "AMXINT8_SFT": ("INT8", False, False),
    "AMXINT4_SFT": ("INT4", False, False),
    "AMXINT4_1_SFT": ("INT4", True, False),
    "AMXINT4_KGroup_SFT": ("INT4", False, True),
    "AMXINT4_1KGroup_SFT": ("INT4", True, True),
    "RAWINT4_SFT": ("RAWINT4", False, False),
    "AMXFP8_SFT": ("FP8", False, False),
    "MXFP4_SFT": ("MXFP4", False, False),
}
SKIP_LORA_SUFFIX = "_SkipLoRA"
MAX_RANK = 32   # gate and up run as one adapter of rank 2r, and kt_core.lora takes ranks up to 64
LORA_NAMES = ("gate_lora_a", "gate_lora_b", "up_lora_a", "up_lora_b", "down_lora_a", "down_lora_b")


def sft_methods() -> list[str]:
    return sorted([*SFT_METHODS, *(m + SKIP_LORA_SUFFIX for m in SFT_METHODS if m.startswith("AMX"))])


def ue8m0_to_bf16(exponents: torch.Tensor) -> torch.Tensor:
    """UE8M0 scale bytes e (uint8, 0xff excluded: callers refuse it) as the bf16 powers of two
    2^(e - 127) kt-kernel's MXFP4 loader hands over: bits e << 7, and e = 0 as bf16's subnormal 0x0040."""
    bits = exponents.to(torch.int32) << 7
    bits = torch.where(exponents == 0, 0x0040, bits)
    return bits.to(torch.int16).view(torch.bfloat16).contiguous()


def _check_ue8m0_scales(scale: torch.Tensor, what: str) -> torch.Tensor:
    """`scale` itself if every value is a UE8M0 scale as bf16 — a finite positive power of two (bf16
    holds 2^(e - 127) as e << 7; e = 0, 2^-127, as the subnormal 0x0040) — else a ValueError naming
    one. MXFP4's packing takes such bf16 values as they are."""
    bits = scale.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    bad = (((bits & 0x807F) != 0) & (bits != 0x0040)) | (bits == 0x7F80)   # sign, mantissa bits, or infinity
    if bool(bad.any()):
        found = float(scale.reshape(-1)[int(bad.reshape(-1).nonzero()[0])])
        raise ValueError(f"{what} must hold UE8M0 scales (finite positive powers of two as bf16), found {found}")
    return scale


@dataclass(frozen=True)
class _OwnedGrad:
    """A Parameter whose gradient this wrapper writes into `grad` (kt-kernel's authoritative grads)."""
    name: str
    parameter: torch.nn.Parameter
    grad: torch.Tensor


class SFTMoEWrapper:
    """One MoE layer's routed experts for LoRA (or full BF16) fine-tuning; see the module docstring."""

    def __init__(self, layer_idx: int, num_experts: int, num_experts_per_tok: int, hidden_size: int,
                 moe_intermediate_size: int, gpu_experts_mask=None, cpuinfer_threads: int | None = None,
                 threadpool_count: int = 1, weight_path: str | None = None, chunked_prefill_size: int = 4096,
                 cpu_save: bool = False, max_deferred_experts_per_token: int | None = None,
                 method: str = "AMXBF16_SFT", numa_nodes=None, mode: str = "sft", *, num_gpu_experts: int = 0,
                 lora_rank: int = 16, lora_alpha: float = 32.0, lora_dropout: float = 0.0, max_cache_depth: int = 1,
                 group_size: int = 128, zero_point: bool = True, full_weight_grad: bool = False,
                 swiglu_limit: float = 0.0, swiglu_alpha: float = 0.0, backend: str | None = None,
                 fast_activations: bool | None = None, **unused):
        from .wrapper import KTMoEWrapper  # the pool settings are the inference wrapper's

        self.layer_idx, self.num_experts = int(layer_idx), int(num_experts)
        self.num_experts_per_tok, self.hidden_size = int(num_experts_per_tok), int(hidden_size)
        self.moe_intermediate_size = int(moe_intermediate_size)
        self.weight_path, self.chunked_prefill_size = weight_path, int(chunked_prefill_size)
        self.threadpool_count, self.cpu_save = int(threadpool_count or 1), bool(cpu_save)
        self.method = str(method)
        self._is_skip_lora = self.method.endswith(SKIP_LORA_SUFFIX)
        base_method = self.method.removesuffix(SKIP_LORA_SUFFIX)
        if base_method not in SFT_METHODS or (self._is_skip_lora and not base_method.startswith("AMX")):
            raise ValueError(f"Method '{self.method}' not supported for SFT mode. Supported methods: {sft_methods()}")
        kt_method, zp, grouped = SFT_METHODS[base_method]
        if gpu_experts_mask is not None and bool(torch.as_tensor(gpu_experts_mask).any()):
            raise KTError("mode='sft' computes every routed expert on the CPU: gpu_experts_mask must be None or "
                          "all False (kt trains GPU-resident experts through patch_model(mode='train'), not here)")
        if int(num_gpu_experts or 0):
            raise KTError(f"num_gpu_experts={num_gpu_experts}: mode='sft' computes every routed expert on the CPU "
                          "(kt-kernel's optimizer-owned gradients need the same)")
        if max_deferred_experts_per_token:
            raise KTError("max_deferred_experts_per_token is an inference setting; mode='sft' defers nothing")
        self._validate_sft_config(lora_rank, lora_alpha, lora_dropout, max_cache_depth, full_weight_grad)
        swiglu_limit = self._validate_swiglu(kt_method, swiglu_limit, swiglu_alpha)
        if kt_method == "MXFP4":   # kt-kernel's MXFP4_SFT contract, so code written for it means the same here
            if full_weight_grad:
                raise ValueError("MXFP4_SFT supports frozen-base LoRA only")
            if int(group_size) != 32 or zero_point:
                raise ValueError(f"MXFP4_SFT requires group_size=32 and zero_point=False (its E2M1 groups of 32 "
                                 f"share one UE8M0 scale), got group_size={group_size}, zero_point={zero_point}")
            if int(hidden_size) % 32 or int(moe_intermediate_size) % 32:
                raise ValueError(f"MXFP4_SFT requires hidden_size and moe_intermediate_size divisible by 32, got "
                                 f"{hidden_size} and {moe_intermediate_size}")
        if full_weight_grad and kt_method != "BF16":
            raise KTError(f"full_weight_grad=True trains the expert weights themselves, which kt does on BF16 only "
                          f"(AMXBF16_SFT); {self.method} holds quantized weights (frozen: train LoRA on them)")
        if not self._is_skip_lora and lora_rank > MAX_RANK:
            raise KTError(f"lora_rank {lora_rank}: kt runs the gate and up adapters as one of rank 2 x lora_rank, "
                          f"and takes ranks up to {MAX_RANK} here")
        if unused:
            log.debug("SFT KTMoEWrapper ignores kt-kernel arguments it has no use for: %s", sorted(unused))
        self.num_gpu_experts = 0
        self.lora_rank, self.lora_alpha = int(lora_rank), float(lora_alpha)
        self.lora_dropout, self.max_cache_depth = float(lora_dropout), int(max_cache_depth)
        self.lora_scaling = self.lora_alpha / self.lora_rank if self.lora_rank > 0 else 0.0
        self._full_weight_grad = bool(full_weight_grad)
        self.group_size = int(group_size) if grouped else 0
        self.zero_point = zp

        KTMoEWrapper._configure_pool(cpuinfer_threads, threadpool_count)
        # BF16 takes bf16 activations and gradients by default here, as kt-kernel's SFT kernels and any
        # bf16 training run do: its outputs are bf16 anyway, and the error stays at that floor
        # (docs/training.md); 1.2x the exact planes' speed. The integer methods keep two int8 passes
        # (one pass doubles their error against float64). fast_activations=True / False overrides.
        if fast_activations is None:
            fast_activations = kt_method == "BF16"
        self._moe = MoE(num_experts=self.num_experts, top_k=self.num_experts_per_tok, hidden_size=self.hidden_size,
                        intermediate_size=self.moe_intermediate_size, method=kt_method,
                        max_tokens=self.chunked_prefill_size, backend=backend, group_size=self.group_size,
                        zero_point=zp, fast_activations=fast_activations, trainable=True,
                        swiglu_limit=swiglu_limit)
        self._step = ExpertStep(self._moe)
        self._physical_to_logical = None
        self._weights_loaded = False
        self._lora_initialized = False
        for name in LORA_NAMES:
            setattr(self, name, None)
            setattr(self, "grad_" + name, None)
        self.gate_proj_buf = self.up_proj_buf = self.down_proj_buf = None
        self.grad_gate_proj_buf = self.grad_up_proj_buf = self.grad_down_proj_buf = None
        self._owned: list[_OwnedGrad] = []
        self._saved: list[Saved] = []
        self._job: tuple[threading.Thread, dict] | None = None

    @staticmethod
    def _validate_sft_config(lora_rank, lora_alpha, lora_dropout, max_cache_depth, full_weight_grad) -> None:
        if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 0:
            raise ValueError(f"lora_rank must be a non-negative integer, got {lora_rank!r}")
        if not full_weight_grad and lora_rank <= 0:
            raise ValueError(f"lora_rank must be positive in LoRA mode, got {lora_rank}. "
                             "Set full_weight_grad=True for full fine-tuning.")
        if lora_rank > 0 and not (math.isfinite(float(lora_alpha)) and lora_alpha > 0):
            raise ValueError(f"lora_alpha must be positive, got {lora_alpha}")
        if not 0.0 <= float(lora_dropout) < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {lora_dropout}")
        if float(lora_dropout) != 0.0:
            raise KTError(f"lora_dropout={lora_dropout}: kt's SFT wrapper trains without LoRA dropout (0.0)")
        if isinstance(max_cache_depth, bool) or int(max_cache_depth) <= 0:
            raise ValueError(f"max_cache_depth must be positive, got {max_cache_depth}")

    @staticmethod
    def _validate_swiglu(kt_method: str, swiglu_limit, swiglu_alpha) -> float:
        """The experts' activation: SiLU, or for MXFP4_SFT (only, as in kt-kernel) DeepSeek-V4's clamped
        SiLU — SiLU(min(gate, limit)) * clamp(up, -limit, limit), kt's swiglu_limit with alpha 0."""
        limit, alpha = float(swiglu_limit or 0.0), float(swiglu_alpha or 0.0)
        if kt_method != "MXFP4":
            if limit or alpha:
                raise ValueError(f"swiglu_limit / swiglu_alpha (a clamped SwiGLU) are only supported by MXFP4_SFT in "
                                 f"mode='sft', got {limit} / {alpha} (GPT-OSS's experts train through "
                                 "kt.integrations.transformers.patch_model(mode='train'))")
            return 0.0
        if alpha:
            raise ValueError(f"MXFP4_SFT requires swiglu_alpha=0 (its clamped SiLU has no sigmoid scale), got {alpha}")
        if not (math.isfinite(limit) and limit > 0):
            raise ValueError(f"MXFP4_SFT requires a finite positive swiglu_limit, got {swiglu_limit!r}")
        return limit

    @property
    def backend(self) -> str:
        return self._moe.backend

    @property
    def _trains_lora(self) -> bool:
        return self.lora_rank > 0 and not self._is_skip_lora

    # -- weights ------------------------------------------------------------------------------
    def load_weights_from_tensors(self, gate_proj, up_proj, down_proj, physical_to_logical_map_cpu=None) -> None:
        """gate_proj/up_proj [E, I, H], down_proj [E, H, I] (any float dtype), packed into the method's
        layout. With full_weight_grad they are also the starting point of init_full_weight_grad_buffers."""
        if self._moe.method == "RAWINT4":
            raise KTError("RAWINT4_SFT reads its int4 experts as a compressed-tensors checkpoint stores them: use "
                          "load_rawint4_weights() or load_weights() with weight_path")
        if self._moe.method == "FP8":
            raise KTError("AMXFP8_SFT takes the experts' E4M3 codes and block scales as the checkpoint stores them: "
                          "use load_block_fp8_weights() or load_weights() with weight_path")
        if self._moe.method == "MXFP4":
            raise KTError("MXFP4_SFT accepts native packed E2M1 weights and UE8M0 scales only: use "
                          "load_mxfp4_weights() or load_weights() with weight_path")
        self._moe.load(gate_proj, up_proj, down_proj, physical_to_logical_map_cpu)
        self._physical_to_logical = physical_to_logical_map_cpu
        self._weights_loaded = True

    def load_rawint4_weights(self, weights, physical_to_logical_map_cpu=None) -> None:
        """RAWINT4_SFT's experts from packed tensors (kt-kernel's RAWINT4ExpertWeights: gate_proj /
        up_proj uint8 [E, I, H / 2], down_proj [E, H, I / 2] — compressed-tensors' int32 words as
        bytes, or those int32 words [.., K / 8] — and gate_scale / up_scale / down_scale bf16
        [E, rows, cols / 32], group_size 32), packed into kt's RAWINT4 layout as stored."""
        if self._moe.method != "RAWINT4":
            raise KTError(f"load_rawint4_weights() loads RAWINT4_SFT's experts; this wrapper is {self.method}")
        group = int(getattr(weights, "group_size", 32))
        if group != 32:
            raise KTError(f"RAWINT4_SFT takes symmetric int4 groups of 32, got group_size={group}")
        E, H, I = self.num_experts, self.hidden_size, self.moe_intermediate_size
        codes = []
        for name, rows, cols in (("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)):
            t = getattr(weights, name, None)
            if not isinstance(t, torch.Tensor):
                raise KTError(f"load_rawint4_weights(): {name} must be a torch.Tensor (kt-kernel's RAWINT4ExpertWeights), "
                              f"got {type(t).__name__}")
            if t.dtype == torch.uint8 and tuple(t.shape) == (E, rows, cols // 2) and cols % 8 == 0:
                t = t.contiguous().view(torch.int32)   # compressed-tensors' words, as kt-kernel reads them
            elif not (t.dtype == torch.int32 and tuple(t.shape) == (E, rows, cols // 8)):
                raise KTError(f"load_rawint4_weights(): {name} must be uint8 [{E}, {rows}, {cols // 2}] (or int32 "
                              f"[{E}, {rows}, {cols // 8}]), got {t.dtype} {list(t.shape)}")
            codes.append(t)
        scales = tuple(getattr(weights, n, None) for n in ("gate_scale", "up_scale", "down_scale"))
        self._moe.load(*codes, physical_to_logical_map_cpu, scales=scales)
        self._physical_to_logical = physical_to_logical_map_cpu
        self._weights_loaded = True

    def load_block_fp8_weights(self, weights, physical_to_logical_map_cpu=None) -> None:
        """AMXFP8_SFT's experts from raw checkpoint tensors (kt-kernel's BlockFP8ExpertWeights: per-expert
        lists gate_proj / up_proj [I, H], down_proj [H, I] of float8_e4m3fn and gate_scale / up_scale /
        down_scale f32 [rows / 128, cols / 128], block_size (128, 128)), packed into kt's FP8 layout."""
        if self._moe.method != "FP8":
            raise KTError(f"load_block_fp8_weights() loads AMXFP8_SFT's experts; this wrapper is {self.method}")
        block = tuple(getattr(weights, "block_size", (128, 128)))
        if block != (128, 128):
            raise KTError(f"AMXFP8_SFT takes FP8 weights with 128 x 128 scale blocks, got block_size={block}")
        names = ("gate_proj", "up_proj", "down_proj", "gate_scale", "up_scale", "down_scale")
        missing = [n for n in names if not hasattr(weights, n)]
        if missing:
            raise KTError(f"load_block_fp8_weights() takes an object with {', '.join(names)} (kt-kernel's "
                          f"BlockFP8ExpertWeights); {type(weights).__name__} has no {', '.join(missing)}")
        codes, scales = ([getattr(weights, n) for n in group] for group in (names[:3], names[3:]))
        for name, experts in zip(names, codes + scales):
            if len(experts) != self.num_experts:
                raise KTError(f"{name} lists {len(experts)} experts, this layer has {self.num_experts}")
        self._moe.load(*codes, physical_to_logical_map_cpu, scales=tuple(scales))
        self._physical_to_logical = physical_to_logical_map_cpu
        self._weights_loaded = True

    def load_mxfp4_weights(self, experts_data, physical_to_logical_map_cpu=None) -> None:
        """MXFP4_SFT's experts as kt-kernel's MXFP4SafeTensorLoader.load_experts() gives them: a dict of
        per-expert lists gate / up uint8 [I, H / 2], down [H, I / 2] (E2M1 codes, two per byte, the even
        element in the low nibble) and gate_scale / up_scale / down_scale bf16 [rows, cols / 32] (powers
        of two: the UE8M0 exponents as bf16), packed into kt's MXFP4 layout as stored (its packing takes
        the bf16 scale values)."""
        if self._moe.method != "MXFP4":
            raise KTError(f"load_mxfp4_weights() loads MXFP4_SFT's experts; this wrapper is {self.method}")
        if self._weights_loaded:
            raise RuntimeError("MXFP4_SFT weights are immutable and already loaded")
        if not isinstance(experts_data, dict):
            raise TypeError(f"MXFP4 expert weights must be the dict MXFP4SafeTensorLoader.load_experts() returns "
                            f"(gate, up, down, gate_scale, up_scale, down_scale), got {type(experts_data).__name__}")
        E, H, I = self.num_experts, self.hidden_size, self.moe_intermediate_size
        shapes = {"gate": (I, H), "up": (I, H), "down": (H, I)}
        codes, scales = [], []
        for name, (rows, cols) in shapes.items():
            for key, dtype, shape, into in ((name, torch.uint8, (rows, cols // 2), codes),
                                            (name + "_scale", torch.bfloat16, (rows, cols // 32), scales)):
                tensors = experts_data.get(key)
                if not isinstance(tensors, (list, tuple)) or len(tensors) != E:
                    got = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
                    raise ValueError(f"MXFP4 {key} must contain {E} expert tensors, got {got}")
                for e, t in enumerate(tensors):
                    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.dtype != dtype \
                            or tuple(t.shape) != shape:
                        got = (f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor)
                               else type(t).__name__)
                        raise ValueError(f"MXFP4 {key}[{e}] must be a CPU {dtype} tensor of shape {shape}, got {got}")
                into.append(torch.stack([t if key == name else _check_ue8m0_scales(t, f"MXFP4 {key}[{e}]")
                                         for e, t in enumerate(tensors)]))
        self._moe.load(*codes, physical_to_logical_map_cpu, scales=tuple(scales))
        self._physical_to_logical = physical_to_logical_map_cpu
        self._weights_loaded = True

    def load_weights(self, physical_to_logical_map_cpu=None) -> None:
        """Layer `layer_idx`'s experts from weight_path (read by the kt application's weight source)."""
        from .weight_source import weight_source

        if not self.weight_path:
            raise KTError("load_weights() reads experts from weight_path, and this wrapper has none; pass "
                          "weight_path= or use load_weights_from_tensors()")
        if self._moe.method == "MXFP4":   # DeepSeek-V4-Flash's expert tensors, read as kt-kernel reads them
            source = weight_source()
            if not hasattr(source, "native_mxfp4_experts"):
                raise KTError(f"MXFP4_SFT's load_weights() reads DeepSeek-V4-Flash's expert tensors; the installed "
                              f"weight source ({getattr(source, '__name__', source)}) cannot: use load_mxfp4_weights()")
            self.load_mxfp4_weights(source.native_mxfp4_experts(self.weight_path, self.layer_idx),
                                    physical_to_logical_map_cpu)
            return
        weight_source().load_layer(self._moe, self.weight_path, self.layer_idx, physical_to_logical_map_cpu,
                                   quantize_at_load=True)
        self._physical_to_logical = physical_to_logical_map_cpu
        self._weights_loaded = True

    # -- LoRA ---------------------------------------------------------------------------------
    def _lora_shapes(self) -> dict[str, tuple[int, int, int]]:
        E, H, I, r = self.num_experts, self.hidden_size, self.moe_intermediate_size, self.lora_rank
        return {"gate_lora_a": (E, r, H), "gate_lora_b": (E, I, r), "up_lora_a": (E, r, H),
                "up_lora_b": (E, I, r), "down_lora_a": (E, r, I), "down_lora_b": (E, H, r)}

    def init_lora_weights(self, gate_lora_a, gate_lora_b, up_lora_a, up_lora_b, down_lora_a, down_lora_b,
                          grad_gate_lora_a, grad_gate_lora_b, grad_up_lora_a, grad_up_lora_b, grad_down_lora_a,
                          grad_down_lora_b) -> None:
        """The caller's LoRA factors and their gradient buffers: CPU, bfloat16, contiguous, A [E, r, in],
        B [E, out, r]. Forwards read the factors as they are at that moment (an optimizer updates them
        in place); backward writes the buffers. All six factors nn.Parameters: their .grad is set to
        the buffers (overwritten while .grad is None, accumulated while it is the buffer)."""
        values = dict(zip(LORA_NAMES, (gate_lora_a, gate_lora_b, up_lora_a, up_lora_b, down_lora_a, down_lora_b)))
        grads = dict(zip(LORA_NAMES, (grad_gate_lora_a, grad_gate_lora_b, grad_up_lora_a, grad_up_lora_b,
                                      grad_down_lora_a, grad_down_lora_b)))
        shapes = self._lora_shapes()
        for name, tensor in [*values.items(), *(("grad_" + n, g) for n, g in grads.items())]:
            expected = shapes[name.removeprefix("grad_")]
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
            if tuple(tensor.shape) != expected:
                raise ValueError(f"{name} shape mismatch: expected {expected}, got {tuple(tensor.shape)}")
            if tensor.device.type != "cpu" or tensor.dtype != torch.bfloat16:
                raise ValueError(f"{name} must be a CPU torch.bfloat16 tensor for {self.method} SFT, got "
                                 f"{tensor.dtype} on {tensor.device}")
            if not tensor.is_contiguous():
                raise ValueError(f"{name} must be contiguous")
        parameters = sum(isinstance(t, torch.nn.Parameter) for t in values.values())
        if parameters not in (0, len(values)):
            raise ValueError("optimizer-owned LoRA gradients need all six factors to be nn.Parameter objects, or none")
        self._owned = [o for o in self._owned if not o.name.startswith("lora.")]
        for name in LORA_NAMES:
            setattr(self, name, values[name])
            setattr(self, "grad_" + name, grads[name])
            if parameters:
                self._own(f"lora.{name}", values[name], grads[name])
        self._lora_initialized = True

    def update_lora_weights(self) -> None:
        """kt-kernel re-registers the factors' pointers here; kt reads the factors at every forward,
        so only the checks remain."""
        if not self._weights_loaded:
            raise RuntimeError("Weights not loaded. Call load_weights() or load_weights_from_tensors() first.")
        if self._trains_lora and not self._lora_initialized:
            raise RuntimeError("LoRA weights not initialized. Call init_lora_weights() first.")

    def _adapters(self) -> Adapters | None:
        """The factors as they are now, in float32: gate and up as one call on the fused product (B
        block-diagonal in two blocks, kt_core.lora), and down."""
        if not self._trains_lora:
            return None
        return Adapters(scaling=self.lora_scaling,
                        gate_up_a=torch.cat([self.gate_lora_a, self.up_lora_a], dim=1).float(),
                        gate_up_b=torch.cat([self.gate_lora_b, self.up_lora_b], dim=1).float(), blocks=2,
                        down_a=self.down_lora_a.float().contiguous(), down_b=self.down_lora_b.float().contiguous())

    # -- full fine-tuning (BF16) ------------------------------------------------------------------
    def init_full_weight_grad_buffers(self, gate_proj, up_proj, down_proj) -> None:
        """The expert weights as bf16 nn.Parameters (gate_proj_buf, up_proj_buf, down_proj_buf) with
        gradient buffers backward writes (as the LoRA buffers); update_base_weights() repacks them."""
        if not self._full_weight_grad:
            raise RuntimeError("init_full_weight_grad_buffers() needs full_weight_grad=True")
        E, H, I = self.num_experts, self.hidden_size, self.moe_intermediate_size
        for name, tensor, shape in (("gate_proj", gate_proj, (E, I, H)), ("up_proj", up_proj, (E, I, H)),
                                    ("down_proj", down_proj, (E, H, I))):
            if tuple(tensor.shape) != shape:
                raise ValueError(f"{name} shape mismatch: expected {shape}, got {tuple(tensor.shape)}")
        self._owned = [o for o in self._owned if not o.name.startswith("base.")]
        for name, tensor in (("gate_proj", gate_proj), ("up_proj", up_proj), ("down_proj", down_proj)):
            param = torch.nn.Parameter(tensor.detach().to("cpu", torch.bfloat16).contiguous().clone())
            grad = torch.zeros_like(param.data)
            setattr(self, f"{name}_buf", param)
            setattr(self, f"grad_{name}_buf", grad)
            self._own(f"base.{name}", param, grad)

    def update_base_weights(self) -> None:
        """Repack the (optimizer-updated) bf16 expert Parameters into the kernels' layout."""
        if not self._weights_loaded:
            raise RuntimeError("Weights not loaded. Call load_weights() first.")
        if not self._full_weight_grad:
            return
        if self.gate_proj_buf is None:
            raise RuntimeError("Base weight buffers not initialized. Call init_full_weight_grad_buffers() first.")
        self._moe.load(self.gate_proj_buf.data, self.up_proj_buf.data, self.down_proj_buf.data,
                       self._physical_to_logical)

    # -- optimizer-owned gradients ----------------------------------------------------------------
    def _own(self, name: str, parameter, grad) -> None:
        parameter.grad = None   # a closed window: the first backward overwrites
        self._owned.append(_OwnedGrad(name, parameter, grad))

    @property
    def authoritative_optimizer_grads(self) -> tuple[_OwnedGrad, ...]:
        return tuple(self._owned)

    @property
    def _uses_authoritative_optimizer_grads(self) -> bool:
        return bool(self._owned)

    def validate_authoritative_optimizer_grad_state(self) -> str:
        """'empty' (no Parameters), 'closed' (every .grad None) or 'open' (every .grad its buffer)."""
        if not self._owned:
            return "empty"
        state = set()
        for owned in self._owned:
            grad = owned.parameter.grad
            if grad is None:
                state.add("closed")
            elif grad is owned.grad:
                state.add("open")
            else:
                raise RuntimeError(f"{owned.name}: Parameter.grad was replaced; expected None or the gradient buffer "
                                   "this wrapper writes")
        if len(state) > 1:
            raise RuntimeError("some of this layer's Parameters have .grad set and others None; zero them together "
                               "(optimizer.zero_grad())")
        return state.pop()

    def release_authoritative_optimizer_grads(self) -> None:
        """Close the window after an optimizer step (what optimizer.zero_grad(set_to_none=True) does)."""
        self.validate_authoritative_optimizer_grad_state()
        for owned in self._owned:
            owned.parameter.grad = None

    # -- forward ------------------------------------------------------------------------------------
    def _idle(self) -> None:
        if self._job is not None:
            raise RuntimeError(f"a {self._job[1]['kind']} of this layer is in flight; sync it first")

    def _validate_forward_inputs(self, hidden_states, expert_ids, weights) -> None:
        self._idle()
        if not self._weights_loaded:
            raise RuntimeError("Weights not loaded. Call load_weights() or load_weights_from_tensors() first.")
        if self._trains_lora and not self._lora_initialized:
            raise RuntimeError("LoRA weights not initialized. Call init_lora_weights() first.")
        if hidden_states.dim() != 2 or hidden_states.shape[1] != self.hidden_size:
            raise ValueError(f"hidden_states shape {tuple(hidden_states.shape)} must be (qlen, {self.hidden_size})")
        qlen = hidden_states.shape[0]
        if qlen > self.chunked_prefill_size:
            raise ValueError(f"qlen ({qlen}) exceeds chunked_prefill_size ({self.chunked_prefill_size}). "
                             "Increase chunked_prefill_size or reduce qlen.")
        if tuple(expert_ids.shape) != (qlen, self.num_experts_per_tok):
            raise ValueError(f"expert_ids shape {tuple(expert_ids.shape)} must be ({qlen}, {self.num_experts_per_tok}).")
        if tuple(weights.shape) != (qlen, self.num_experts_per_tok):
            raise ValueError(f"weights shape {tuple(weights.shape)} must be ({qlen}, {self.num_experts_per_tok}).")
        if expert_ids.is_floating_point():
            raise ValueError(f"expert_ids must be an integer tensor, got {expert_ids.dtype}")
        if qlen and (int(expert_ids.min()) < -1 or int(expert_ids.max()) >= self.num_experts):
            raise ValueError(f"expert_ids must lie in [0, {self.num_experts}) (-1: no expert), found "
                             f"{int(expert_ids.min())}..{int(expert_ids.max())}")

    def forward(self, hidden_states, expert_ids, weights, save_for_backward: bool = True, output_device=None):
        """The layer's routed-expert output, bf16 [qlen, H] (on output_device, else the CPU)."""
        self._validate_forward_inputs(hidden_states, expert_ids, weights)
        return self._to(self._forward(hidden_states, expert_ids, weights, save_for_backward), output_device)

    def _forward(self, hidden_states, expert_ids, weights, save: bool) -> torch.Tensor:
        # kt-kernel hands its kernels bf16 inputs; kt computes from the same rounded values.
        x = hidden_states.detach().to("cpu", torch.bfloat16).float()
        ids, w = expert_ids.detach().to("cpu"), weights.detach().to("cpu", torch.float32)
        out, saved = self._step.forward(x, ids, w, self._adapters(), save=save, pooled_output=True)
        result = out.to(torch.bfloat16)
        self._step.buffers.give(out)
        if saved is not None:
            if len(self._saved) == self.max_cache_depth:
                self._step.release(self._saved.pop(0))
            self._saved.append(saved)
        return result

    @staticmethod
    def _to(t: torch.Tensor, device) -> torch.Tensor:
        return t.to(device) if device is not None else t

    # -- backward -----------------------------------------------------------------------------------
    def backward(self, grad_output, output_device=None, optimizer_grad_scale: float = 1.0):
        """From the gradient of the newest saved forward's output: (grad of hidden_states bf16 [qlen, H],
        grad of the routing weights f32 [qlen, k]); the LoRA (and, full_weight_grad, the expert
        weights') gradients, times optimizer_grad_scale, go into their buffers."""
        scale = self._check_backward(grad_output, optimizer_grad_scale)
        grad_input, grad_weights = self._backward(grad_output, scale)
        return self._to(grad_input, output_device), self._to(grad_weights, output_device)

    def _check_backward(self, grad_output, optimizer_grad_scale) -> float:
        self._idle()
        if not self._saved:
            raise RuntimeError("No forward cache available. Call forward(save_for_backward=True) first.")
        scale = float(optimizer_grad_scale)
        if not math.isfinite(scale) or scale <= 0.0:
            raise ValueError(f"optimizer_grad_scale must be finite and positive, got {optimizer_grad_scale}")
        qlen = self._saved[-1].x.shape[0]
        if tuple(grad_output.shape) != (qlen, self.hidden_size):
            raise ValueError(f"grad_output shape {tuple(grad_output.shape)} must be the saved forward's output shape "
                             f"({qlen}, {self.hidden_size})")
        return scale

    def _backward(self, grad_output, scale: float):
        accumulate = self.validate_authoritative_optimizer_grad_state() == "open"
        saved = self._saved.pop()
        g = grad_output.detach().to("cpu", torch.bfloat16).float()

        def weight_grads(routing, rows, dgate_up, h, dy, picked):   # SFT experts have no biases
            self._expert_weight_grads(routing, rows, dgate_up, h, dy, scale, accumulate)

        grads = self._step.backward(saved, g, weight_grads=weight_grads if self._full_weight_grad else None,
                                    pooled_output=True)
        result = grads.x.to(torch.bfloat16)
        self._step.buffers.give(grads.x)
        if saved.adapters is not None:
            r, I = self.lora_rank, self.moe_intermediate_size
            for name, grad in (("gate_lora_a", grads.gate_up_a[:, :r]), ("up_lora_a", grads.gate_up_a[:, r:]),
                               ("gate_lora_b", grads.gate_up_b[:, :I]), ("up_lora_b", grads.gate_up_b[:, I:]),
                               ("down_lora_a", grads.down_a), ("down_lora_b", grads.down_b)):
                self._write_grad(getattr(self, "grad_" + name), grad, scale, accumulate)
        for owned in self._owned:
            owned.parameter.grad = owned.grad
        return result, grads.weights

    @staticmethod
    def _write_grad(buffer: torch.Tensor, grad: torch.Tensor, scale: float, accumulate: bool) -> None:
        if accumulate:   # summed in f32, rounded once into the bf16 buffer
            buffer.copy_(buffer.float() + grad * scale)
        else:
            buffer.copy_(grad * scale if scale != 1.0 else grad)

    def _expert_weight_grads(self, routing: Routing, rows, dgate_up, h, dy, scale: float, accumulate: bool) -> None:
        """Each expert's gate, up and down gradients into the bf16 buffers (training_step's GEMMs)."""
        if self.gate_proj_buf is None:
            raise RuntimeError("full_weight_grad=True: call init_full_weight_grad_buffers() before backward")
        I = self.moe_intermediate_size
        if not accumulate:   # experts without rows get zero
            for buffer in (self.grad_gate_proj_buf, self.grad_up_proj_buf, self.grad_down_proj_buf):
                buffer.zero_()
        for e, dgu, ddown in expert_weight_grads(routing, rows, dgate_up, h, dy):
            buffers = (self.grad_gate_proj_buf[e], self.grad_up_proj_buf[e], self.grad_down_proj_buf[e])
            for buffer, grad in zip(buffers, (dgu[:I], dgu[I:], ddown)):
                self._write_grad(buffer, grad, scale, accumulate)

    # -- asynchronous forms (kt-kernel's submit / sync pairs) ------------------------------------------
    def _submit(self, kind: str, fn, *args) -> None:
        outcome: dict = {"kind": kind}

        def run():
            try:
                outcome["value"] = fn(*args)
            except BaseException as exc:   # raised by the sync call
                outcome["error"] = exc

        thread = threading.Thread(target=run, name=f"kt-sft-layer-{self.layer_idx}", daemon=True)
        thread.start()
        self._job = (thread, outcome)

    def _sync(self, kind: str):
        if self._job is None or self._job[1]["kind"] != kind:
            raise RuntimeError(f"No pending {kind}. Call submit_{'forward' if kind == 'forward' else 'backward_async'}() "
                               "first.")
        thread, outcome = self._job
        thread.join()
        self._job = None
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def submit_forward(self, hidden_states, expert_ids, weights, save_for_backward: bool = True) -> None:
        """forward() started off the calling thread; sync_forward() returns its output."""
        self._validate_forward_inputs(hidden_states, expert_ids, weights)
        self._submit("forward", self._forward, hidden_states, expert_ids, weights, save_for_backward)

    def sync_forward(self, output_device=None):
        return self._to(self._sync("forward"), output_device)

    def submit_forward_inference(self, hidden_states, expert_ids, weights, cuda_stream=None) -> None:
        """A serving forward (nothing kept for backward); sync_forward_inference() returns it on
        hidden_states' device."""
        self._inference_device = hidden_states.device
        self.submit_forward(hidden_states, expert_ids, weights, save_for_backward=False)

    def sync_forward_inference(self, cuda_stream=None):
        return self.sync_forward(self._inference_device)

    def submit_backward_async(self, grad_output, output_device=None, optimizer_grad_scale: float = 1.0) -> None:
        """backward() started off the calling thread; sync_backward() returns its gradients."""
        scale = self._check_backward(grad_output, optimizer_grad_scale)
        self._backward_device = output_device
        self._submit("backward", self._backward, grad_output, scale)

    def sync_backward(self):
        grad_input, grad_weights = self._sync("backward")
        return self._to(grad_input, self._backward_device), self._to(grad_weights, self._backward_device)

    # -- kt-kernel's buffer-cache class methods ---------------------------------------------------------
    @staticmethod
    def clear_sft_buffer_cache() -> None:
        """Free the reusable buffers the layers' steps share, the step's pool and the grouped products'
        activation scratch (they are re-made by the next step)."""
        ExpertStep.buffers.clear()
        clear_buffer_cache()
