"""DeepSeek-V4-Flash's native MXFP4 experts (kt.weights.native_mxfp4): read as kt-kernel's
MXFP4SafeTensorLoader gives them, and MXFP4_SFT's load_weights() from such a folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

sys.path.insert(0, str(Path(__file__).parents[2] / "kt-core" / "tests"))
from test_sft_wrapper import E, base_weights, batch, lora_tensors, make, mxfp4_experts_data  # noqa: E402

from kt.weights.native_mxfp4 import native_mxfp4_experts  # noqa: E402
from kt_core import WeightsError  # noqa: E402

LAYER = 3


def write_v4_folder(folder: Path, data: dict, prefix: str = f"layers.{LAYER}.ffn.experts", scale_dtype=None):
    """V4-Flash's naming and dtypes: int8 codes, F8_E8M0 scales (uint8 where torch lacks the dtype)."""
    from safetensors.torch import save_file

    e8m0 = scale_dtype or getattr(torch, "float8_e8m0fnu", torch.uint8)
    tensors = {"layers.0.attn.wq.weight": torch.zeros(4, 4)}
    for name, proj in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
        for e, (codes, scale) in enumerate(zip(data[name], data[name + "_scale"])):
            tensors[f"{prefix}.{e}.{proj}.weight"] = codes.view(torch.int8).clone()
            ue8m0 = (scale.view(torch.int16).int() >> 7).to(torch.uint8)
            tensors[f"{prefix}.{e}.{proj}.scale"] = (ue8m0 if e8m0 == torch.uint8 else ue8m0.view(e8m0)
                                                     if e8m0.itemsize == 1 else ue8m0.to(e8m0))
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_the_reader_gives_kt_kernels_form(tmp_path):
    data = mxfp4_experts_data(base_weights())
    for prefix in (f"layers.{LAYER}.ffn.experts", f"model.layers.{LAYER}.ffn.experts"):
        got = native_mxfp4_experts(write_v4_folder(tmp_path / prefix, data, prefix), LAYER)
        assert got.keys() == data.keys()
        for key in data:
            assert len(got[key]) == E and all(torch.equal(a.view(torch.uint8) if a.dtype == torch.uint8 else a, b)
                                              for a, b in zip(got[key], data[key])), key
            assert got[key][0].dtype == data[key][0].dtype


def test_load_weights_from_a_v4_folder_equals_load_mxfp4_weights(tmp_path):
    data = mxfp4_experts_data(base_weights())
    folder = write_v4_folder(tmp_path / "v4", data)
    x, ids, w, _ = batch()
    outs = []
    for load in ("folder", "tensors"):
        wrapper = make("MXFP4_SFT", swiglu_limit=1.5, zero_point=False, layer_idx=LAYER, weight_path=str(folder))
        if load == "folder":
            wrapper.load_weights(torch.arange(E))
        else:
            wrapper.load_mxfp4_weights(data, torch.arange(E))
        lora, grads = lora_tensors()
        wrapper.init_lora_weights(*lora.values(), *grads.values())
        outs.append(wrapper.forward(x, ids, w, save_for_backward=False))
    assert torch.equal(outs[0], outs[1])


def test_bad_folders_are_refused_by_name(tmp_path):
    data = mxfp4_experts_data(base_weights())
    folder = write_v4_folder(tmp_path / "v4", data)
    with pytest.raises(WeightsError, match="holds no MXFP4 experts of layer 2: no model.layers.2.ffn.experts.0.w1"):
        native_mxfp4_experts(folder, 2)
    reserved = dict(data, down_scale=[s.clone() for s in data["down_scale"]])
    reserved["down_scale"][1].view(torch.int16)[0, 0] = 0xFF << 7   # the code 0xff
    with pytest.raises(WeightsError, match=r"layers.3.ffn.experts.1.w2.scale holds the reserved UE8M0 code 0xff"):
        native_mxfp4_experts(write_v4_folder(tmp_path / "reserved", reserved), LAYER)
    with pytest.raises(WeightsError, match="w1.scale should hold UE8M0 scales .* found float32"):
        native_mxfp4_experts(write_v4_folder(tmp_path / "f32", data, scale_dtype=torch.float32), LAYER)
