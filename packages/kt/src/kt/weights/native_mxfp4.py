"""DeepSeek-V4-Flash's routed experts as its checkpoint stores them, read for kt-kernel's MXFP4_SFT
(KTMoEWrapper(mode="sft", method="MXFP4_SFT", weight_path=...).load_weights()).

Per expert i of layer L, under `model.layers.L.ffn.experts` or (V4's own keys) `layers.L.ffn.experts`:
  {i}.w1.weight  int8/uint8 [I, H/2]  E2M1 codes, two per byte (gate); .scale  F8_E8M0 [I, H/32]
  {i}.w3.*       the same for up;       {i}.w2.* down [H, I/2] / [H, I/32]
Returned as kt-kernel's MXFP4SafeTensorLoader.load_experts() returns them — uint8 codes, bf16 scales
(UE8M0 exponent e as bf16 2^(e-127): exact) — so the wrapper takes one form from both paths. The
model's config is not read (kt-kernel's does not either); inference reads the same tensors through the
deepseek-v4 family (kt.weights.experts, method MXFP4).
"""

from __future__ import annotations

from pathlib import Path

from kt_core.errors import WeightsError

from .checkpoint import SafetensorsFolder

PROJECTIONS = (("gate", "w1"), ("up", "w3"), ("down", "w2"))


def finite_ue8m0(scale, name: str):
    """UE8M0 scale bytes (uint8, or float8_e8m0fnu viewed as uint8), the reserved code 0xff (NaN)
    refused by name: what kt's MXFP4 packing takes from DeepSeek-V4's `.scale` tensors."""
    import torch

    scale = scale.view(torch.uint8)
    if bool((scale == 0xFF).any()):
        raise WeightsError(f"{name} holds the reserved UE8M0 code 0xff (NaN), which no finite scale stands for")
    return scale


def _bf16_of_ue8m0(scale, name: str):
    import torch

    from kt_core.sft import ue8m0_to_bf16

    if scale.dtype not in (torch.uint8, getattr(torch, "float8_e8m0fnu", None)):
        raise WeightsError(f"{name} should hold UE8M0 scales (float8_e8m0fnu or uint8); found "
                           f"{str(scale.dtype).replace('torch.', '')}")
    return ue8m0_to_bf16(finite_ue8m0(scale, name))


def native_mxfp4_experts(path: str | Path, layer: int) -> dict[str, list]:
    """{gate, up, down: [uint8 codes per expert], gate_scale, up_scale, down_scale: [bf16 per expert]}."""
    import torch

    folder = SafetensorsFolder(path)
    candidates = (f"model.layers.{layer}.ffn.experts", f"layers.{layer}.ffn.experts")
    for prefix in candidates:
        count = 0
        while folder.has(f"{prefix}.{count}.w1.weight"):
            count += 1
        if count:
            break
    else:
        raise WeightsError(f"{path} holds no MXFP4 experts of layer {layer}: no {candidates[0]}.0.w1.weight or "
                           f"{candidates[1]}.0.w1.weight (DeepSeek-V4-Flash's expert names)")
    out: dict[str, list] = {}
    for name, proj in PROJECTIONS:
        codes, scales = [], []
        for e in range(count):
            key = f"{prefix}.{e}.{proj}"
            w = folder.tensor(f"{key}.weight")
            if w.dtype not in (torch.int8, torch.uint8):
                raise WeightsError(f"{key}.weight should hold E2M1 codes two per byte (int8 or uint8); found "
                                   f"{str(w.dtype).replace('torch.', '')}")
            codes.append(w.contiguous().view(torch.uint8))
            scales.append(_bf16_of_ue8m0(folder.tensor(f"{key}.scale"), f"{key}.scale"))
        out[name], out[name + "_scale"] = codes, scales
    folder.close()
    return out
