"""The conformance suite: any backend's MoE against kt-core's reference backend.

Run through the plugin (see kt_core.testing.plugin). Each test gets `kt_variant` =
(descriptor, variant, method) with the variant forced, and compares the backend with the
reference backend on the same weights: the reference packs them in the same format, so
the difference measures the kernel, not the format. Checkpoint formats (RAWINT4, FP8,
FP8_PERCHANNEL, MXFP4, MXFP8, NVFP4, GPTQ_INT4) get the same checkpoint tensors, made by kt_core.testing.quantize.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ..errors import BackendError
from ..formats.codes import int4_group_for
from ..moe import MoE
from .ggml_blocks import random_blocks
from .quantize import checkpoint_arrays
from .reference import random_moe, random_routing, relative_error


def _group_size(method, hidden, intermediate):
    """The layer's group_size: INT4's default for the shape (int4_group_for), 0 (the format's own)
    for the rest; skips shapes no group divides (RAWINT4's is fixed at 32)."""
    try:
        if method in ("INT4", "GPTQ_INT4"):
            return int4_group_for(hidden, intermediate)
    except ValueError as exc:
        pytest.skip(str(exc))
    fixed = {"RAWINT4": 32, "MXFP4": 32, "MXFP8": 32, "NVFP4": 16}.get(method)
    if fixed and (hidden % fixed or intermediate % fixed):
        pytest.skip(f"{method}'s group of {fixed} must divide hidden={hidden} and intermediate={intermediate}")
    return 0


def _ggml_types(hidden, intermediate):
    """LLAMAFILE's ggml types for a shape as a Q4_K_M file has them: Q4_K gate/up and Q6_K down where
    K allows 256-element blocks, else llama-quantize's 32-element fallbacks for them, Q5_0 and Q8_0;
    skips K not a multiple of 32."""
    def pick(k, big, small):
        if k % 32:
            pytest.skip(f"LLAMAFILE's ggml blocks need K % 32 == 0; hidden={hidden}, intermediate={intermediate}")
        return big if k % 256 == 0 else small

    gate_up = pick(hidden, "Q4_K", "Q5_0")
    return (gate_up, gate_up, pick(intermediate, "Q6_K", "Q8_0"))


def _inputs(method, rng, experts, hidden, intermediate, group_size):
    """(gate, up, down, scales, zeros, weight_types) as MoE.load / MoE take them for `method`."""
    if method == "LLAMAFILE":
        types = _ggml_types(hidden, intermediate)
        shapes = ((experts, intermediate, hidden), (experts, intermediate, hidden), (experts, hidden, intermediate))
        return (*(random_blocks(rng, t, s) for t, s in zip(types, shapes)), None, None, types)
    return (*checkpoint_arrays(method, *random_moe(rng, experts, hidden, intermediate), group_size=group_size), None)


def _pair(kt_variant, *, experts, hidden, intermediate, top_k, max_tokens=4096, mask=None, seed=0, swiglu=(0.0, 0.0),
          biases=False, trainable=False, fast_activations=None, gate_activation="silu"):
    descriptor, variant, method = kt_variant
    rng = np.random.default_rng(seed)
    group_size = _group_size(method, hidden, intermediate)
    gate, up, down, scales, zeros, weight_types = _inputs(method, rng, experts, hidden, intermediate, group_size)
    bias = None
    if biases:   # GPT-OSS-sized biases: comparable to the products they are added to
        bias = tuple(rng.standard_normal(shape).astype(np.float32) * np.float32(0.5)
                     for shape in ((experts, intermediate), (experts, intermediate), (experts, hidden)))
    layers = []
    for backend in (descriptor.name, "reference"):
        try:
            layer = MoE(num_experts=experts, top_k=top_k, hidden_size=hidden, intermediate_size=intermediate,
                        method=method, gpu_experts_mask=mask, max_tokens=max_tokens, backend=backend,
                        group_size=group_size, weight_types=weight_types, swiglu_limit=swiglu[0],
                        swiglu_alpha=swiglu[1], expert_bias=biases, trainable=trainable,
                        fast_activations=fast_activations, swiglu_limit_after_act=len(swiglu) > 2 and swiglu[2],
                        gate_activation=gate_activation)
        except BackendError as exc:
            if "declines" in str(exc) or backend == "reference":
                pytest.skip(f"{backend} cannot run {method} at hidden={hidden}, intermediate={intermediate}: {exc}")
            # Training needs the optional transposed tiles (ABI 1.5).
            if trainable and "transposed tiles" in str(exc):
                pytest.skip(f"{backend} {method} has no transposed tiles, so no training: {exc}")
            raise
        except ValueError as exc:
            # The clamped SwiGLU is an optional capability a kernel table claims (ABI 1.2).
            if "KT_ACTIVATION_SWIGLU" in str(exc) and backend != "reference":
                pytest.skip(f"{backend} {method} does not claim KT_ACTIVATION_SWIGLU: {exc}")
            # Expert biases need the optional raw gate/up tile (ABI 1.4).
            if (biases or len(swiglu) > 2 or gate_activation != "silu") and "gate_up_raw_tile" in str(exc) \
                    and backend != "reference":
                pytest.skip(f"{backend} {method} has no gate_up_raw_tile, so no expert biases, limit after SiLU or "
                            f"GELU-tanh: {exc}")
            raise
        layer.load(gate, up, down, scales=scales, zeros=zeros, biases=bias)
        layers.append(layer)
    if layers[0].backend.split("/")[1] != variant.name:
        raise AssertionError(f"asked for variant {variant.name}, got {layers[0].backend}")
    return layers[0], layers[1], rng


def _check(layer, oracle, x, ids, w, tol, method):
    out, want = layer(x, ids, w), oracle(x, ids, w)
    err = relative_error(out, want)
    assert err <= tol[method], f"{layer.backend} {method}: error {err:.3e} vs reference exceeds {tol[method]:.1e}"
    return out


@pytest.mark.parametrize("hidden,intermediate", [(64, 32), (96, 80), (256, 192), (130, 70)])
@pytest.mark.parametrize("tokens", [1, 3, 64])
def test_matches_reference(kt_variant, kt_tolerance, hidden, intermediate, tokens):
    layer, oracle, rng = _pair(kt_variant, experts=8, hidden=hidden, intermediate=intermediate, top_k=2)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids, w = random_routing(rng, tokens, 8, 2)
    _check(layer, oracle, x, ids, w, kt_tolerance, kt_variant[2])


@pytest.mark.parametrize("fast", [False, True], ids=["two-pass", "one-pass"])
@pytest.mark.parametrize("hidden,intermediate", [(256, 512), (96, 160)])
def test_llamafile_activation_precisions_match_reference(kt_variant, kt_tolerance, fast, hidden, intermediate):
    """LLAMAFILE's activation precision is a choice (by default one int8 plane, llama.cpp's Q8_K
    or Q8_0 blocks; two planes with fast_activations=False): both, on K-quants (256, 512) and on
    the 32-element types (96, 160), against the reference at the same precision."""
    if kt_variant[2] != "LLAMAFILE":
        pytest.skip("only LLAMAFILE's kernels follow the reference's one-pass activations")
    layer, oracle, rng = _pair(kt_variant, experts=8, hidden=hidden, intermediate=intermediate, top_k=2,
                               fast_activations=fast)
    assert layer.fast_activations == oracle.fast_activations == fast
    x = rng.standard_normal((17, hidden)).astype(np.float32)
    ids, w = random_routing(rng, 17, 8, 2)
    _check(layer, oracle, x, ids, w, kt_tolerance, "LLAMAFILE")


@pytest.mark.parametrize("limit,alpha", [(7.0, 1.702), (0.5, 0.0), (0.0, 1.702)])
@pytest.mark.parametrize("tokens", [1, 3, 64])
def test_clamped_swiglu_matches_reference(kt_variant, kt_tolerance, limit, alpha, tokens):
    """GPT-OSS's (limit 7, alpha 1.702), DeepSeek-V4's clamp alone, and the alpha form alone, in
    every method's fused epilogues; inputs scaled so the clamps bind."""
    layer, oracle, rng = _pair(kt_variant, experts=8, hidden=128, intermediate=64, top_k=2, swiglu=(limit, alpha))
    x = rng.standard_normal((tokens, 128)).astype(np.float32) * np.float32(3.0 if limit > 1 else 1.0)
    ids, w = random_routing(rng, tokens, 8, 2)
    _check(layer, oracle, x, ids, w, kt_tolerance, kt_variant[2])


@pytest.mark.parametrize("tokens", [1, 3, 64])
def test_limit_after_silu_matches_reference(kt_variant, kt_tolerance, tokens):
    """Step-3.5's / Ling-2.5's limit after SiLU: the backend's raw gate/up tile (plugin ABI 1.4) under
    kt-core's activation epilogue; inputs scaled so the limit binds."""
    layer, oracle, rng = _pair(kt_variant, experts=8, hidden=128, intermediate=64, top_k=2, swiglu=(0.5, 0.0, True))
    x = rng.standard_normal((tokens, 128)).astype(np.float32) * np.float32(3.0)
    ids, w = random_routing(rng, tokens, 8, 2)
    _check(layer, oracle, x, ids, w, kt_tolerance, kt_variant[2])


@pytest.mark.parametrize("tokens", [1, 3, 64])
def test_gelu_tanh_matches_reference(kt_variant, kt_tolerance, tokens):
    """Gemma 4's GELU-tanh experts: the backend's raw gate/up tile (plugin ABI 1.4) under kt-core's
    activation epilogue."""
    layer, oracle, rng = _pair(kt_variant, experts=8, hidden=128, intermediate=64, top_k=2, gate_activation="gelu_tanh")
    x = rng.standard_normal((tokens, 128)).astype(np.float32) * np.float32(3.0)
    ids, w = random_routing(rng, tokens, 8, 2)
    _check(layer, oracle, x, ids, w, kt_tolerance, kt_variant[2])


@pytest.mark.parametrize("tokens", [1, 3, 64])
def test_expert_biases_match_reference(kt_variant, kt_tolerance, tokens):
    """Experts with gate, up and down biases (GPT-OSS, with its clamped SwiGLU): the backend's raw
    gate/up tile (plugin ABI 1.4) under kt-core's bias and activation epilogue."""
    layer, oracle, rng = _pair(kt_variant, experts=8, hidden=128, intermediate=64, top_k=2, swiglu=(7.0, 1.702),
                               biases=True)
    x = rng.standard_normal((tokens, 128)).astype(np.float32)
    ids, w = random_routing(rng, tokens, 8, 2)
    _check(layer, oracle, x, ids, w, kt_tolerance, kt_variant[2])


@pytest.mark.parametrize("hidden,intermediate", [(128, 64), (256, 192), (96, 160), (130, 70)])
def test_grouped_products_match_reference(kt_variant, kt_tolerance, hidden, intermediate):
    """Training's products on rows grouped by expert (kt_core.MoE.grouped_*): the raw gate/up and
    down products (activations quantized as the forward quantizes them: the forward's tolerance)
    and the transposed ones of plugin ABI 1.5: f32 gradients used as given (FMA kernels: only the
    accumulation order differs from the reference's, ~1e-7) or split into bf16 hi + lo planes, and
    the weights too where they are not bf16 (tile kernels: 16 significant bits of each factor,
    measured up to 2.2e-5 on AMX) — 4e-5. Experts with no rows included; (96, 160): blocks of 64
    columns that run past K (whole 16-column groups of it)."""
    layer, oracle, rng = _pair(kt_variant, experts=6, hidden=hidden, intermediate=intermediate, top_k=2, trainable=True)
    counts = np.array([5, 0, 1, 37, 0, 16], dtype=np.int64)
    rows = int(counts.sum())
    x = rng.standard_normal((rows, hidden)).astype(np.float32)
    h = rng.standard_normal((rows, intermediate)).astype(np.float32)
    dgate, dup = (rng.standard_normal((rows, intermediate)).astype(np.float32) for _ in range(2))
    dy = rng.standard_normal((rows, hidden)).astype(np.float32)
    method = kt_variant[2]
    dgate_up = np.concatenate([dgate, dup], axis=1)
    got, want = ({"gate_up": m.grouped_gate_up(x, counts), "down": m.grouped_down(h, counts),
                  "gate_up^T": m.grouped_gate_up_transposed(dgate_up, counts), "down^T": m.grouped_down_transposed(dy, counts)}
                 for m in (layer, oracle))
    for name in got:
        tol = 4e-5 if name.endswith("^T") else kt_tolerance[method]
        err = relative_error(got[name], want[name])
        assert err <= tol, f"{layer.backend} {method} grouped {name}: error {err:.3e} vs reference exceeds {tol:.1e}"


# ~90 rows for each of 9 experts (one tile per expert on up to 2 threads): the forward products'
# kernel calls take a slice of the tile's columns each (176 + 16 of gate/up's, 368 + 16 of down's),
# the adapter's epilogue following each call (grouped_products.cpp's epilogue_columns).
@pytest.mark.parametrize("hidden,intermediate,counts", [(128, 96, (5, 0, 1, 37, 0, 16)),
                                                        (384, 192, (100, 0, 110, 95, 100, 3, 90, 105, 100, 97))])
@pytest.mark.parametrize("blocks", [1, 2])
def test_grouped_products_with_gathered_rows_and_riding_adapters(kt_variant, blocks, hidden, intermediate, counts):
    """What a training step runs (kt_core.training_step): gate/up on rows x[token] quantized straight
    from x, each product with a LoRA adapter riding on it (its term added to the output tile by tile;
    kt_core.lora.ProductLora / ProductLoraGrad), against the same products on gathered rows followed
    by grouped_lora_forward / grouped_lora_backward's own passes: the same arithmetic in kt-core, and
    the backend's activation rows quantized one at a time instead of an expert's together (kt/plugin.h:
    rows are independent) — within 1e-6 of the largest value (measured: equal)."""
    from kt_core.lora import ProductLora, ProductLoraGrad, grouped_lora_backward, grouped_lora_forward

    rank, E = 4, len(counts)
    layer, _, rng = _pair(kt_variant, experts=E, hidden=hidden, intermediate=intermediate, top_k=2, trainable=True)
    counts = np.array(counts, dtype=np.int64)
    rows = int(counts.sum())
    x = rng.standard_normal((23, hidden)).astype(np.float32)
    token = rng.integers(0, 23, rows).astype(np.int64)
    h = rng.standard_normal((rows, intermediate)).astype(np.float32)
    dgate_up = rng.standard_normal((rows, 2 * intermediate)).astype(np.float32)
    dy = rng.standard_normal((rows, hidden)).astype(np.float32)
    f32 = lambda *shape: (rng.standard_normal(shape) * 0.1).astype(np.float32)  # noqa: E731
    a_gu, b_gu = f32(E, 2 * rank, hidden), f32(E, 2 * intermediate, 2 * rank // blocks)
    a_d, b_d = f32(E, rank, intermediate), f32(E, hidden, rank)
    bt = lambda b: np.ascontiguousarray(b.transpose(0, 2, 1))  # noqa: E731
    empty = lambda *shape: np.empty(shape, np.float32)  # noqa: E731

    xa_gu, xa_d = empty(rows, 2 * rank), empty(rows, rank)
    fused = {"gate_up": layer.grouped_gate_up(x, counts, token=token, lora=ProductLora(a_gu, bt(b_gu), 0.5, xa_gu, blocks)),
             "down": layer.grouped_down(h, counts, lora=ProductLora(a_d, bt(b_d), 0.5, xa_d))}
    g_gu, g_d = empty(rows, 2 * rank), empty(rows, rank)
    fused_grads = [empty(*a.shape) for a in (a_gu, b_gu, a_d, b_d)]
    grouped_lora_backward(dgate_up, x, xa_gu, counts, a_gu, b_gu, 0.5, None, *fused_grads[:2], blocks=blocks, g=g_gu,
                          token=token)
    grouped_lora_backward(dy, h, xa_d, counts, a_d, b_d, 0.5, None, *fused_grads[2:], g=g_d)
    fused["gate_up^T"] = layer.grouped_gate_up_transposed(dgate_up, counts, lora=ProductLoraGrad(g_gu, a_gu))
    fused["down^T"] = layer.grouped_down_transposed(dy, counts, lora=ProductLoraGrad(g_d, a_d))

    gathered = np.ascontiguousarray(x[token])
    want = {"gate_up": layer.grouped_gate_up(gathered, counts), "down": layer.grouped_down(h, counts),
            "gate_up^T": layer.grouped_gate_up_transposed(dgate_up, counts), "down^T": layer.grouped_down_transposed(dy, counts)}
    want_xa = {"gate_up": empty(rows, 2 * rank), "down": empty(rows, rank)}
    grouped_lora_forward(gathered, counts, a_gu, b_gu, 0.5, want_xa["gate_up"], want["gate_up"], blocks=blocks)
    grouped_lora_forward(h, counts, a_d, b_d, 0.5, want_xa["down"], want["down"])
    want_grads = [empty(*a.shape) for a in (a_gu, b_gu, a_d, b_d)]
    grouped_lora_backward(dgate_up, gathered, xa_gu, counts, a_gu, b_gu, 0.5, want["gate_up^T"], *want_grads[:2],
                          blocks=blocks, accumulate_dx=True)
    grouped_lora_backward(dy, h, xa_d, counts, a_d, b_d, 0.5, want["down^T"], *want_grads[2:], accumulate_dx=True)

    checks = [*((n, fused[n], want[n]) for n in want), ("xa gate_up", xa_gu, want_xa["gate_up"]),
              ("xa down", xa_d, want_xa["down"]),
              *((n, g, w) for n, g, w in zip(("dA gate_up", "dB gate_up", "dA down", "dB down"), fused_grads, want_grads))]
    for name, got, ref in checks:
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        assert err <= 1e-6, f"{layer.backend} {kt_variant[2]} {name} with the adapter riding: {err:.3e} off the separate passes"


@pytest.mark.parametrize("hidden,intermediate", [(256, 192), (96, 160)])
def test_grouped_transposed_products_with_fast_activations(kt_variant, hidden, intermediate):
    """With fast_activations a backend may take the transposed products in bf16: the gradients
    rounded to it (2^-9 each), and dequantized weights that bf16 does not hold exactly rounded as well
    — within 1.5e-2 (max error / RMS) of the reference's f32 products on the same packed weights.
    Measured on kt-backend-avx's AVX512_BF16 target: weights exact in bf16 (BF16, INT8's codes with
    the scale moved onto the gradients, MXFP4, MXFP8) 5.9e-3 .. 7.5e-3; rounded too (INT4's family,
    NVFP4, FP8, FP8_PERCHANNEL) 8.8e-3 .. 1.1e-2; AMX's tiles up to 7.5e-3."""
    layer, oracle, rng = _pair(kt_variant, experts=6, hidden=hidden, intermediate=intermediate, top_k=2, trainable=True,
                               fast_activations=True)
    counts = np.array([5, 0, 1, 37, 0, 16], dtype=np.int64)
    rows = int(counts.sum())
    dgate_up = rng.standard_normal((rows, 2 * intermediate)).astype(np.float32)
    dy = rng.standard_normal((rows, hidden)).astype(np.float32)
    for name, got, want in (("gate_up^T", *(m.grouped_gate_up_transposed(dgate_up, counts) for m in (layer, oracle))),
                            ("down^T", *(m.grouped_down_transposed(dy, counts) for m in (layer, oracle)))):
        err = relative_error(got, want)
        assert err <= 1.5e-2, (f"{layer.backend} {kt_variant[2]} grouped {name} (fast): error {err:.3e} vs reference "
                               "exceeds 1.5e-2")


def test_many_tokens(kt_variant, kt_tolerance):
    layer, oracle, rng = _pair(kt_variant, experts=16, hidden=64, intermediate=64, top_k=4)
    x = rng.standard_normal((2000, 64)).astype(np.float32)
    ids, w = random_routing(rng, 2000, 16, 4)
    _check(layer, oracle, x, ids, w, kt_tolerance, kt_variant[2])


def test_negative_ids_and_empty_buckets(kt_variant, kt_tolerance):
    layer, oracle, rng = _pair(kt_variant, experts=16, hidden=64, intermediate=64, top_k=4)
    x = rng.standard_normal((9, 64)).astype(np.float32)
    ids, w = random_routing(rng, 9, 4, 4)       # experts 4..15 never hit: empty buckets
    ids[::2, 1] = -1
    ids[3] = -1                                 # a token with no expert at all
    out = _check(layer, oracle, x, ids, w, kt_tolerance, kt_variant[2])
    assert np.all(out[3] == 0), "a token routed to no expert must produce zeros"


@pytest.mark.parametrize("tokens", [1, 4])
def test_no_cpu_expert_routed_gives_zeros(kt_variant, tokens):
    mask = [e < 2 for e in range(4)]
    layer, _, rng = _pair(kt_variant, experts=4, hidden=64, intermediate=64, top_k=2, mask=mask)
    x = rng.standard_normal((tokens, 64)).astype(np.float32)
    w = np.ones((tokens, 2), dtype=np.float32)
    for ids in (np.full((tokens, 2), -1), np.tile([0, 1], (tokens, 1))):   # all -1; all GPU-resident
        np.testing.assert_array_equal(layer(x, ids.astype(np.int64), w), np.zeros((tokens, 64), np.float32))


def test_all_experts_one_token(kt_variant, kt_tolerance):
    layer, oracle, rng = _pair(kt_variant, experts=6, hidden=64, intermediate=64, top_k=6)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    ids = rng.permutation(6).reshape(1, 6).astype(np.int64)
    w = rng.random((1, 6)).astype(np.float32)
    _check(layer, oracle, x, ids, w, kt_tolerance, kt_variant[2])


def test_duplicated_experts_in_a_row(kt_variant, kt_tolerance):
    layer, oracle, rng = _pair(kt_variant, experts=4, hidden=64, intermediate=64, top_k=3)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    ids = np.array([[1, 1, 2]] * 5, dtype=np.int64)
    w = rng.random((5, 3)).astype(np.float32)
    _check(layer, oracle, x, ids, w, kt_tolerance, kt_variant[2])


def test_gpu_resident_experts_skipped(kt_variant, kt_tolerance):
    mask = [e % 3 == 0 for e in range(8)]
    layer, oracle, rng = _pair(kt_variant, experts=8, hidden=64, intermediate=64, top_k=3, mask=mask)
    x = rng.standard_normal((7, 64)).astype(np.float32)
    ids, w = random_routing(rng, 7, 8, 3)
    _check(layer, oracle, x, ids, w, kt_tolerance, kt_variant[2])


def test_repeated_calls_are_identical(kt_variant):
    layer, _, rng = _pair(kt_variant, experts=8, hidden=64, intermediate=64, top_k=2)
    x = rng.standard_normal((33, 64)).astype(np.float32)
    ids, w = random_routing(rng, 33, 8, 2)
    first = layer(x, ids, w)
    for _ in range(3):
        np.testing.assert_array_equal(layer(x, ids, w), first)


def test_concurrent_layers(kt_variant, kt_tolerance):
    pairs = [_pair(kt_variant, experts=8, hidden=64, intermediate=64, top_k=2, seed=s) for s in range(3)]
    inputs = []
    for _, _, rng in pairs:
        x = rng.standard_normal((17, 64)).astype(np.float32)
        inputs.append((x, *random_routing(rng, 17, 8, 2)))
    expected = [oracle(*args) for (_, oracle, _), args in zip(pairs, inputs)]
    results, errors = [None] * 3, []

    def run(i):
        try:
            for _ in range(5):
                results[i] = pairs[i][0](*inputs[i])
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got, want in zip(results, expected):
        assert relative_error(got, want) <= kt_tolerance[kt_variant[2]]


def test_submit_sync_matches_forward(kt_variant):
    layer, _, rng = _pair(kt_variant, experts=8, hidden=64, intermediate=64, top_k=2)
    x = rng.standard_normal((12, 64)).astype(np.float32)
    ids, w = random_routing(rng, 12, 8, 2)
    layer.submit(x, ids, w)
    np.testing.assert_array_equal(layer.sync(), layer(x, ids, w))


def test_nan_propagates(kt_variant):
    layer, _, rng = _pair(kt_variant, experts=4, hidden=64, intermediate=64, top_k=2)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x[1, 5] = np.nan
    ids, w = random_routing(rng, 3, 4, 2)
    out = layer(x, ids, w)
    assert np.isnan(out[1]).any(), "NaN in a token's activations must reach its output"
    assert np.isfinite(out[0]).all() and np.isfinite(out[2]).all(), "NaN must not leak into other tokens"
