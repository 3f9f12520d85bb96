"""kt-backend-avx on every target this host runs: accuracy against FP32 over the same
quantized weights (kernel error) and against the unquantized weights (format error)."""

import subprocess
import sys

import numpy as np
import pytest

import kt_core
from kt_backend_avx import descriptor
from kt_core.testing import quantize
from kt_core.testing.reference import bf16_round, moe_reference, random_moe, random_routing, relative_error

VARIANTS = [v.name for v in descriptor.variants]
# Kernel error bound per method (max |Δ| / RMS vs FP32 over the stored weights). The issue
# asks for <= 1e-2 (BF16) and 2e-2 (quantized); these are what the kernels reach, with margin.
# Measured here: BF16 <= 3.5e-5, INT8/INT4/RAWINT4 <= 1e-3 (two-pass int8 activations), FP8 <= 3e-6
# (v3/v4; 2.2e-5 on v4-vnni-bf16, whose split-bf16 activations keep ~16 bits).
KERNEL_TOL = {"BF16": 1e-4, "INT8": 5e-3, "INT4": 5e-3, "RAWINT4": 5e-3, "FP8": 1e-4, "FP8_PERCHANNEL": 1e-4,
              "MXFP4": 5e-3, "NVFP4": 5e-3, "MXFP8": 1e-4}
# Format error (vs the unquantized weights) is the format's, not the kernel's: stated, bounded loosely.
FORMAT_TOL = {"BF16": 4e-2, "INT8": 0.15, "INT4": 2.0, "RAWINT4": 2.0, "FP8": 0.5, "FP8_PERCHANNEL": 0.5, "MXFP4": 2.0,
              "NVFP4": 2.0, "MXFP8": 0.5}


def test_descriptor_import_is_pure():
    r = subprocess.run([sys.executable, "-c", "import sys, kt_backend_avx; print('kt_backend_avx._native' in sys.modules)"],
                       capture_output=True, text=True)
    assert r.stdout.strip() == "False", r.stderr


def test_best_variant_is_chosen():
    runnable = [v for v in descriptor.variants if not kt_core.host().missing(v.requires)]
    if not runnable:
        pytest.skip("this host runs no AVX variant")
    layer = kt_core.MoE(num_experts=2, top_k=1, hidden_size=32, intermediate_size=32, method="BF16")
    assert layer.backend == f"avx/{max(runnable, key=lambda v: v.rank).name}"


@pytest.mark.parametrize("hidden,intermediate", [(256, 96), (130, 70), (2048, 64)])
@pytest.mark.parametrize("tokens", [1, 5, 64, 200])
def test_bf16_accuracy(variant, hidden, intermediate, tokens):
    rng = np.random.default_rng(hidden + tokens)
    E, K = 8, 2
    w = random_moe(rng, E, hidden, intermediate)
    layer = kt_core.MoE(num_experts=E, top_k=K, hidden_size=hidden, intermediate_size=intermediate, method="BF16")
    assert layer.backend == f"avx/{variant}"
    layer.load(*w)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids, wt = random_routing(rng, tokens, E, K)
    out = layer(x, ids, wt)
    kernel_err = relative_error(out, moe_reference(x, *[bf16_round(a) for a in w], ids, wt))
    format_err = relative_error(out, moe_reference(x, *w, ids, wt))
    assert kernel_err <= KERNEL_TOL["BF16"], kernel_err
    assert format_err <= 4e-2, format_err   # bf16 weights themselves: measured up to 2.9e-2 here


def test_bf16_input_takes_the_single_pass(variant):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    w = random_moe(rng, 4, 128, 64)
    layer = kt_core.MoE(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64, method="BF16")
    layer.load(*w)
    x = torch.from_numpy(bf16_round(rng.standard_normal((9, 128)).astype(np.float32))).bfloat16()
    ids, wt = random_routing(rng, 9, 4, 2)
    out = layer(x, ids, wt)
    assert out.dtype == torch.bfloat16
    want = moe_reference(x.float().numpy(), *[bf16_round(a) for a in w], ids, wt)
    assert relative_error(out.float().numpy(), want) <= 2.0**-8 * np.abs(want).max() / np.sqrt(np.mean(want**2))


def test_bf16_refuses_integer_codes(variant):
    layer = kt_core.MoE(num_experts=2, top_k=1, hidden_size=32, intermediate_size=32, method="BF16")
    codes = np.zeros((32, 32), dtype=np.int8)
    with pytest.raises(ValueError, match="BF16: gate must be floating point .* got int8"):
        layer.load_expert(0, codes, codes, codes)


@pytest.mark.parametrize("method", ["INT8", "INT4", "RAWINT4", "FP8", "FP8_PERCHANNEL", "MXFP4", "NVFP4", "MXFP8"])
@pytest.mark.parametrize("tokens", [1, 6, 77])
def test_quantized_accuracy(variant, method, tokens):
    rng = np.random.default_rng(tokens)
    E, K, H, I = 6, 2, 256, 160
    w = random_moe(rng, E, H, I)
    gate, up, down, scales, zeros = quantize.checkpoint_arrays(method, *w)
    group = 32 if method == "INT4" else 0
    layer = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method, group_size=group)
    assert layer.backend == f"avx/{variant}"
    layer.load(gate, up, down, scales=scales, zeros=zeros)
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids, wt = random_routing(rng, tokens, E, K)
    ids[0, -1] = -1
    out = layer(x, ids, wt)
    stored = quantize.dequantized_weights(method, *w, group_size=group)
    kernel_err = relative_error(out, moe_reference(x, *stored, ids, wt))
    format_err = relative_error(out, moe_reference(x, *w, ids, wt))
    print(f"\n{method} {variant} tokens={tokens}: kernel {kernel_err:.2e}, format {format_err:.2e}")
    assert kernel_err <= KERNEL_TOL[method], f"{method}: kernel error {kernel_err:.2e}"
    assert format_err <= FORMAT_TOL[method], f"{method}: format error {format_err:.2e}"


@pytest.mark.parametrize("method,hidden,intermediate,tokens",
                         [("BF16", 288, 160, 45), ("FP8", 288, 160, 45), ("MXFP8", 288, 160, 45), ("BF16", 2048, 64, 141),
                          ("FP8", 2048, 128, 141)])
def test_avx2_prefill_rows_do_not_depend_on_the_batch(variant, method, hidden, intermediate, tokens):
    """x86-64-v3's prefill on widened panels (wide_panels.h, from 4 rows per expert) sums every row
    in k order on its own accumulators, whatever the row block it falls in: a row's output is the
    same bits in a batch of 4 rows and of all of them, on gate/up and down, across K's 128-k blocks
    and a partial last one (hidden 288: multiples of MXFP8's 32-k blocks, not of 128). 141 rows of
    2048 k (1.1 MiB of activations) take the loop that prefetches the next row block's."""
    if variant != "x86-64-v3":
        pytest.skip("the widened-panel prefill is x86-64-v3's (AVX-512 targets keep in-register kernels)")
    rng = np.random.default_rng(11)
    E, H, I = 2, hidden, intermediate
    w = random_moe(rng, E, H, I)
    arrays = (*w, None) if method == "BF16" else quantize.checkpoint_inputs(method, *w)
    layer = kt_core.MoE(num_experts=E, top_k=1, hidden_size=H, intermediate_size=I, method=method)
    layer.load(*arrays[:3], scales=arrays[3])
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids = np.zeros((tokens, 1), dtype=np.int64)   # every token to expert 0: all rows, then 4
    wt = np.ones((tokens, 1), dtype=np.float32)
    whole = layer(x, ids, wt)
    assert np.array_equal(layer(x[:4], ids[:4], wt[:4]), whole[:4])
    assert np.array_equal(layer(x[17:21], ids[17:21], wt[17:21]), whole[17:21])
    last = slice(tokens - 4, tokens)   # 45 and 141 rows: 3-row blocks; the old kernels left the last row alone
    assert np.array_equal(layer(x[last], ids[last], wt[last]), whole[last])
    stored = (bf16_round(a) for a in w) if method == "BF16" else quantize.dequantized_weights(method, *w)
    assert relative_error(whole, moe_reference(x, *stored, ids, wt)) <= KERNEL_TOL[method]


@pytest.mark.parametrize("method,group,zero_point,hidden,intermediate",
                         [("INT8", 0, False, 290, 162), ("INT4", 32, False, 288, 160), ("INT4", 32, True, 288, 160),
                          ("INT4", 128, False, 384, 256), ("INT4", 128, True, 384, 256), ("GPTQ_INT4", 128, False, 384, 256),
                          ("RAWINT4", 0, False, 288, 160), ("MXFP4", 0, False, 288, 160), ("NVFP4", 0, False, 288, 160)])
def test_avx2_integer_prefill_on_widened_panels(variant, method, group, zero_point, hidden, intermediate):
    """x86-64-v3's INT8 and INT4-family prefill (two activation passes, from 8 to 24 rows per expert)
    widens the codes to weights and the int8 activation planes to their values and sums in f32: the
    same products as the integer kernels, which serve a token alone. Each row of a 300-row batch (two
    chunks of rows widened at a time) matches that row run alone but for f32 summation, which can move
    the intermediate across one rounding step of the down projection's activation planes (1/16256 of
    its row's max): 3e-4 of the RMS (measured 0.8-1.5e-4; the integer kernels' own error is ~1e-3). A
    row is the same bits in a batch of 30, from either chunk. K spans 128-k widened blocks and a
    partial one (288 = 2 x 128 + 32)."""
    if variant != "x86-64-v3":
        pytest.skip("the widened-panel prefill is x86-64-v3's (AVX-512 targets keep in-register kernels)")
    rng = np.random.default_rng(hidden + group + zero_point)
    E, H, I, tokens = 2, hidden, intermediate, 300   # two chunks of 150 rows (wide_panels.h's kRowChunk = 256)
    w = random_moe(rng, E, H, I)
    gate, up, down, scales, zeros = quantize.checkpoint_arrays(method, *w, group_size=group)
    layer = kt_core.MoE(num_experts=E, top_k=1, hidden_size=H, intermediate_size=I, method=method,
                        group_size=group if method == "INT4" else 0, zero_point=zero_point)
    layer.load(gate, up, down, scales=scales, zeros=zeros)
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids = np.zeros((tokens, 1), dtype=np.int64)   # every token to expert 0
    wt = np.ones((tokens, 1), dtype=np.float32)
    whole = layer(x, ids, wt)
    assert np.array_equal(layer(x[:30], ids[:30], wt[:30]), whole[:30])
    assert np.array_equal(layer(x[-30:], ids[-30:], wt[-30:]), whole[-30:])
    some = list(range(0, tokens, 7))
    alone = np.concatenate([layer(x[t:t + 1], ids[t:t + 1], wt[t:t + 1]) for t in some])
    assert relative_error(whole[some], alone) <= 3e-4
    stored = quantize.dequantized_weights(method, *w, group_size=group, zero_point=zero_point)
    assert relative_error(whole, moe_reference(x, *stored, ids, wt)) <= KERNEL_TOL[method.replace("GPTQ_", "")]


E4M3_FINITE = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
E4M3_TINY = np.array([c for c in range(256) if c & 0x78 == 0], dtype=np.uint8)   # ±0 and the subnormals


@pytest.mark.parametrize("codes", ["every", "tiny"])
@pytest.mark.parametrize("hidden,intermediate", [(256, 128), (202, 130), (201, 99)])
@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_fp8_codes_are_exact(variant, codes, hidden, intermediate, tokens):
    """Every finite E4M3 code, or only ±0 and the subnormals (which a bf16 conversion must not
    flush: a flushed subnormal would make the "tiny" case's output zero), on K that are not
    multiples of 4 or even of 2, for decode (codes converted in registers) and prefill
    (panels converted once) alike."""
    rng = np.random.default_rng(hidden + tokens)
    E, K = 3, 2
    pool = E4M3_FINITE if codes == "every" else E4M3_TINY
    shapes = [(E, intermediate, hidden), (E, intermediate, hidden), (E, hidden, intermediate)]
    w8 = [rng.choice(pool, size=s) for s in shapes]
    scales = [rng.uniform(0.5, 2.0, size=(E, -(-s[1] // 128), -(-s[2] // 128))).astype(np.float32) for s in shapes]
    layer = kt_core.MoE(num_experts=E, top_k=K, hidden_size=hidden, intermediate_size=intermediate, method="FP8")
    assert layer.backend == f"avx/{variant}"
    layer.load(*w8, scales=tuple(scales))
    stored = [np.stack([quantize.dequantize_fp8_block(c[e], s[e]) for e in range(E)]) for c, s in zip(w8, scales)]
    x = rng.standard_normal((tokens, hidden)).astype(np.float32) * (2.0**-8 if codes == "every" else 1.0)
    ids, wt = random_routing(rng, tokens, E, K)
    want = moe_reference(x, *stored, ids, wt)
    assert np.sqrt(np.mean(want**2)) > 0
    assert relative_error(layer(x, ids, wt), want) <= KERNEL_TOL["FP8"]


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("zero_point", [False, True])
def test_int4_groups_match_the_reference_backend(variant, group, zero_point):
    rng = np.random.default_rng(group)
    w = random_moe(rng, 4, 256, 128)
    layers = []
    for backend in ("avx", "reference"):
        layer = kt_core.MoE(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128, method="INT4",
                            group_size=group, zero_point=zero_point, backend=backend)
        layer.load(*w)
        layers.append(layer)
    x = rng.standard_normal((9, 256)).astype(np.float32)
    ids, wt = random_routing(rng, 9, 4, 2)
    assert relative_error(layers[0](x, ids, wt), layers[1](x, ids, wt)) <= KERNEL_TOL["INT4"]


def test_bad_quantized_input_fails_at_load(variant):
    rng = np.random.default_rng(0)
    g, u, d = random_moe(rng, 2, 96, 64)
    with pytest.raises(ValueError, match="group_size 48 is not supported"):
        kt_core.MoE(num_experts=2, top_k=1, hidden_size=96, intermediate_size=64, method="INT4", group_size=48).load(g, u, d)
    with pytest.raises(ValueError, match="group_size 64 must divide hidden .96."):
        kt_core.MoE(num_experts=2, top_k=1, hidden_size=96, intermediate_size=64, method="INT4", group_size=64).load(g, u, d)
    layer = kt_core.MoE(num_experts=2, top_k=1, hidden_size=96, intermediate_size=64, method="RAWINT4")
    packed, scale = quantize.pack_rawint4(g[0])
    with pytest.raises(ValueError, match="RAWINT4: gate weight_scale should be bf16 .64, 3., got float32 .64, 2."):
        layer.load_expert(0, packed, packed, packed, scales=(scale[:, :2], scale, scale))
    with pytest.raises(ValueError, match="RAWINT4: gate weight_packed should be int32"):
        layer.load_expert(0, g[0], u[0], d[0], scales=(scale, scale, scale))
    off = scale.copy()   # f32 scales are taken only as bf16 values: the layout keeps bf16
    off[5, 1] = np.nextafter(off[5, 1], np.float32(np.inf))
    with pytest.raises(ValueError, match=r"RAWINT4: gate weight_scale \[5, 1\] = .* is not a bf16 value"):
        layer.load_expert(0, packed, packed, packed, scales=(off, scale, scale))
    fp8 = kt_core.MoE(num_experts=2, top_k=1, hidden_size=96, intermediate_size=64, method="FP8")
    codes, s = quantize.quantize_fp8_block(g[0])
    bad = codes.copy()
    bad[3, 5] = 0x7F
    dcodes, ds = quantize.quantize_fp8_block(d[0])
    with pytest.raises(ValueError, match="E4M3 NaN code 0x7F at .3, 5."):
        fp8.load_expert(0, bad, codes, dcodes, scales=(s, s, ds))
    with pytest.raises(ValueError, match="FP8: gate scale is missing"):
        fp8.load_expert(0, codes, codes, dcodes)


@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_mxfp4_keeps_the_files_bytes_and_every_exponent(variant, tokens):
    """"kt-mxfp4-p16-v2" holds the file's E8M0 bytes as its group headers: an expert takes the
    file's 4.25 bits per weight, and the kernels read every exponent exactly, the subnormal
    scales 2^-127 and 2^-126 (E8M0 0 and 1) included: gate/up hold only those and tiny ones
    (x scaled by 2^120 brings their products to O(1)), down the exponents around 2^0."""
    rng = np.random.default_rng(tokens)
    E, K, H, I = 4, 2, 256, 160
    blocks = [rng.integers(0, 256, size=(E, n, k // 2), dtype=np.uint8) for n, k in ((I, H), (I, H), (H, I))]
    scales = [rng.integers(0, 3, size=(E, I, H // 32)).astype(np.uint8) for _ in range(2)]
    scales.append(rng.integers(120, 136, size=(E, H, I // 32)).astype(np.uint8))
    layer = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="MXFP4")
    assert layer.backend == f"avx/{variant}"
    layer.load(*blocks, scales=tuple(scales))
    assert layer.packed_bytes == E * 3 * H * I * 17 // 32   # the file's: 16 code bytes and 1 scale byte per 32
    x = rng.standard_normal((tokens, H)).astype(np.float32) * np.float32(2.0**120)
    ids, wt = random_routing(rng, tokens, E, K)
    stored = [quantize.dequantize_mxfp4(b, s) for b, s in zip(blocks, scales)]
    want = moe_reference(x, *stored, ids, wt)
    assert np.all(np.isfinite(want)) and np.sqrt(np.mean(want**2)) > 1e-3
    assert relative_error(layer(x, ids, wt), want) <= KERNEL_TOL["MXFP4"]


def test_mxfp4_float_scales_must_be_e8m0_values(variant):
    """bf16 / f32 scales (kt-kernel's wrapper passes bf16 ones) are taken as the exponents they
    hold, exactly as the uint8 bytes; a value no E8M0 byte holds is refused by name."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    w = random_moe(rng, 2, 64, 32)
    gate, up, down, scales, _ = quantize.checkpoint_arrays("MXFP4", *w)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    ids, wt = random_routing(rng, 5, 2, 1)
    outs = []
    for as_float in (False, True):
        layer = kt_core.MoE(num_experts=2, top_k=1, hidden_size=64, intermediate_size=32, method="MXFP4")
        s = tuple(torch.from_numpy(np.ldexp(1.0, a.astype(np.int64) - 127).astype(np.float32)).bfloat16() if as_float else a
                  for a in scales)
        layer.load(gate, up, down, scales=s)
        outs.append(layer(x, ids, wt))
    assert np.array_equal(outs[0], outs[1])
    off = np.ldexp(1.0, scales[0][0].astype(np.int64) - 127).astype(np.float32)
    off[4, 1] *= np.float32(1.5)
    with pytest.raises(ValueError, match=r"MXFP4: gate scale \[4, 1\] = .* is not an E8M0 scale \(a power of two"):
        layer.load_expert(0, gate[0], up[0], down[0], scales=(off, scales[1][0], scales[2][0]))


@pytest.mark.parametrize("method", ["INT8", "INT4", "BF16", "FP8"])
def test_fast_activations_trade_accuracy_for_speed(variant, method):
    rng = np.random.default_rng(11)
    w = random_moe(rng, 4, 256, 128)
    x = rng.standard_normal((20, 256)).astype(np.float32)
    ids, wt = random_routing(rng, 20, 4, 2)
    want = moe_reference(x, *quantize.dequantized_weights(method, *w), ids, wt)
    gate, up, down, scales = quantize.checkpoint_inputs(method, *w)
    errors = {}
    for fast in (False, True):
        layer = kt_core.MoE(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128, method=method,
                            fast_activations=fast)
        layer.load(gate, up, down, scales=scales)
        errors[fast] = relative_error(layer(x, ids, wt), want)
    assert errors[False] <= KERNEL_TOL[method], errors
    if method in ("INT8", "INT4"):
        # One int8 pass: the per-token activation rounding kt-kernel also makes (~1e-1 here).
        assert KERNEL_TOL[method] < errors[True] <= 0.3, errors
    elif "bf16" in variant:
        # The split-bf16 kernels drop the low halves: x and the intermediate at bf16, as kt-kernel
        # and torch's bf16 MoE carry them (measured 1.4e-2 here for BF16, 1.3e-2 at 2048 x 768).
        assert 1e-3 < errors[True] <= 3e-2, errors
    else:
        # Targets without AVX512_BF16 multiply f32 activations exactly: no faster mode to take.
        assert errors[True] == errors[False], errors


@pytest.mark.parametrize("method", ["BF16", "INT8", "INT4", "INT4+zp"])
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("hidden,intermediate", [(256, 192), (130, 70)])
def test_transposed_pair_word_products(variant, method, fast, hidden, intermediate):
    """Training's transposed products (plugin ABI 1.5) on BF16, INT8 and INT4 (symmetric, zero points) weights
    against the reference backend on the same packed values: f32 gradients as given (accumulation order only), or with
    fast_activations on the AVX512_BF16 target the gradients (INT8: times each channel's scale) in bf16
    through vdpbf16ps on the bf16 weights, the INT8 codes or INT4's dequantized weights rounded to bf16
    (bf16's rounding of each gradient, 2^-9: measured 1.6e-3 .. 2.0e-3 of the largest output; INT4, whose
    weights round too, 2.4e-3 .. 3.1e-3); elsewhere the flag changes nothing. The other formats:
    kt_core.testing.conformance's test_grouped_transposed_products_with_fast_activations."""
    method, zero_point = method.removesuffix("+zp"), method.endswith("+zp")
    if method == "INT4" and hidden % 32:
        pytest.skip("INT4's groups (32, 64, 128) divide neither 130 nor 70")
    rng = np.random.default_rng(3)
    w = random_moe(rng, 4, hidden, intermediate)
    counts = np.array([37, 0, 5, 70], np.int64)
    dgate, dup = (rng.standard_normal((112, intermediate)).astype(np.float32) for _ in range(2))
    dy = rng.standard_normal((112, hidden)).astype(np.float32)
    got, want = [], []
    for layers, backend, f in ((got, "avx", fast), (want, "reference", False)):
        layer = kt_core.MoE(num_experts=4, top_k=2, hidden_size=hidden, intermediate_size=intermediate, method=method,
                            backend=backend, trainable=True, fast_activations=f, zero_point=zero_point)
        layer.load(*w)
        layers += [layer.grouped_gate_up_transposed(np.concatenate([dgate, dup], axis=1), counts),
                   layer.grouped_down_transposed(dy, counts)]
    for a, b in zip(got, want):
        err = float(np.abs(a - b).max() / np.abs(b).max())
        assert err <= (4e-3 if fast and "bf16" in variant else 1e-5), (variant, method, fast, err)
        if fast and "bf16" in variant:
            assert err > 1e-5   # the bf16 path did run
