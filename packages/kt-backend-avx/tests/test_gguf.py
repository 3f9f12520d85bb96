"""LLAMAFILE (GGUF ggml blocks) on every AVX target this host runs: whole MoE forwards against
an FP32 MoE over the weights gguf-py dequantizes, and against the reference backend."""

import functools
import zlib
from dataclasses import replace

import numpy as np
import pytest

import kt_core
from kt_backend_avx import descriptor
from kt_core.backends import discovery, selection
from kt_core.errors import BackendError
from kt_core.testing.ggml_blocks import dequantize, llama_activations, random_blocks
from kt_core.testing.reference import moe_reference

gguf = pytest.importorskip("gguf")

VARIANTS = [v.name for v in descriptor.variants]
# The bound is 2e-2 of the output RMS (max |error|). With two int8 activation passes
# (fast_activations=False) the kernels reached at most 1.9e-3 over 20 seeds x these type sets.
# One pass (the default) carries what llama.cpp's activation blocks carry, Q8_K for the 256-element
# types and Q8_0 for the 32-element ones: against float64 over exactly those activations
# (llama_activations) the kernels measured 1e-6 to 3e-6 — up to 2e-3 where an intermediate value
# lands on the other side of a rounding boundary (the kernels' f32 intermediate against float64
# moves one code by one step); against the exact activations 3e-2 to 1.2e-1 on these random
# layers, llama.cpp's own figure. IQ1_S's one step weighs more: its down rows (values -1, 0, 1 times
# a scale up to 15 d) sum to outputs small against each weight, and at 70 tokens one such step
# measured 7.8e-3 on every target (the reference, float64 inside, 1.2e-6; kt 1e-6 elsewhere).
TOL, ONE_PASS_TOL = 5e-3, 5e-3
ONE_PASS_STEP_TOL = {"IQ1_S": 1e-2}   # one rounding step of the down activations, as above
TYPE_SETS = [("Q4_K", "Q4_K", "Q6_K"), ("Q8_0", "Q8_0", "Q8_0"), ("Q4_0", "Q4_0", "Q4_0"), ("Q5_K", "Q5_K", "Q4_K"),
             ("Q6_K", "Q6_K", "Q6_K"), ("Q2_K", "Q3_K", "Q2_K"), ("IQ4_XS", "IQ4_XS", "Q3_K"), ("IQ2_XXS",) * 3,
             ("IQ2_XXS", "IQ2_XXS", "Q4_K"), ("IQ3_XXS",) * 3, ("IQ2_XXS", "IQ2_XXS", "IQ3_XXS"), ("Q4_1",) * 3,
             ("Q5_0", "Q5_0", "Q5_1"), ("IQ4_NL", "IQ4_NL", "Q5_0"), ("Q4_K", "Q4_K", "Q5_1"), ("IQ1_S",) * 3,
             ("IQ1_S", "IQ1_S", "IQ2_XXS"), ("IQ1_M",) * 3, ("IQ1_M", "IQ1_M", "IQ1_S"),
             ("IQ2_XS",) * 3, ("IQ2_XS", "IQ2_XS", "Q4_K"), ("IQ2_S",) * 3, ("IQ3_S",) * 3, ("IQ2_S", "IQ2_S", "IQ3_S")]


def _rel(out, want) -> float:
    return float(np.abs(np.asarray(out, np.float64) - want).max() / np.sqrt(np.mean(want ** 2)))


def _layer(types, hidden, inter, experts, top_k, **kw):
    return kt_core.MoE(num_experts=experts, top_k=top_k, hidden_size=hidden, intermediate_size=inter,
                       method="LLAMAFILE", weight_types=types, **kw)


def _weights(rng, types, hidden, inter, experts):
    shapes = ((experts, inter, hidden), (experts, inter, hidden), (experts, hidden, inter))
    blocks = [random_blocks(rng, t, s) for t, s in zip(types, shapes)]
    return blocks, [dequantize(b, t) for b, t in zip(blocks, types)]


@pytest.mark.parametrize("types", TYPE_SETS, ids=lambda t: "-".join(t))
@pytest.mark.parametrize("tokens", [1, 5, 70])
@pytest.mark.parametrize("fast", [False, None], ids=["two-pass", "default"])
def test_matches_fp32_over_dequantized_weights(variant, types, tokens, fast):
    """Two activation passes against float64 over the exact activations; the default (one pass,
    llama.cpp's Q8_K or Q8_0 blocks) against float64 over those activations."""
    hidden, inter, experts, top_k = 512, 256, 8, 3
    rng = np.random.default_rng(zlib.crc32(repr((types, tokens)).encode()))
    blocks, dense = _weights(rng, types, hidden, inter, experts)
    layer = _layer(types, hidden, inter, experts, top_k, fast_activations=fast)
    assert layer.backend == f"avx/{variant}"
    one_plane = fast is None
    assert layer.fast_activations == one_plane
    layer.load(*blocks)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)]).astype(np.int64)
    w = rng.random((tokens, top_k)).astype(np.float32)
    want = moe_reference(x, *dense, ids, w, activations=llama_activations(types) if one_plane else None)
    tol = ONE_PASS_STEP_TOL.get(types[2], ONE_PASS_TOL) if one_plane else TOL
    assert _rel(layer(x, ids, w), want) < tol
    oracle = _layer(types, hidden, inter, experts, top_k, backend="reference", fast_activations=fast)
    oracle.load(*blocks)
    assert _rel(layer(x, ids, w), oracle(x, ids, w).astype(np.float64)) < tol


@pytest.mark.parametrize("types", [("Q8_0", "Q8_0", "Q4_0"), ("Q5_1", "Q4_1", "Q5_0"), ("IQ4_NL", "IQ4_NL", "Q5_1")],
                         ids=lambda t: "-".join(t))
def test_fast_activations_and_32_element_blocks(variant, types):
    # K = 96 and 160: the 32-element types need only K % 32, with a short last activation group (two
    # passes: one scale over its 96 or 160 elements; one pass: llama.cpp's Q8_0 blocks of 32).
    hidden, inter = 96, 160
    rng = np.random.default_rng(1)
    blocks, dense = _weights(rng, types, hidden, inter, 4)
    x = rng.standard_normal((9, hidden)).astype(np.float32)
    ids = np.stack([rng.permutation(4)[:2] for _ in range(9)]).astype(np.int64)
    w = rng.random((9, 2)).astype(np.float32)
    for fast, tol, acts in ((False, TOL, None), (True, ONE_PASS_TOL, llama_activations(types))):
        layer = _layer(types, hidden, inter, 4, 2, fast_activations=fast)
        layer.load(*blocks)
        assert _rel(layer(x, ids, w), moe_reference(x, *dense, ids, w, activations=acts)) < tol


@pytest.mark.parametrize("tokens", [1, 70])
def test_bf16_experts_run_on_bf16_kernels(variant, tokens):
    """GGUF BF16 experts (the file's row bytes) run on method BF16's kernels. By default where the
    variant has `vdpbf16ps` with llama.cpp's BF16 numerics (activations rounded to bf16, its
    vec_dot_type): measured 1.4e-5 (1 token) and 9.6e-4 (70) against float64 over those
    activations — f32 intermediates against float64 put a value on the other side of a bf16 step.
    Variants without it keep exact f32 activations (no faster form), as fast_activations=False
    does everywhere: 3e-7 to 1.4e-5 against float64 (the BF16 method's bound, 1e-4)."""
    types, hidden, inter, experts, top_k = ("BF16",) * 3, 512, 256, 8, 3
    rng = np.random.default_rng(tokens)
    blocks, dense = _weights(rng, types, hidden, inter, experts)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)]).astype(np.int64)
    w = rng.random((tokens, top_k)).astype(np.float32)
    exact = (1e-4, None)
    for fast, (tol, acts) in ((None, (2e-3, llama_activations(types)) if "bf16" in variant else exact),
                              (False, exact)):
        layer = _layer(types, hidden, inter, experts, top_k, fast_activations=fast)
        assert (layer.method, layer.kernel_method, layer.backend) == ("LLAMAFILE", "BF16", f"avx/{variant}")
        assert layer.fast_activations == (fast is None) and layer.layout_id.startswith("kt-bf16")
        layer.load(*blocks)
        assert _rel(layer(x, ids, w), moe_reference(x, *dense, ids, w, activations=acts)) < tol


def test_gguf_file_through_the_wrapper(variant, tmp_path):
    """A GGUF file read by the kt application (KTMoEWrapper(weight_path=) finds its reader), run here."""
    gguf_files = pytest.importorskip("kt.testing.gguf_files", reason="reading GGUF files is the kt application's")
    weights = gguf_files.write_moe_gguf(tmp_path / "m.gguf", hidden=256, intermediate=512, experts=8, top_k=2, layers=2,
                             split_max_tensors=3, seed=2)
    w = kt_core.KTMoEWrapper(layer_idx=1, num_experts=8, num_experts_per_tok=2, hidden_size=256,
                             moe_intermediate_size=512, weight_path=str(tmp_path), method="LLAMAFILE")
    w.load_weights()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    ids = np.array([[0, 7], [3, -1], [5, 6], [1, 2]], np.int64)
    wt = rng.random((4, 2)).astype(np.float32)
    assert w._moe.fast_activations   # GGUF: llama.cpp's activation blocks by default (Q4_K, Q6_K: Q8_K)
    want = moe_reference(x, *weights[1], ids, wt, activations=llama_activations(("Q4_K", "Q4_K", "Q6_K")))
    assert _rel(w.forward(x, ids, wt), want) < ONE_PASS_TOL


def test_nan_activations_stay_in_their_token(variant):
    types = ("Q4_K", "Q4_K", "Q6_K")
    rng = np.random.default_rng(4)
    blocks, _ = _weights(rng, types, 256, 256, 2)
    layer = _layer(types, 256, 256, 2, 1)
    layer.load(*blocks)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    x[0, 5] = np.nan
    out = layer(x, np.array([[0], [1]], np.int64), np.ones((2, 1), np.float32))
    assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()


def test_unsupported_type_is_named_with_the_supported_ones(variant, monkeypatch):
    # Every ggml type kt knows runs on every AVX target; a variant listing fewer must refuse the
    # others by name before loading anything, and point at a backend that can run them.
    found = discovery.discover()

    def fewer(d):
        if d.descriptor is None or d.descriptor.name != "avx":
            return d
        variants = tuple(replace(v, ggml_types=("Q4_K", "Q8_0")) for v in d.descriptor.variants)
        return replace(d, descriptor=replace(d.descriptor, variants=variants))

    patched = tuple(fewer(d) for d in found)
    monkeypatch.setattr(selection, "discover", functools.cache(lambda: patched))
    selection.reset()
    with pytest.raises(BackendError, match=r"runs LLAMAFILE for ggml types Q4_K, Q8_0; this layer stores Q6_K "
                                           r"\(backend='reference' can run it\)"):
        kt_core.MoE(num_experts=2, top_k=1, hidden_size=256, intermediate_size=256, method="LLAMAFILE",
                    weight_types=("Q4_K", "Q4_K", "Q6_K"))


def test_q8_0_full_code_range(variant):
    """Q8_0 codes span -128..127 in a file (gguf-py's quantizer never writes -128): the panel
    kernels' unsigned (VNNI) and sign-moving (AVX2, AVX-512BW) products stay exact on all of it."""
    hidden, inter, experts, top_k, tokens = 256, 64, 4, 2, 40
    rng = np.random.default_rng(8)
    types = ("Q8_0",) * 3
    blocks, _ = _weights(rng, types, hidden, inter, experts)
    for b in blocks:   # every code of every block, -128 included, with the blocks' f16 scales kept
        codes = b.reshape(-1, 34)[:, 2:]
        codes[:] = rng.integers(0, 256, size=codes.shape, dtype=np.uint8)
        codes.reshape(-1)[::97] = 0x80
    dense = [dequantize(b, "Q8_0") for b in blocks]
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)]).astype(np.int64)
    w = rng.random((tokens, top_k)).astype(np.float32)
    for fast, acts in ((False, None), (True, llama_activations(types))):
        layer = _layer(types, hidden, inter, experts, top_k, fast_activations=fast)
        layer.load(*blocks)
        assert _rel(layer(x, ids, w), moe_reference(x, *dense, ids, w, activations=acts)) < TOL
