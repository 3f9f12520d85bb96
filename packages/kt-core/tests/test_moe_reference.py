"""The reference backend against a float64 NumPy MoE: the numbers every other backend inherits."""

import numpy as np
import pytest

import kt_core
from kt_core.testing import quantize
from kt_core.testing.reference import bf16_round, moe_reference, random_moe, random_routing, relative_error

# Kernel error: reference backend vs float64 over the weights the format stores.
# Format error: the same output vs float64 over the unquantized weights.
KERNEL_TOL = {"FP32": 1e-6, "BF16": 1e-6}
FORMAT_TOL = {"FP32": 1e-6, "BF16": 2e-2}


@pytest.mark.parametrize("method", ["FP32", "BF16"])
@pytest.mark.parametrize("tokens", [1, 5, 128])
def test_reference_backend_against_float64(method, tokens):
    rng = np.random.default_rng(tokens)
    E, H, I, K = 8, 96, 40, 3
    w = random_moe(rng, E, H, I)
    m = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method, backend="reference")
    m.load(*w)
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids, wt = random_routing(rng, tokens, E, K)
    out = m(x, ids, wt)
    stored = [bf16_round(a) for a in w] if method == "BF16" else w
    kernel_err = relative_error(out, moe_reference(x, *stored, ids, wt))
    format_err = relative_error(out, moe_reference(x, *w, ids, wt))
    assert kernel_err < KERNEL_TOL[method], kernel_err
    assert format_err < FORMAT_TOL[method], format_err


def test_bf16_packer_matches_torch_rounding():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    w = random_moe(rng, 2, 64, 32)
    m = kt_core.MoE(num_experts=2, top_k=1, hidden_size=64, intermediate_size=32, method="BF16", backend="reference")
    m.load(*w)
    # A one-hot token reads one column of gate/up: compare against torch's bf16 conversion.
    for a, b in zip((bf16_round(x) for x in w), (torch.from_numpy(x).to(torch.bfloat16).float().numpy() for x in w)):
        np.testing.assert_array_equal(a, b)


def test_float16_and_float64_inputs_are_accepted():
    rng = np.random.default_rng(3)
    w = random_moe(rng, 4, 32, 16)
    m = kt_core.MoE(num_experts=4, top_k=2, hidden_size=32, intermediate_size=16, method="FP32", backend="reference")
    m.load(*[a.astype(np.float16) for a in w])
    x = rng.standard_normal((3, 32))
    ids, wt = random_routing(rng, 3, 4, 2)
    for dtype in (np.float16, np.float64):
        out = m(x.astype(dtype), ids, wt)
        assert out.dtype == dtype
        ref = moe_reference(x.astype(dtype), *[a.astype(np.float16) for a in w], ids, wt)
        assert relative_error(out, ref) < (2e-3 if dtype == np.float16 else 1e-6)


@pytest.mark.parametrize("method", ["FP32", "BF16", "INT8"])
@pytest.mark.parametrize("limit,alpha", [(7.0, 1.702), (0.5, 0.0), (0.0, 1.702)])
def test_reference_backend_applies_the_clamped_swiglu(method, limit, alpha):
    """The oracle every backend's conformance compares with, against NumPy's formula
    (kt_core.testing.reference.gated) on the same stored weights."""
    rng = np.random.default_rng(3)
    w = random_moe(rng, 6, 64, 32)
    layer = kt_core.MoE(num_experts=6, top_k=2, hidden_size=64, intermediate_size=32, method=method,
                        backend="reference", swiglu_limit=limit, swiglu_alpha=alpha)
    layer.load(*w)
    x = rng.standard_normal((5, 64)).astype(np.float32) * np.float32(3.0 if limit > 1 else 1.0)
    ids, wt = random_routing(rng, 5, 6, 2)
    stored = quantize.dequantized_weights(method, *w)
    want = moe_reference(x, *stored, ids, wt, swiglu_limit=limit, swiglu_alpha=alpha)
    assert relative_error(layer(x, ids, wt), want) < (1e-5 if method == "FP32" else 5e-3)
    plain = moe_reference(x, *stored, ids, wt)
    assert relative_error(plain, want) > 1e-2, "the clamps and alpha must change this output"


@pytest.mark.parametrize("backend", ["reference", None])
@pytest.mark.parametrize("method", ["FP32", "BF16", "INT8"])
def test_limit_after_silu(method, backend):
    """Step-3.5's / Ling-2.5's experts, min(SiLU(g), limit) * clamp(u, -limit, limit): kt-core applies
    it to any backend's raw gate/up products (the host's best backend, and the reference), against
    NumPy's formula on the same stored weights; the layer's kernels see no swiglu setting."""
    rng = np.random.default_rng(4)
    w = random_moe(rng, 6, 64, 32)
    layer = kt_core.MoE(num_experts=6, top_k=2, hidden_size=64, intermediate_size=32, method=method, backend=backend,
                        swiglu_limit=0.5, swiglu_limit_after_act=True)
    assert layer.raw_gate_up and layer.swiglu == (0.5, 0.0, True, "silu")
    layer.load(*w)
    x = rng.standard_normal((9, 64)).astype(np.float32) * np.float32(3.0)
    ids, wt = random_routing(rng, 9, 6, 2)
    stored = quantize.dequantized_weights(method, *w)
    want = moe_reference(x, *stored, ids, wt, swiglu_limit=0.5, limit_after_act=True)
    assert relative_error(layer(x, ids, wt), want) < (1e-5 if method == "FP32" else 5e-3)
    before = moe_reference(x, *stored, ids, wt, swiglu_limit=0.5)
    assert relative_error(before, want) > 1e-2, "a limit after SiLU must differ from the one before it here"


@pytest.mark.parametrize("backend", ["reference", None])
@pytest.mark.parametrize("method", ["FP32", "BF16", "INT8"])
def test_gelu_tanh(method, backend):
    """Gemma 4's experts, GELU-tanh(g) * u: kt-core applies it to any backend's raw gate/up products,
    against NumPy's tanh formula on the same stored weights."""
    rng = np.random.default_rng(5)
    w = random_moe(rng, 6, 64, 32)
    layer = kt_core.MoE(num_experts=6, top_k=2, hidden_size=64, intermediate_size=32, method=method, backend=backend,
                        gate_activation="gelu_tanh")
    assert layer.raw_gate_up and layer.swiglu == (0.0, 0.0, False, "gelu_tanh")
    layer.load(*w)
    x = rng.standard_normal((9, 64)).astype(np.float32) * np.float32(3.0)
    ids, wt = random_routing(rng, 9, 6, 2)
    stored = quantize.dequantized_weights(method, *w)
    want = moe_reference(x, *stored, ids, wt, gate_activation="gelu_tanh")
    assert relative_error(layer(x, ids, wt), want) < (1e-5 if method == "FP32" else 5e-3)
    assert relative_error(moe_reference(x, *stored, ids, wt), want) > 1e-2, "GELU-tanh must differ from SiLU here"


def test_swiglu_settings_are_checked():
    with pytest.raises(ValueError, match="swiglu_limit and swiglu_alpha must be finite and >= 0"):
        kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="FP32", backend="reference",
                    swiglu_limit=-1.0)
    with pytest.raises(ValueError, match="swiglu_limit_after_act needs swiglu_limit > 0 and swiglu_alpha 0"):
        kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="FP32", backend="reference",
                    swiglu_limit_after_act=True)
    with pytest.raises(ValueError, match="gate_activation is 'silu' or 'gelu_tanh', got 'gelu'"):
        kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="FP32", backend="reference",
                    gate_activation="gelu")
    with pytest.raises(ValueError, match="gate_activation 'gelu_tanh' takes no swiglu_limit"):
        kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="FP32", backend="reference",
                    gate_activation="gelu_tanh", swiglu_limit=7.0)


@pytest.mark.parametrize("types", [("Q4_K", "Q4_K", "Q6_K"), ("Q2_K", "Q3_K", "Q5_K"), ("IQ4_XS",) * 3,
                                   ("Q8_0", "Q8_0", "Q4_0"), ("Q4_K", "Q4_K", "Q8_0"), ("Q5_1", "Q4_1", "Q5_0"),
                                   ("IQ1_M", "IQ1_S", "IQ4_NL"), ("IQ2_XS", "IQ2_XS", "IQ2_XXS"),
                                   ("IQ2_S", "IQ2_S", "IQ3_S")], ids=lambda t: "-".join(t))
def test_reference_llamafile_activation_precisions(types):
    """LLAMAFILE's two activation precisions on the reference backend, the oracle of every
    kernel: exact f32 activations (fast_activations=False), and with fast_activations=True (the
    default) what llama.cpp's activation blocks carry for each matrix's type — Q8_K
    (ggml_blocks.q8k_activations, written from ggml's quantize_row_q8_K) or, for the 32-element types,
    Q8_0 (q8_0_activations, from its x86 quantize_row_q8_0: f16 scales per 32)."""
    pytest.importorskip("gguf")
    from kt_core.testing.ggml_blocks import dequantize, llama_activations, random_blocks

    # K = 320 for the 32-element types: a short last activation group (64 of 256) in two passes.
    E, K, T = 6, 2, 9
    H, I = (320, 96) if types[0] in ("Q8_0", "Q5_1") else (512, 256)
    rng = np.random.default_rng(3)
    blocks = [random_blocks(rng, t, s) for t, s in zip(types, ((E, I, H), (E, I, H), (E, H, I)))]
    dense = [dequantize(b, t) for b, t in zip(blocks, types)]
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids, wt = random_routing(rng, T, E, K)
    exact = moe_reference(x, *dense, ids, wt)
    one_plane = moe_reference(x, *dense, ids, wt, activations=llama_activations(types))
    assert relative_error(one_plane, exact) > 1e-2   # the two precisions differ measurably (3e-2 to 1.2e-1)
    outs = {}
    for fast in (False, True, None):
        m = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="LLAMAFILE",
                        weight_types=types, backend="reference", fast_activations=fast)
        m.load(*blocks)
        outs[fast] = m(x, ids, wt)
        assert m.fast_activations == (fast is not False)
        assert relative_error(outs[fast], one_plane if m.fast_activations else exact) < 1e-5   # measured 3e-7 to 1.6e-6
    assert np.array_equal(outs[None], outs[True])
