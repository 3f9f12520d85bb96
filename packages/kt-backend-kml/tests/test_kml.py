"""kt-backend-kml's kernels on aarch64 (an ARM host, or qemu-aarch64 through `nox -s aarch64`):
against float64 over the weights their packed codes stand for (the checkpoint formats RAWINT4,
FP8, FP8_PERCHANNEL and MXFP8 loaded as their codes and scales), and every method but BF16
bit-identical across targets (integer dot products: `smull` on ARMv8.0, `sdot` on ARMv8.2; FP8's
f32 arithmetic is the same instructions on each). Elsewhere: skipped, and the
descriptor says it is built for aarch64."""

import numpy as np
import pytest

import kt_backend_kml
import kt_core
from kt_core import MoE
from kt_core.backends import explain, selection
from kt_core.testing.ggml_blocks import dequantize, llama_activations, random_blocks
from kt_core.testing.quantize import checkpoint_inputs, dequantized_weights
from kt_core.testing.reference import moe_reference, random_moe, random_routing, relative_error

ON_ARM = kt_core.host().arch == "aarch64"
E, H, I, K = 8, 256, 128, 2
RUNNABLE = [t["name"] for t in kt_backend_kml.TARGETS if ON_ARM and not kt_core.host().missing(t["features"])]


def test_on_other_architectures_the_descriptor_says_why():
    if ON_ARM:
        pytest.skip("this host is aarch64")
    rows = [r for r in explain() if r["backend"] == "kml"]
    assert rows and all(not r["runnable"] and "aarch64" in r["reason"] for r in rows), rows


def sve_tag(variant):
    """What an SVE target's kernel ids say on this CPU: the vector width its SVE kernels use, or nothing."""
    bits = kt_core.host().sve_vector_bits
    if not variant.startswith("sve") or bits < 256:
        return ""
    return ".sve512." if bits >= 512 else ".sve256."


def forward(method, variant, monkeypatch, w, x, ids, wt, **kw):
    monkeypatch.setenv("KT_CPU_VARIANT", variant)
    selection.reset()
    m = MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method, backend="kml", **kw)
    gate, up, down, scales = checkpoint_inputs(method, *w)   # the checkpoint formats' codes; floats for the rest
    m.load(gate, up, down, scales=scales)
    assert m.backend == f"kml/{variant}"
    return np.asarray(m(x, ids, wt)), m.kernel_id


@pytest.mark.skipif(not ON_ARM, reason=f"aarch64 kernels; this host is {kt_core.host().arch}")
@pytest.mark.parametrize("method,kw,tol", [("BF16", {}, 1e-5), ("INT8", {}, 2e-3), ("INT4", {"group_size": 32}, 2e-3),
                                           ("INT4", {"group_size": 64, "zero_point": True}, 2e-3),
                                           ("INT4", {"group_size": 128}, 2e-3), ("RAWINT4", {}, 2e-3),
                                           ("FP8", {}, 1e-5), ("FP8_PERCHANNEL", {}, 1e-5), ("MXFP8", {}, 1e-5)])
def test_every_target_matches_float64_over_the_stored_weights(method, kw, tol, monkeypatch):
    rng = np.random.default_rng(11)
    w = random_moe(rng, E, H, I)
    tokens = 21
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids, wt = random_routing(rng, tokens, E, K)
    want = moe_reference(x, *dequantized_weights(method, *w, **kw), ids, wt)
    outs = {}
    for variant in RUNNABLE:
        outs[variant], kernel = forward(method, variant, monkeypatch, w, x, ids, wt, **kw)
        err = relative_error(outs[variant], want)
        # bfdot (and bfmmla for row pairs) takes the activations as two bf16 planes (hi + lo, ~16
        # significant bits) and rounds inside the instruction: ~3e-5 measured under qemu, against f32
        # activations' ~1e-6.
        limit = 1e-4 if "bfdot." in kernel else tol
        assert err < limit, f"{kernel}: {err:.2e}"
        # I8MM: INT8/INT4/RAWINT4 run row pairs through smmla (each expert gets ~5 rows here: pairs and
        # a single), which the bit-identity below holds to the sdot / smull targets' integers.
        assert (".smmla+" in kernel) == ("i8mm" in variant and method in ("INT8", "INT4", "RAWINT4")), kernel
        # the SVE targets run every method here through their vector-length agnostic kernels where
        # vectors are 256 bits or wider, through their NEON ones at 128
        tag = sve_tag(variant)
        assert tag in kernel if tag else not any(t in kernel for t in (".sve256.", ".sve512.")), kernel
    if method != "BF16" and len(outs) > 1:   # exact integer sums (FP8: the same f32 instructions), finished alike
        first = next(iter(outs.values()))
        assert all(np.array_equal(first, o) for o in outs.values())


GGML_TYPES = [(t, t, t) for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
                                   "IQ4_XS", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")]
GGML_TYPES += [("Q4_K", "Q4_K", "Q6_K"), ("Q4_K", "Q4_K", "Q5_0"), ("IQ2_XXS", "IQ2_XXS", "IQ3_XXS"), ("IQ1_S", "IQ1_S", "IQ1_M")]


@pytest.mark.skipif(not ON_ARM, reason=f"aarch64 kernels; this host is {kt_core.host().arch}")
@pytest.mark.parametrize("fast", [False, True], ids=["two-pass", "fast"])
@pytest.mark.parametrize("types", GGML_TYPES, ids=["-".join(t) if len(set(t)) > 1 else t[0] for t in GGML_TYPES])
def test_llamafile_matches_float64_over_the_blocks(types, fast, monkeypatch):
    """LLAMAFILE on kt-core's kt-ggml-v8 panels (the bytes kt-backend-avx packs): against float64 over
    gguf-py's dequantized blocks; bit-identical across targets (sdot, smull and, for row pairs on
    I8MM, smmla give the same integer sums, and the f32 epilogue is the same instructions; the grid
    types run one NEON kernel everywhere). Two
    activation passes: within 2e-3 of the output RMS (measured 3.5e-4 to 9.5e-4 here); one pass
    (fast_activations, the default: llama.cpp's activation blocks, Q8_K — one int8 scale per 256
    k — or for the 32-element types Q8_0 — an f16 scale per 32 k) against float64 over exactly those
    activations (llama_activations): 5e-3 (1e-6 where no intermediate value lands on the other
    side of a rounding boundary, ~2e-3 where one does; 0.027 to 0.22 against the exact ones on
    these random layers, llama.cpp's own figure)."""
    rng = np.random.default_rng(17)
    hidden, inter = 256, 256   # K of every matrix a multiple of the K-quants' 256-element blocks
    shapes = ((E, inter, hidden), (E, inter, hidden), (E, hidden, inter))
    blocks = [random_blocks(rng, t, s) for t, s in zip(types, shapes)]
    tokens = 13
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids, wt = random_routing(rng, tokens, E, K)
    dq = [np.stack([dequantize(b[e], t) for e in range(E)]) for b, t in zip(blocks, types)]
    want = moe_reference(x, *dq, ids, wt, activations=llama_activations(types) if fast else None)
    outs = {}
    for variant in RUNNABLE:
        monkeypatch.setenv("KT_CPU_VARIANT", variant)
        selection.reset()
        m = MoE(num_experts=E, top_k=K, hidden_size=hidden, intermediate_size=inter, method="LLAMAFILE", backend="kml",
                weight_types=types, fast_activations=fast)
        m.load(*blocks)
        assert m.backend == f"kml/{variant}" and m.layout_id == "kt-ggml-v8"
        assert (".smmla+" in m.kernel_id) == ("i8mm" in variant), m.kernel_id
        tag = sve_tag(variant)
        assert tag in m.kernel_id if tag else not any(t in m.kernel_id for t in (".sve256.", ".sve512.")), m.kernel_id
        outs[variant] = np.asarray(m(x, ids, wt))
        err = relative_error(outs[variant], want)
        assert err < (5e-3 if fast else 2e-3), f"{m.kernel_id}: {err:.2e}"
    first = next(iter(outs.values()))
    assert all(np.array_equal(first, o) for o in outs.values())


@pytest.mark.skipif(not ON_ARM, reason=f"aarch64 kernels; this host is {kt_core.host().arch}")
@pytest.mark.parametrize("method,kw", [("INT8", {}), ("INT4", {"group_size": 64, "zero_point": True}), ("RAWINT4", {}),
                                       ("FP8", {}), ("MXFP8", {}), ("BF16", {}), ("LLAMAFILE", {})])
def test_row_pairs_match_single_rows(method, kw, monkeypatch):
    """Prefill takes activation rows two at a time (I8MM's smmla / bfmmla; FP8 on every target, its codes
    decoded once for both rows): a batch must give, bit for bit, what the rows give one at a time — but
    BF16 on armv8.6, whose pairs run bfmmla against single rows' bfdot (within 1e-4, each rounding
    inside the instruction)."""
    rng = np.random.default_rng(5)
    hidden, inter = (256, 256) if method == "LLAMAFILE" else (H, I)
    tokens = 9
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids, wt = random_routing(rng, tokens, E, K)
    if method == "LLAMAFILE":
        types = ("Q4_K", "Q4_K", "Q6_K")
        shapes = ((E, inter, hidden), (E, inter, hidden), (E, hidden, inter))
        inputs, kw = ([random_blocks(rng, t, s) for t, s in zip(types, shapes)], {}), {"weight_types": types}
    else:
        gate, up, down, scales = checkpoint_inputs(method, *random_moe(rng, E, hidden, inter))
        inputs = ([gate, up, down], {"scales": scales})
    for variant in RUNNABLE:
        monkeypatch.setenv("KT_CPU_VARIANT", variant)
        selection.reset()
        m = MoE(num_experts=E, top_k=K, hidden_size=hidden, intermediate_size=inter, method=method, backend="kml", **kw)
        m.load(*inputs[0], **inputs[1])
        batch = np.asarray(m(x, ids, wt))
        single = np.concatenate([np.asarray(m(x[t:t + 1], ids[t:t + 1], wt[t:t + 1])) for t in range(tokens)])
        if method == "BF16" and "bfmmla" in m.kernel_id:
            assert relative_error(batch, single) < 1e-4, m.kernel_id
        else:
            assert np.array_equal(batch, single), f"{m.kernel_id}: {relative_error(batch, single):.2e}"
