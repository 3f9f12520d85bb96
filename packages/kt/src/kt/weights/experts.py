"""One layer's routed experts as a checkpoint stores them, in the form MoE.load_experts takes.

`checkpoint_experts` reads the checkpoint's own format (float, FP8 blocks, compressed-tensors
INT4, symmetric GPTQ INT4, ModelOpt NVFP4, MXFP8, MXFP4) per the model family's registry entry —
per-expert tensors or fused [E, H, 2I] ones — checking every tensor's shape and dtype;
`float_experts` gives floats for the methods that quantize (FP8 blocks are dequantized exactly as docs/formats.md defines them).
"""

from __future__ import annotations

import math

from kt_core.errors import WeightsError

from .checkpoint import Checkpoint, _torch, expect_tensor
from .native_mxfp4 import finite_ue8m0

FP8_BLOCK = 128
PROJECTIONS = ("gate", "up", "down")


def projection_shapes(spec) -> dict[str, tuple[int, int]]:
    """[N, K] of each expert matrix of a model (a ModelSpec): rows are output channels."""
    return {"gate": (spec.intermediate, spec.hidden), "up": (spec.intermediate, spec.hidden),
            "down": (spec.hidden, spec.intermediate)}


def _fused(ckpt: Checkpoint, layer: int, expert: int):
    torch = _torch()
    fam, s = ckpt.spec.family, ckpt.spec
    E, H, I = s.num_experts, s.hidden, s.intermediate
    prefix = fam.experts_prefix.format(layer=layer)
    floats = (torch.bfloat16, torch.float16, torch.float32)
    gu_name, down_name = f"{prefix}.{fam.fused.gate_up}", f"{prefix}.{fam.fused.down}"
    down = ckpt.tensor(down_name)
    # Hub checkpoints keep the input dimension first ([E, H, 2I], [E, I, H]); transformers 5 saves some
    # families (Qwen3-VL-MoE) in its own orientation, [E, 2I, H] and [E, H, I], and reads both. down's
    # shape tells them apart (I != H); where it cannot, the family's (FusedExperts.output_first).
    if (fam.fused.output_first if I == H else tuple(down.shape) == (E, H, I)):
        gate_up = expect_tensor(ckpt.tensor(gu_name), gu_name, (E, 2 * I, H), floats,
                                "fused [experts, 2*intermediate, hidden] (as down_proj is [experts, hidden, intermediate])")
        g = gate_up[expert]
        gate, up = (g[0::2], g[1::2]) if fam.fused.interleaved else (g[:I], g[I:])
        return gate.contiguous(), up.contiguous(), down[expert].contiguous()
    gate_up = expect_tensor(ckpt.tensor(gu_name), gu_name, (E, H, 2 * I), floats, "fused [experts, hidden, 2*intermediate]")
    down = expect_tensor(down, down_name, (E, I, H), floats, "fused [experts, intermediate, hidden]")
    g = gate_up[expert]
    gate, up = (g[:, 0::2], g[:, 1::2]) if fam.fused.interleaved else (g[:, :I], g[:, I:])
    return gate.t().contiguous(), up.t().contiguous(), down[expert].t().contiguous()


def _fused_mxfp4(ckpt: Checkpoint, layer: int, expert: int):
    """GPT-OSS's MXFP4 experts as its checkpoints store them: `{gate_up}_blocks` [E, 2I, H/32, 16]
    (two E2M1 codes per byte, rows gate 0, up 0, gate 1, ... when interleaved) with `_scales`
    [E, 2I, H/32] (E8M0), `{down}_blocks` [E, H, I/32, 16] with `_scales` [E, H, I/32]."""
    torch = _torch()
    fam, s = ckpt.spec.family, ckpt.spec
    prefix = fam.experts_prefix.format(layer=layer)
    H, I, E = s.hidden, s.intermediate, s.num_experts
    if H % 32 or I % 32:
        raise WeightsError(f"MXFP4 needs hidden ({H}) and intermediate ({I}) to be multiples of 32")

    def part(name, rows, k):
        blocks = expect_tensor(ckpt.tensor(f"{prefix}.{name}_blocks"), f"{prefix}.{name}_blocks", (E, rows, k // 32, 16),
                               (torch.uint8,), "E2M1 pairs, 16 bytes per 32-element block")
        scales = expect_tensor(ckpt.tensor(f"{prefix}.{name}_scales"), f"{prefix}.{name}_scales", (E, rows, k // 32),
                               (torch.uint8,), "E8M0 exponents, one per 32 elements")
        return blocks[expert].reshape(rows, k // 2), scales[expert]

    gu, gu_s = part(fam.fused.gate_up, 2 * I, H)
    down, down_s = part(fam.fused.down, H, I)
    if fam.fused.interleaved:
        gate, up, gate_s, up_s = gu[0::2], gu[1::2], gu_s[0::2], gu_s[1::2]
    else:
        gate, up, gate_s, up_s = gu[:I], gu[I:], gu_s[:I], gu_s[I:]
    return tuple(t.contiguous() for t in (gate, up, down)), tuple(t.contiguous() for t in (gate_s, up_s, down_s))


def checkpoint_biases(ckpt: Checkpoint, layer: int, expert: int) -> tuple | None:
    """(gate [I], up [I], down [H]) biases of one expert of a family whose experts have them
    (GPT-OSS: `{gate_up}_bias` [E, 2I], interleaved as its weights, `{down}_bias` [E, H]); None for
    the others."""
    fam, s = ckpt.spec.family, ckpt.spec
    if not fam.expert_biases:
        return None
    torch = _torch()
    prefix = fam.experts_prefix.format(layer=layer)
    floats = (torch.bfloat16, torch.float16, torch.float32)
    gu = expect_tensor(ckpt.tensor(f"{prefix}.{fam.fused.gate_up}_bias"), f"{prefix}.{fam.fused.gate_up}_bias",
                       (s.num_experts, 2 * s.intermediate), floats, "gate/up biases")[expert]
    down = expect_tensor(ckpt.tensor(f"{prefix}.{fam.fused.down}_bias"), f"{prefix}.{fam.fused.down}_bias",
                         (s.num_experts, s.hidden), floats, "down biases")[expert]
    gate, up = (gu[0::2], gu[1::2]) if fam.fused.interleaved else (gu[:s.intermediate], gu[s.intermediate:])
    return tuple(t.float() for t in (gate, up, down))


def _expert_part(ckpt: Checkpoint, layer: int, expert: int, proj: str):
    """(name, read): the tensors of one expert's projection `proj` — per-expert ones (`{base}.weight`,
    `{base}.weight_scale_inv`, ...) or a slice of the layer's stacked ones (Step-3.7: `{base}.weight`
    [E, N, K]); read(suffix) gives expert `expert`'s part of `{name}.{suffix}`."""
    fam, experts = ckpt.spec.family, ckpt.spec.num_experts
    if fam.stacked is None:
        base = fam.expert_tensor(layer, expert, proj)
        return base, lambda suffix: ckpt.tensor(f"{base}.{suffix}")
    base = f"{fam.experts_prefix.format(layer=layer)}.{getattr(fam.stacked, proj)}"

    def read(suffix: str):
        t = ckpt.tensor(f"{base}.{suffix}")
        if t.dim() < 2 or t.shape[0] != experts:
            raise WeightsError(f"{base}.{suffix} should stack the layer's {experts} experts along its first axis; "
                               f"found shape {list(t.shape)}")
        return t[expert]
    return base, read


def checkpoint_experts(ckpt: Checkpoint, layer: int, expert: int) -> tuple:
    """(gate, up, down, scales, zeros) of one expert in the checkpoint's own format."""
    torch = _torch()
    fam, quant = ckpt.spec.family, ckpt.spec.quantization
    if fam.fused is not None:
        if quant.method == "MXFP4":
            values, scales = _fused_mxfp4(ckpt, layer, expert)
            return (*values, scales, None)
        if quant.method != "BF16":
            raise WeightsError(f"fused expert tensors are read from float or MXFP4 checkpoints; this one is "
                               f"{quant.method}")
        return (*_fused(ckpt, layer, expert), None, None)
    values, scales, zeros = [], [], []
    for proj, (n, k) in projection_shapes(ckpt.spec).items():
        base, read = _expert_part(ckpt, layer, expert, proj)
        if quant.method == "BF16":
            values.append(expect_tensor(read("weight"), f"{base}.weight", (n, k),
                                        (torch.bfloat16, torch.float16, torch.float32), "float weights"))
        elif quant.method == "FP8":
            values.append(expect_tensor(read("weight"), f"{base}.weight", (n, k),
                                        (torch.float8_e4m3fn,), "FP8 E4M3 weights"))
            scales.append(expect_tensor(read("weight_scale_inv"), f"{base}.weight_scale_inv",
                                        (math.ceil(n / FP8_BLOCK), math.ceil(k / FP8_BLOCK)),
                                        (torch.float32, torch.bfloat16), "one scale per 128x128 block"))
        elif quant.method == "NVFP4":   # weight_scale_2, the tensor's global scale, is NVFP4's second array
            if k % 16:
                raise WeightsError(f"{base}: K = {k} must be a multiple of 16, NVFP4's scale block")
            values.append(expect_tensor(read("weight"), f"{base}.weight", (n, k // 2), (torch.uint8,),
                                        "two E2M1 codes per byte"))
            scales.append(expect_tensor(read("weight_scale"), f"{base}.weight_scale", (n, k // 16),
                                        (torch.float8_e4m3fn, torch.uint8), "E4M3, one per 16 elements"))
            glob = read("weight_scale_2")
            if glob.numel() != 1 or glob.dtype != torch.float32:
                raise WeightsError(f"{base}.weight_scale_2 should be one float32 (the tensor's global scale), found "
                                   f"{glob.dtype} {tuple(glob.shape)}")
            zeros.append(glob.reshape(1, 1))
        elif quant.method == "MXFP4":   # DeepSeek-V4's own: E2M1 pairs (even element low), UE8M0 `.scale`
            if k % 32:
                raise WeightsError(f"{base}: K = {k} must be a multiple of 32, MXFP4's scale block")
            codes = expect_tensor(read("weight"), f"{base}.weight", (n, k // 2),
                                  (torch.int8, torch.uint8), "two E2M1 codes per byte")
            values.append(codes.view(torch.uint8))
            e8m0 = tuple(t for t in (getattr(torch, "float8_e8m0fnu", None),) if t is not None)
            scales.append(finite_ue8m0(expect_tensor(read("scale"), f"{base}.scale", (n, k // 32), (torch.uint8, *e8m0),
                                                     "UE8M0 exponents, one per 32 elements"), f"{base}.scale"))
        elif quant.method == "MXFP8":
            if k % 32:
                raise WeightsError(f"{base}: K = {k} must be a multiple of 32, MXFP8's scale block")
            values.append(expect_tensor(read("weight"), f"{base}.weight", (n, k),
                                        (torch.float8_e4m3fn,), "FP8 E4M3 weights"))
            e8m0 = tuple(t for t in (getattr(torch, "float8_e8m0fnu", None),) if t is not None)
            scales.append(expect_tensor(read("weight_scale_inv"), f"{base}.weight_scale_inv",
                                        (n, k // 32), (torch.uint8, *e8m0), "E8M0 exponents, one per 32 elements"))
        elif quant.method == "GPTQ_INT4":   # K-major qweight/scales; sym=true, so qzeros are implied
            g = quant.group_size
            if k % 8 or k % g:
                raise WeightsError(f"{base}: K = {k} must be a multiple of 8 and of the group size {g}")
            values.append(expect_tensor(read("qweight"), f"{base}.qweight", (k // 8, n), (torch.int32,),
                                        "K-major, 8 INT4 codes per int32"))
            scales.append(expect_tensor(read("scales"), f"{base}.scales", (k // g, n),
                                        (torch.float16, torch.bfloat16, torch.float32), f"K-major, one row per {g} k"))
        else:   # RAWINT4: compressed-tensors pack-quantized
            g = quant.group_size
            if k % 8 or k % g:
                raise WeightsError(f"{base}: K = {k} must be a multiple of 8 and of the group size {g}")
            values.append(expect_tensor(read("weight_packed"), f"{base}.weight_packed", (n, k // 8),
                                        (torch.int32,), "8 INT4 codes per int32"))
            scales.append(expect_tensor(read("weight_scale"), f"{base}.weight_scale", (n, k // g),
                                        (torch.bfloat16, torch.float32), f"one scale per {g} elements"))
    return (*values, tuple(scales) if scales else None, tuple(zeros) if zeros else None)


def dequantize_fp8(values, scale_inv):
    """E4M3 bytes [N, K] times their 128x128 block scales, in f32."""
    torch = _torch()
    n, k = values.shape
    s = scale_inv.to(torch.float32).repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]
    return values.to(torch.float32) * s


def float_experts(ckpt: Checkpoint, layer: int, expert: int) -> tuple:
    """(gate, up, down) of one expert as floats, for methods that quantize them."""
    gate, up, down, scales, _ = checkpoint_experts(ckpt, layer, expert)
    method = ckpt.spec.quantization.method
    if method == "BF16":
        return gate, up, down
    if method == "FP8":
        return tuple(dequantize_fp8(v, s) for v, s in zip((gate, up, down), scales))
    raise WeightsError(f"{method} checkpoints are loaded as they are (method {method}); kt does not requantize them")
