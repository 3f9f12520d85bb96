"""GGUF experts (method LLAMAFILE) on the reference backend: the reader, the dequantizer held to
gguf-py bit for bit, whole MoE forwards against an FP32 MoE over the dequantized weights,
split and per-expert files, and clear errors for bad files and unsupported types."""

from __future__ import annotations

import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from kt.gguf import GGML_TYPES, open_gguf  # noqa: E402
from kt.testing.gguf_files import write_moe_gguf  # noqa: E402
from kt.weights import load_layer, open_weights  # noqa: E402
from kt_core import KTMoEWrapper, MoE  # noqa: E402
from kt_core.backends.reference import _native as reference_native  # noqa: E402
from kt_core.errors import KTError, WeightsError  # noqa: E402
from kt_core.testing.ggml_blocks import dequantize, llama_activations, random_blocks  # noqa: E402
from kt_core.testing.reference import moe_reference  # noqa: E402


def _rel(out, want) -> float:
    return float(np.abs(np.asarray(out, np.float64) - want).max() / np.sqrt(np.mean(want ** 2)))


def _routing(rng, tokens, experts, top_k):
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)]).astype(np.int64)
    return ids, rng.random((tokens, top_k)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(GGML_TYPES))
def test_dequantize_matches_gguf_py_bit_for_bit(name):
    rng = np.random.default_rng(1)
    blocks = random_blocks(rng, name, (6, 512))
    want = dequantize(blocks, name).reshape(-1)
    got = reference_native.ggml_dequantize(GGML_TYPES[name].kt_dtype, np.ascontiguousarray(blocks).reshape(-1))
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ3_XXS"])
def test_iq_grids_every_entry_and_sign_index(name):
    """IQ2_XXS's and IQ3_XXS's tables (the 256-entry grids kt-core holds, the parity-expanded sign
    bytes) entry by entry: eight blocks name every grid index at least once and every 7-bit sign
    index twice, each scale."""
    rng = np.random.default_rng(2)
    size = GGML_TYPES[name].block_bytes
    blocks = np.zeros((8, size), np.uint8)
    blocks[:, :2] = (rng.uniform(0.25, 1.0, 8) * 1e-3).astype(np.float16).view(np.uint8).reshape(8, 2)
    for b in range(8):
        for j in range(8):
            g = 4 * (8 * b + j)   # this sub-block's first group's number, 0..252
            word = sum(((g + l) % 128) << (7 * l) for l in range(4)) | ((g // 4) % 16) << 28
            word_bytes = np.frombuffer(np.uint32(word).tobytes(), np.uint8)
            if name == "IQ2_XXS":   # per 32: four indices, then the word
                blocks[b, 2 + 8 * j:6 + 8 * j] = np.arange(g, g + 4) % 256
                blocks[b, 6 + 8 * j:10 + 8 * j] = word_bytes
            else:                   # 64 indices (two per group), then the eight words
                blocks[b, 2 + 8 * j:10 + 8 * j] = np.arange(2 * g, 2 * g + 8) % 256
                blocks[b, 66 + 4 * j:70 + 4 * j] = word_bytes
    want = dequantize(blocks, name).reshape(-1)
    got = reference_native.ggml_dequantize(GGML_TYPES[name].kt_dtype, blocks.reshape(-1))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_iq2_xs_grid_every_entry_sign_and_scale():
    """IQ2_XS's 512-entry grid (kt-core's kIq2xsGrid) entry by entry: 16 blocks name every 9-bit index
    once, every 7-bit sign index four times, and every 4-bit scale."""
    rng = np.random.default_rng(4)
    blocks = np.zeros((16, 74), np.uint8)
    blocks[:, :2] = (rng.uniform(0.25, 1.0, 16) * 1e-3).astype(np.float16).view(np.uint8).reshape(16, 2)
    groups = np.arange(512, dtype=np.uint16).reshape(16, 32)
    blocks[:, 2:66] = (groups | ((groups % 128) << 9)).astype("<u2").view(np.uint8).reshape(16, 64)
    blocks[:, 66:74] = (np.arange(128).reshape(16, 8) * 17 % 256).astype(np.uint8)   # both nibbles over 0..15
    want = dequantize(blocks, "IQ2_XS").reshape(-1)
    got = reference_native.ggml_dequantize(GGML_TYPES["IQ2_XS"].kt_dtype, blocks.reshape(-1))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_iq2_s_grid_every_entry_sign_byte_and_scale():
    """IQ2_S's 1024-entry grid (kt-core's kIq2sGrid) entry by entry: 32 blocks name every 10-bit index
    once (low byte in qs, top 2 bits in the sub-block's qh), every sign byte four times, every 4-bit scale."""
    rng = np.random.default_rng(5)
    blocks = np.zeros((32, 82), np.uint8)
    blocks[:, :2] = (rng.uniform(0.25, 1.0, 32) * 1e-3).astype(np.float16).view(np.uint8).reshape(32, 2)
    index = np.arange(1024).reshape(32, 32)   # block b, group g
    blocks[:, 2:34] = index % 256
    blocks[:, 34:66] = (index * 5 + index // 256) % 256   # every byte value, four times over the 1024 groups
    top = (index >> 8).reshape(32, 8, 4)
    blocks[:, 66:74] = (top << np.array([0, 2, 4, 6])).sum(-1)
    blocks[:, 74:82] = (np.arange(256).reshape(32, 8) * 17 % 256).astype(np.uint8)
    want = dequantize(blocks, "IQ2_S").reshape(-1)
    got = reference_native.ggml_dequantize(GGML_TYPES["IQ2_S"].kt_dtype, blocks.reshape(-1))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_iq3_s_grid_every_entry_sign_byte_and_scale():
    """IQ3_S's 512-entry grid (kt-core's kIq3sGrid) entry by entry: 8 blocks name every 9-bit index once
    (low byte in qs, ninth bit in the sub-block's qh), every sign byte once, every 4-bit scale."""
    rng = np.random.default_rng(6)
    blocks = np.zeros((8, 110), np.uint8)
    blocks[:, :2] = (rng.uniform(0.25, 1.0, 8) * 2e-4).astype(np.float16).view(np.uint8).reshape(8, 2)
    index = np.arange(512).reshape(8, 64)   # block b, half group i
    blocks[:, 2:66] = index % 256
    blocks[:, 66:74] = ((index >> 8).reshape(8, 8, 8) << np.arange(8)).sum(-1)
    blocks[:, 74:106] = np.arange(256).reshape(8, 32)
    blocks[:, 106:110] = (np.arange(32).reshape(8, 4) * 17 % 256).astype(np.uint8)   # both nibbles over 0..15
    want = dequantize(blocks, "IQ3_S").reshape(-1)
    got = reference_native.ggml_dequantize(GGML_TYPES["IQ3_S"].kt_dtype, blocks.reshape(-1))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_iq1_s_grid_every_entry_scale_and_delta():
    """IQ1_S's 2048-entry grid (kt-core's kIq1sGrid) entry by entry: 64 blocks name every 11-bit
    index once (low byte in qs, high 3 bits in the sub-block's qh), with every 3-bit scale and both
    signs of the delta."""
    rng = np.random.default_rng(3)
    blocks = np.zeros((64, 50), np.uint8)
    blocks[:, :2] = (rng.uniform(0.25, 1.0, 64) * 3e-3).astype(np.float16).view(np.uint8).reshape(64, 2)
    for b in range(64):
        for j in range(8):
            first = 4 * (8 * b + j)   # the sub-block's four indices: first .. first + 3
            qh = sum(((first + l) >> 8) << (3 * l) for l in range(4)) | ((b + j) % 8) << 12 | (j % 2) << 15
            blocks[b, 2 + 4 * j:6 + 4 * j] = np.arange(first, first + 4) % 256
            blocks[b, 34 + 2 * j:36 + 2 * j] = np.frombuffer(np.uint16(qh).tobytes(), np.uint8)
    want = dequantize(blocks, "IQ1_S").reshape(-1)
    got = reference_native.ggml_dequantize(GGML_TYPES["IQ1_S"].kt_dtype, blocks.reshape(-1))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_dequantize_refuses_partial_blocks_and_unknown_types():
    with pytest.raises(ValueError, match="not whole blocks of 34"):
        reference_native.ggml_dequantize(GGML_TYPES["Q8_0"].kt_dtype, np.zeros(35, np.uint8))
    with pytest.raises(ValueError, match="ggml type 35 is not one"):   # TQ2_0
        reference_native.ggml_dequantize(0x100 + 35, np.zeros(66, np.uint8))


@pytest.mark.parametrize("types", [("Q4_K", "Q4_K", "Q6_K"), ("Q8_0", "Q8_0", "Q4_0"), ("Q5_K", "Q2_K", "Q3_K"),
                                   ("IQ4_XS", "IQ4_XS", "Q8_0"), ("IQ2_XXS", "IQ2_XXS", "Q4_K"),
                                   ("IQ3_XXS", "IQ3_XXS", "IQ2_XXS"), ("Q4_K", "Q4_K", "Q5_0"), ("IQ4_NL", "Q4_1", "Q5_1"),
                                   ("IQ1_S", "IQ1_S", "IQ2_XXS"), ("IQ1_M", "IQ1_M", "IQ1_S"),
                                   ("IQ2_XS", "IQ2_XS", "IQ2_XXS"), ("IQ2_S", "IQ2_S", "IQ3_S")])
def test_wrapper_forward_matches_fp32_moe(tmp_path, types):
    hidden, inter, experts = 256, 512, 6
    weights = write_moe_gguf(tmp_path / "m.gguf", hidden=hidden, intermediate=inter, experts=experts, top_k=2,
                             layers=2, types=types, seed=3)
    w = KTMoEWrapper(layer_idx=1, num_experts=experts, num_experts_per_tok=2, hidden_size=hidden,
                     moe_intermediate_size=inter, weight_path=str(tmp_path / "m.gguf"), method="GGUF",
                     backend="reference")
    w.load_weights()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((7, hidden)).astype(np.float32)
    ids, wt = _routing(rng, 7, experts, 2)
    # By default the layer carries the activation blocks llama.cpp dots each type against (one
    # int8 plane: Q8_K, or Q8_0 for the 32-element types).
    assert w._moe.fast_activations
    want = moe_reference(x, *weights[1], ids, wt, activations=llama_activations(types))
    assert _rel(w.forward(x, ids, wt), want) < 1e-5


@pytest.mark.parametrize("types", [("Q4_K", "Q4_K", "Q5_0"), ("Q5_K", "Q5_K", "Q5_1"), ("IQ4_XS", "IQ4_XS", "IQ4_NL")])
def test_fallback_types_of_a_down_whose_k_is_not_256s(tmp_path, types):
    """What llama-quantize writes when K is not a multiple of 256 (GLM-4.5-Air's and DeepSeek-V2-Lite's
    1408-wide down: Q4_K_M's down in Q5_0, Q5_K's in Q5_1, the IQ types' in IQ4_NL), served by the best
    backend here (the reference on hosts without one) against float64 over llama.cpp's activation
    blocks: measured below 2e-6 on avx (5e-3: an intermediate value on the other side of a
    rounding boundary moves one code, as kt-backend-avx's tests say)."""
    hidden, inter, experts = 256, 352, 6
    weights = write_moe_gguf(tmp_path / "m.gguf", hidden=hidden, intermediate=inter, experts=experts, top_k=2,
                             layers=2, types=types, seed=5)
    w = KTMoEWrapper(layer_idx=1, num_experts=experts, num_experts_per_tok=2, hidden_size=hidden,
                     moe_intermediate_size=inter, weight_path=str(tmp_path / "m.gguf"), method="GGUF")
    w.load_weights()
    rng = np.random.default_rng(6)
    x = rng.standard_normal((9, hidden)).astype(np.float32)
    ids, wt = _routing(rng, 9, experts, 2)
    want = moe_reference(x, *weights[1], ids, wt, activations=llama_activations(types))
    assert _rel(w.forward(x, ids, wt), want) < 5e-3


@pytest.mark.parametrize("backend", ["reference", None])
def test_gemma4_file_serves_gelu_tanh_experts(tmp_path, backend):
    """A gemma4 GGUF's experts gate through GELU-tanh: the wrapper makes its layer so from the file's
    architecture (the LLAMAFILE raw gate/up tile under kt-core's activation), and a layer made for
    SiLU is refused naming it."""
    hidden, inter, experts = 256, 256, 6
    types = ("Q4_K", "Q4_K", "Q8_0")
    weights = write_moe_gguf(tmp_path / "g.gguf", hidden=hidden, intermediate=inter, experts=experts, top_k=2,
                             types=types, seed=5, arch="gemma4")
    w = KTMoEWrapper(layer_idx=0, num_experts=experts, num_experts_per_tok=2, hidden_size=hidden,
                     moe_intermediate_size=inter, weight_path=str(tmp_path / "g.gguf"), method="GGUF", backend=backend)
    assert w._moe.swiglu == (0.0, 0.0, False, "gelu_tanh")
    w.load_weights()
    rng = np.random.default_rng(6)
    x = rng.standard_normal((9, hidden)).astype(np.float32)
    ids, wt = _routing(rng, 9, experts, 2)
    want = moe_reference(x, *weights[0], ids, wt, activations=llama_activations(types), gate_activation="gelu_tanh")
    assert _rel(w.forward(x, ids, wt), want) < (1e-5 if backend == "reference" else 2e-3)
    silu = moe_reference(x, *weights[0], ids, wt, activations=llama_activations(types))
    assert _rel(silu, want) > 0.05
    layer = MoE(num_experts=experts, top_k=2, hidden_size=hidden, intermediate_size=inter, method="LLAMAFILE",
                weight_types=types, backend="reference")
    with pytest.raises(WeightsError, match="is a gemma4 model: create its layers with gate_activation='gelu_tanh'"):
        load_layer(layer, tmp_path / "g.gguf", 0)


@pytest.mark.parametrize("backend", ["reference", None])
def test_gpt_oss_file_mxfp4_experts_with_biases(tmp_path, backend):
    """GPT-OSS's GGUF files: MXFP4 expert blocks (ggml's nibble order, reordered exactly into the
    MXFP4 method's codes: the layer runs MXFP4's kernels), biases in ffn_*_exps.bias and the clamped
    SwiGLU at llama.cpp's gpt-oss constants (limit 7, alpha 1.702), all taken from the file by the
    wrapper. Bound: against float64 over gguf-py's dequantized blocks with the biases — the reference
    backend's f32 activations, the host's int8 activation passes."""
    hidden, inter, experts = 256, 128, 6
    weights = write_moe_gguf(tmp_path / "o.gguf", hidden=hidden, intermediate=inter, experts=experts, top_k=2,
                             layers=2, types=("MXFP4",) * 3, seed=7, arch="gpt-oss", biases=True)
    w = KTMoEWrapper(layer_idx=1, num_experts=experts, num_experts_per_tok=2, hidden_size=hidden,
                     moe_intermediate_size=inter, weight_path=str(tmp_path / "o.gguf"), method="GGUF", backend=backend)
    assert w._moe.kernel_method == "MXFP4" and w._moe.expert_bias and w._moe.swiglu == (7.0, 1.702, False, "silu")
    w.load_weights()
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((9, hidden)) * 4).astype(np.float32)
    ids, wt = _routing(rng, 9, experts, 2)
    gate, up, down, bias = weights[1]
    want = moe_reference(x, gate, up, down, ids, wt, swiglu_limit=7.0, swiglu_alpha=1.702, biases=bias)
    assert _rel(w.forward(x, ids, wt), want) < (1e-5 if backend == "reference" else 5e-3)
    plain = moe_reference(x, gate, up, down, ids, wt)
    assert _rel(plain, want) > 0.05   # the biases and the clamped SwiGLU matter here
    layer = MoE(num_experts=experts, top_k=2, hidden_size=hidden, intermediate_size=inter, method="LLAMAFILE",
                weight_types=("MXFP4",) * 3, backend="reference")
    with pytest.raises(WeightsError, match="is a gpt-oss model: create its layers with swiglu_limit=7.0, swiglu_alpha=1.702, "
                                           "expert_bias=True"):
        load_layer(layer, tmp_path / "o.gguf", 1)


def test_bf16_file_loads_on_the_bf16_kernels(tmp_path, monkeypatch):
    """A GGUF of BF16 experts (convert_hf_to_gguf --outtype bf16) runs on method BF16's packed layout
    (the file's bf16 values exactly); the reference backend computes it in exact f32 (3e-7 against
    float64), the backends' own numerics are tested with them (kt-backend-avx test_gguf.py)."""
    hidden, inter, experts = 256, 512, 6
    weights = write_moe_gguf(tmp_path / "m.gguf", hidden=hidden, intermediate=inter, experts=experts, top_k=2,
                             layers=2, types=("BF16",) * 3, seed=3)
    assert open_gguf(tmp_path / "m.gguf").layer_experts(1).types == ("BF16",) * 3
    w = KTMoEWrapper(layer_idx=1, num_experts=experts, num_experts_per_tok=2, hidden_size=hidden,
                     moe_intermediate_size=inter, weight_path=str(tmp_path / "m.gguf"), method="GGUF",
                     backend="reference")
    w.load_weights()
    assert (w._moe.method, w._moe.kernel_method, w._moe.layout_id) == ("LLAMAFILE", "BF16", "kt-bf16-rowmajor-v1")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((7, hidden)).astype(np.float32)
    ids, wt = _routing(rng, 7, experts, 2)
    assert _rel(w.forward(x, ids, wt), moe_reference(x, *weights[1], ids, wt)) < 1e-5
    # Without torch the packer gets the exact float32 values instead of a bf16 view: same bytes.
    moe = MoE(num_experts=experts, top_k=2, hidden_size=hidden, intermediate_size=inter, method="LLAMAFILE",
              weight_types=("BF16",) * 3, backend="reference")
    experts_bytes = open_gguf(tmp_path / "m.gguf").layer_experts(1)
    monkeypatch.setitem(sys.modules, "torch", None)   # import torch fails
    moe.load_expert(0, *(np.asarray(m[0]).view(np.uint16) for m in experts_bytes.matrices))
    assert moe.packed_expert(0) == w._moe.packed_expert(0)


def test_float_and_block_types_do_not_mix():
    with pytest.raises(ValueError, match="gate, up, down are BF16, BF16, Q4_K: kt runs a layer's GGUF experts either all"):
        MoE(num_experts=2, top_k=1, hidden_size=256, intermediate_size=256, method="LLAMAFILE",
            weight_types=("BF16", "BF16", "Q4_K"))
    moe = MoE(num_experts=2, top_k=1, hidden_size=64, intermediate_size=32, method="LLAMAFILE",
              weight_types=("BF16",) * 3, backend="reference")
    with pytest.raises(TypeError, match=r"gate must be a 2-D matrix of GGUF BF16 bytes .* got int32 \[32, 64\]"):
        moe.load_expert(0, np.zeros((32, 64), np.int32), np.zeros((32, 128), np.uint8), np.zeros((64, 64), np.uint8))


def test_split_files_and_folder(tmp_path):
    weights = write_moe_gguf(tmp_path / "model.gguf", hidden=256, intermediate=256, experts=4, top_k=2, layers=3,
                             types=("Q8_0", "Q8_0", "Q8_0"), seed=5, split_max_tensors=2)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"model-{i:05d}-of-00005.gguf" for i in range(1, 6)]
    for path in (tmp_path, tmp_path / files[2]):   # the folder, or any file of the set
        model = open_weights(path)
        assert len(model.files) == 5 and model.moe_layers() == [0, 1, 2]
    moe = MoE(num_experts=4, top_k=2, hidden_size=256, intermediate_size=256, method="LLAMAFILE",
              weight_types=("Q8_0",) * 3, backend="reference", fast_activations=False)   # exact activations
    load_layer(moe, tmp_path, 2)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    ids, wt = _routing(rng, 3, 4, 2)
    assert _rel(moe(x, ids, wt), moe_reference(x, *weights[2], ids, wt)) < 1e-5

    (tmp_path / files[3]).unlink()
    with pytest.raises(KTError, match="model-00004-of-00005.gguf is missing"):
        open_gguf(tmp_path / files[0])


def test_per_expert_tensors(tmp_path):
    weights = write_moe_gguf(tmp_path / "m.gguf", hidden=256, intermediate=256, experts=3, top_k=1,
                             types=("Q4_0", "Q4_K", "Q6_K"), per_expert=True, arch="llama", seed=7)
    model = open_gguf(tmp_path / "m.gguf")
    assert model.layer_experts(0).types == ("Q4_0", "Q4_K", "Q6_K")
    moe = MoE(num_experts=3, top_k=1, hidden_size=256, intermediate_size=256, method="LLAMAFILE",
              weight_types=("Q4_0", "Q4_K", "Q6_K"), backend="reference", fast_activations=False)
    load_layer(moe, model, 0, physical_to_logical_map=[2, 0, 1])
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    ids = np.array([[0], [1], [2], [0]], np.int64)
    wt = np.ones((4, 1), np.float32)
    gate, up, down = (m[[2, 0, 1]] for m in weights[0])
    assert _rel(moe(x, ids, wt), moe_reference(x, gate, up, down, ids, wt)) < 1e-5


def test_truncated_and_corrupted_files_raise(tmp_path):
    write_moe_gguf(tmp_path / "m.gguf", hidden=256, intermediate=256, experts=2, top_k=1, seed=9)
    data = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:len(data) - 1000])
    with pytest.raises(KTError, match="cut.gguf is not a readable GGUF file"):
        open_gguf(tmp_path / "cut.gguf")
    (tmp_path / "head.gguf").write_bytes(data[:40])
    with pytest.raises(KTError, match="head.gguf is not a readable GGUF file"):
        open_gguf(tmp_path / "head.gguf")
    bad = bytearray(data)
    bad[:4] = b"XXXX"
    (tmp_path / "magic.gguf").write_bytes(bytes(bad))
    with pytest.raises(KTError, match="magic.gguf is not a readable GGUF file"):
        open_gguf(tmp_path / "magic.gguf")


def test_geometry_and_types_are_checked(tmp_path):
    path = tmp_path / "m.gguf"
    write_moe_gguf(path, hidden=256, intermediate=256, experts=4, top_k=2, types=("Q4_K", "Q4_K", "Q6_K"), seed=10)
    common = dict(layer_idx=0, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256, weight_path=str(path),
                  method="LLAMAFILE", backend="reference")
    with pytest.raises(WeightsError, match="hidden=256.*hidden_size=512"):
        KTMoEWrapper(hidden_size=512, **common).load_weights()
    with pytest.raises(WeightsError, match="routes each token to 2 experts"):
        KTMoEWrapper(hidden_size=256, **{**common, "num_experts_per_tok": 3}).load_weights()
    with pytest.raises(WeightsError, match="outside this qwen3moe model's 1 layers"):
        KTMoEWrapper(hidden_size=256, **{**common, "layer_idx": 4})
    moe = MoE(num_experts=4, top_k=2, hidden_size=256, intermediate_size=256, method="LLAMAFILE",
              weight_types=("Q4_K", "Q4_K", "Q4_K"), backend="reference")
    with pytest.raises(WeightsError, match="stores gate, up, down as Q4_K, Q4_K, Q6_K"):
        load_layer(moe, path, 0)
    int8 = MoE(num_experts=4, top_k=2, hidden_size=256, intermediate_size=256, method="INT8", backend="reference")
    with pytest.raises(WeightsError, match="load with method LLAMAFILE"):
        load_layer(int8, path, 0)


def test_unsupported_types_and_block_sizes(tmp_path):
    with pytest.raises(ValueError, match="ggml type 'TQ2_0' is not one kt reads; known: Q4_0, Q4_1"):
        MoE(num_experts=2, top_k=1, hidden_size=256, intermediate_size=256, method="LLAMAFILE",
            weight_types=("TQ2_0", "Q4_K", "Q4_K"))
    with pytest.raises(ValueError, match="down is Q4_K, whose blocks hold 256 elements.*K = 96"):
        MoE(num_experts=2, top_k=1, hidden_size=256, intermediate_size=96, method="LLAMAFILE",
            weight_types=("Q4_K", "Q4_K", "Q4_K"))
    with pytest.raises(ValueError, match="needs weight_types"):
        MoE(num_experts=2, top_k=1, hidden_size=256, intermediate_size=256, method="LLAMAFILE")
    # 32-element blocks need only K % 32: no 256 restriction for Q8_0/Q4_0 layers.
    moe = MoE(num_experts=2, top_k=1, hidden_size=96, intermediate_size=160, method="LLAMAFILE",
              weight_types=("Q8_0", "Q8_0", "Q4_0"), backend="reference", fast_activations=False)
    rng = np.random.default_rng(11)
    gate, up = (random_blocks(rng, "Q8_0", (2, 160, 96)) for _ in range(2))
    down = random_blocks(rng, "Q4_0", (2, 96, 160))
    moe.load(gate, up, down)
    x = rng.standard_normal((2, 96)).astype(np.float32)
    ids, wt = np.array([[0], [1]], np.int64), np.ones((2, 1), np.float32)
    want = moe_reference(x, dequantize(gate, "Q8_0"), dequantize(up, "Q8_0"), dequantize(down, "Q4_0"), ids, wt)
    assert _rel(moe(x, ids, wt), want) < 1e-5

    # A GGUF whose experts use a type kt does not read names it and the supported ones.
    w = gguf.GGUFWriter(str(tmp_path / "f16.gguf"), "qwen3moe")
    for key, value in (("add_block_count", 1), ("add_embedding_length", 64), ("add_expert_feed_forward_length", 32),
                       ("add_expert_count", 2), ("add_expert_used_count", 1)):
        getattr(w, key)(value)
    for proj, shape in (("gate", (2, 32, 64)), ("up", (2, 32, 64)), ("down", (2, 64, 32))):
        w.add_tensor(f"blk.0.ffn_{proj}_exps.weight", np.zeros(shape, np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(WeightsError, match="stored as F16, which kt's LLAMAFILE method does not read; it reads Q4_0.*BF16, MXFP4 "
                                           r"\(llama-quantize can rewrite the file as BF16 or Q8_0\)"):
        open_gguf(tmp_path / "f16.gguf").layer_experts(0)


def test_packer_refuses_wrong_bytes_and_non_finite_scales():
    moe = MoE(num_experts=1, top_k=1, hidden_size=256, intermediate_size=512, method="LLAMAFILE",
              weight_types=("Q4_K",) * 3, backend="reference")
    rng = np.random.default_rng(12)
    gate, up = (random_blocks(rng, "Q4_K", (512, 256)) for _ in range(2))
    down = random_blocks(rng, "Q4_K", (256, 512))
    with pytest.raises(Exception, match=r"gate \(Q4_K\) must be uint8 \[512, 144\]"):
        moe.load_expert(0, gate[:, :100], up, down)
    down = down.copy()
    down[3, 144:146] = np.array([np.inf], np.float16).view(np.uint8)
    with pytest.raises(Exception, match=r"down \(Q4_K\) row 3 block 1 has a NaN or Inf scale"):
        moe.load_expert(0, gate, up, down)


@pytest.mark.parametrize("backend", ["reference", None])
def test_iq1_m_d_spread_over_four_words_is_checked(backend):
    """IQ1_M's f16 d lives in the top nibbles of four words: an Inf there is refused as any scale."""
    moe = MoE(num_experts=1, top_k=1, hidden_size=256, intermediate_size=256, method="LLAMAFILE",
              weight_types=("IQ1_M",) * 3, backend=backend)
    rng = np.random.default_rng(13)
    gate, up, down = (random_blocks(rng, "IQ1_M", (256, 256)) for _ in range(3))
    moe.load_expert(0, gate, up, down)   # finite: loads
    inf = int(np.array([np.inf], np.float16).view(np.uint16)[0])
    up = up.copy()
    for m in range(4):   # block 0 of row 5: d's nibble m in word m's top nibble
        up[5, 49 + 2 * m] = (up[5, 49 + 2 * m] & 0x0F) | (((inf >> (4 * m)) & 0x0F) << 4)
    with pytest.raises(Exception, match=r"up \(IQ1_M\) row 5 (block 0 )?has a NaN or Inf"):
        moe.load_expert(0, gate, up, down)


def test_missing_metadata_is_named(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "bare.gguf"), "qwen3moe")
    w.add_block_count(1)
    w.add_expert_count(2)
    w.add_tensor("blk.0.ffn_gate_exps.weight", random_blocks(np.random.default_rng(0), "Q8_0", (2, 32, 64)),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(WeightsError, match="has neither qwen3moe.expert_feed_forward_length nor"):
        open_gguf(tmp_path / "bare.gguf")


def test_backends_list_their_ggml_types():
    from kt_core.backends import explain

    row = next(r for r in explain() if r["backend"] == "reference")
    assert "LLAMAFILE" in row["methods"]
    assert row["ggml_types"] == list(GGML_TYPES)   # the oracle reads every type kt knows
