"""The quantized weight formats of docs/formats.md: kt_core.testing.quantize against the
document's rules, and the reference backend's packers and kernels against quantize.

Two errors are measured per method:
  kernel error  the backend vs float64 over the weights the format stores (dequantized by
                testing/quantize.py): shows the C++ packer reproduces the documented rule
                bit for bit, so it must be at rounding level.
  format error  the same output vs float64 over the unquantized weights: what the format
                itself costs. Printed (pytest -s) and bounded.
"""

import numpy as np
import pytest

import kt_core
from kt_core.testing import quantize as Q
from kt_core.testing.reference import bf16_round, moe_reference, random_moe, random_routing, relative_error

E, H, I, TOP_K = 6, 256, 128, 2
KERNEL_TOL = 1e-5

# (method, group_size, zero_point) -> (bound on relative_error = max|d| / RMS, bound on
# rms_error), both against the unquantized weights, about twice what was measured on
# random_moe weights with 33 tokens.
FORMAT_TOL = {
    ("INT8", 0, False): (0.15, 0.03),
    ("INT4", 32, False): (2.0, 0.35),
    ("INT4", 64, False): (2.0, 0.4),
    ("INT4", 128, False): (2.0, 0.45),
    ("INT4", 32, True): (2.0, 0.3),
    ("INT4", 64, True): (2.0, 0.35),
    ("INT4", 128, True): (2.0, 0.4),
    ("RAWINT4", 0, False): (2.0, 0.4),
    ("FP8", 0, False): (0.6, 0.12),
    ("FP8_PERCHANNEL", 0, False): (0.6, 0.12),
    ("MXFP4", 0, False): (2.0, 0.4),
    ("MXFP8", 0, False): (0.6, 0.1),
    ("NVFP4", 0, False): (1.5, 0.25),
    ("GPTQ_INT4", 64, False): (2.0, 0.4),
    ("GPTQ_INT4", 128, False): (2.0, 0.45),
}

IDS = {
    "INT8": ("kt-int8-rowmajor-ref-v1", "moe.int8.f32.reference"),
    "INT4": ("kt-int4-group-ref-v1", "moe.int4.f32.reference"),
    "RAWINT4": ("kt-rawint4-group32-ref-v1", "moe.rawint4.f32.reference"),
    "FP8": ("kt-fp8e4m3-block128-ref-v1", "moe.fp8.f32.reference"),
    "FP8_PERCHANNEL": ("kt-fp8e4m3-perchannel-ref-v1", "moe.fp8_perchannel.f32.reference"),
    "MXFP4": ("kt-mxfp4-group32-ref-v1", "moe.mxfp4.f32.reference"),
    "GPTQ_INT4": ("kt-gptq-int4-group-ref-v1", "moe.gptq_int4.f32.reference"),
    "MXFP8": ("kt-mxfp8-group32-ref-v1", "moe.mxfp8.f32.reference"),
    "NVFP4": ("kt-nvfp4-group16-ref-v1", "moe.nvfp4.f32.reference"),
}


def rms_error(actual, expected) -> float:
    """RMS(actual - expected) / RMS(expected): steadier than the max for comparing formats."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.sqrt(np.mean((actual - expected) ** 2) / np.mean(expected**2)))


def layer(method, hidden=H, intermediate=I, experts=E, top_k=TOP_K, group_size=0, zero_point=False):
    return kt_core.MoE(num_experts=experts, top_k=top_k, hidden_size=hidden, intermediate_size=intermediate,
                       method=method, backend="reference", group_size=group_size, zero_point=zero_point)


def routing(rng, tokens, experts=E, top_k=TOP_K, hidden=H):
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids, w = random_routing(rng, tokens, experts, top_k)
    ids[::3, -1] = -1
    return x, ids, w


# -- the NumPy rules ------------------------------------------------------------------------------

def test_int8_rounds_ties_away_from_zero():
    w = np.array([[127, 2.5, -2.5, 0.5, -0.5, 1.5, -126.5, 0.49999997]], np.float32)   # s = 1 exactly
    q, s = Q.quantize_int8(w)
    assert s.tolist() == [1.0]
    assert q.tolist() == [[127, 3, -3, 1, -1, 2, -127, 0]]
    assert Q.quantize_int8(np.zeros((1, 4), np.float32))[0].tolist() == [[0, 0, 0, 0]]


def test_int4_symmetric_and_asymmetric_rules():
    w = np.array([[7, -3.5, 0.5, -6.5, 1.5, 2, -7, 2.5]], np.float32)     # one group of 8: s = 7/7 = 1
    q, s, z = Q.quantize_int4(w, 8)
    assert z is None and s.tolist() == [[1.0]]
    assert q.tolist() == [[7, -4, 1, -7, 2, 2, -7, 3]]
    w = np.array([[-7, 8, 0.5, -0.5, 2.5, -6.5, 0, 1]], np.float32)       # lo -7, hi 8: s = 1, z = 7
    q, s, z = Q.quantize_int4(w, 8, zero_point=True)
    assert s.tolist() == [[1.0]] and z.tolist() == [[7]]
    assert q.tolist() == [[0, 15, 8, 6, 10, 0, 7, 8]]
    np.testing.assert_array_equal(Q.dequantize_int4(q, s, z), [[-7, 8, 1, -1, 3, -7, 0, 1]])
    q, s, z = Q.quantize_int4(np.full((1, 8), 0.25, np.float32), 8, zero_point=True)   # lo = 0: z = 0
    assert z.tolist() == [[0]] and q.tolist() == [[15] * 8]
    with pytest.raises(ValueError, match="group size 48 does not divide K = 128"):
        Q.quantize_int4(np.zeros((2, 128), np.float32), 48)


def test_rawint4_bit_layout():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 64)).astype(np.float32)
    packed, scale = Q.pack_rawint4(w)
    assert packed.dtype == np.int32 and packed.shape == (3, 8) and scale.shape == (3, 2)
    groups = w.reshape(3, 2, 32)
    s = bf16_round(np.abs(groups).max(axis=-1) / np.float32(7))
    np.testing.assert_array_equal(scale, s)
    q = np.clip(Q.round_half_away(groups / s[..., None]), -8, 7).reshape(3, 64)
    words = packed.view(np.uint32)
    for k in range(64):
        np.testing.assert_array_equal((words[:, k // 8] >> (4 * (k % 8))) & 0xF, q[:, k] + 8)
    np.testing.assert_array_equal(Q.unpack_rawint4(packed), q)
    np.testing.assert_array_equal(Q.dequantize_rawint4(packed, scale), np.repeat(s, 32, axis=1) * q)


def test_e4m3_codes():
    codes = np.arange(256, dtype=np.uint8)
    values = Q.decode_e4m3(codes)
    assert np.isnan(values[[0x7F, 0xFF]]).all() and np.isfinite(np.delete(values, [0x7F, 0xFF])).all()
    assert values[0x7E] == 448 and values[0xFE] == -448 and values[0x38] == 1.0
    assert values[0x01] == 2.0**-9 and values[0x07] == 7 * 2.0**-9 and values[0x08] == 2.0**-6
    finite = codes[(codes & 0x7F) != 0x7F]
    np.testing.assert_array_equal(Q.encode_e4m3(Q.decode_e4m3(finite)), finite)
    # ties go to the even code; beyond 448 saturates; below half the smallest subnormal is 0
    x = [1.0625, 1.1875, 500, -1e9, 2.0**-10, 3 * 2.0**-10, -0.0, np.nan]
    assert Q.encode_e4m3(x).tolist() == [0x38, 0x3A, 0x7E, 0xFE, 0x00, 0x02, 0x80, 0x7F]


def test_e4m3_matches_torch():
    torch = pytest.importorskip("torch")
    codes = np.arange(256, dtype=np.uint8)
    theirs = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(Q.decode_e4m3(codes), theirs)
    rng = np.random.default_rng(1)
    for scale in (1e-3, 1.0, 100.0):
        x = np.clip(rng.standard_normal(50_000) * scale, -448, 448).astype(np.float32)
        theirs = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        np.testing.assert_array_equal(Q.encode_e4m3(x), theirs)


def test_fp8_quantizers():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((200, 300)).astype(np.float32)
    codes, scale_inv = Q.quantize_fp8_block(w)
    assert codes.dtype == np.uint8 and codes.shape == w.shape and scale_inv.shape == (2, 3)
    assert scale_inv[1, 2] == np.abs(w[128:, 256:]).max() / np.float32(448)
    assert np.abs(Q.decode_e4m3(codes)).max() == 448
    assert rms_error(Q.dequantize_fp8_block(codes, scale_inv), w) < 0.05
    codes, scale = Q.quantize_fp8_perchannel(w)
    assert scale.shape == (200,) and (np.abs(Q.decode_e4m3(codes)).max(axis=1) == 448).all()
    assert rms_error(Q.dequantize_fp8_perchannel(codes, scale), w) < 0.05


def test_mxfp4_rules():
    """The smallest exponent that fits max|w| in E2M1's 6, each element to the nearest E2M1 value
    with ties to the even code, low nibble first; a zero block gets E8M0 byte 0."""
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32)          # block max 6: E = 0
    want = np.array([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0])
    w = np.zeros((3, 32), np.float32)
    w[0, :8], w[0, 8:16] = ties, -ties
    w[1, :8] = ties * 4                                                                  # max 24: E = 2
    w[1, 8] = 24.5                                                                       # max 24.5: E = 3
    blocks, scales = Q.quantize_mxfp4(w)
    assert blocks.shape == (3, 16) and scales.tolist() == [[127], [130], [0]]
    d = Q.dequantize_mxfp4(blocks, scales)
    np.testing.assert_array_equal(d[0, :16], np.concatenate([want, -want]))
    assert (d[2] == 0).all()
    assert blocks[0, 0] == 0 | 2 << 4 and blocks[0, 4] == 8 | 10 << 4   # 0.25, 0.75 -> 0, 1; -0.25, -0.75 -> -0, -1
    np.testing.assert_array_equal(Q.E2M1_VALUES[:8], [0, 0.5, 1, 1.5, 2, 3, 4, 6])
    tiny = np.full((1, 32), 2.0**-140, np.float32)                                       # E clamps at -127
    assert Q.quantize_mxfp4(tiny)[1].tolist() == [[0]]


# -- the reference backend against the rules ---------------------------------------------------------

@pytest.mark.parametrize("method,group_size,zero_point", list(FORMAT_TOL))
def test_kernel_and_format_error(method, group_size, zero_point):
    rng = np.random.default_rng(11)
    weights = random_moe(rng, E, H, I)
    m = layer(method, group_size=group_size, zero_point=zero_point)
    assert (m.layout_id, m.kernel_id) == IDS[method]
    gate, up, down, scales, zeros = Q.checkpoint_arrays(method, *weights, group_size=group_size)
    m.load(gate, up, down, scales=scales, zeros=zeros)
    stored = Q.dequantized_weights(method, *weights, group_size=group_size, zero_point=zero_point)
    max_bound, rms_bound = FORMAT_TOL[(method, group_size, zero_point)]
    for tokens in (1, 33):
        x, ids, w = routing(rng, tokens)
        out = m(x, ids, w)
        kernel = relative_error(out, moe_reference(x, *stored, ids, w))
        exact = moe_reference(x, *weights, ids, w)
        fmt, fmt_rms = relative_error(out, exact), rms_error(out, exact)
        print(f"\n{method} g{group_size} zp={zero_point} tokens={tokens}: kernel {kernel:.2e}, "
              f"format {fmt:.3e} (rms {fmt_rms:.3e})")
        assert kernel < KERNEL_TOL, kernel
        if tokens > 1:   # one token's max is too few samples to bound
            assert fmt < max_bound and fmt_rms < rms_bound, (fmt, fmt_rms)


def tie_weights(rng, shape, group, zero_point):
    """Weights whose every quotient w / s is an exact tie (k + 0.5), so half-even rounding
    would disagree with the documented ties-away-from-zero on every element."""
    rows, cols = shape
    if group == 0:   # INT8: s = 1/64 per row (row max 127/64)
        w = (rng.integers(-127, 126, shape) + 0.5) / 64
        w[:, 0] = 127 / 64
        return w.astype(np.float32)
    w = (rng.integers(-7, 7, shape) + 0.5) / 64
    g = w.reshape(rows, cols // group, group)
    if zero_point:   # lo = -7/64, hi = 8/64: s = 1/64, z = 7
        g[...] = np.clip(g, -7 / 64, 8 / 64)
        g[..., 0], g[..., 1] = -7 / 64, 8 / 64
    else:            # max|w| = 7/64: s = 1/64
        g[..., 0] = 7 / 64
    return w.astype(np.float32)


@pytest.mark.parametrize("method,group_size,zero_point", [("INT8", 0, False), ("INT4", 32, False), ("INT4", 64, True)])
def test_packer_rounds_ties_away_from_zero(method, group_size, zero_point):
    rng = np.random.default_rng(5)
    h, i = 128, 64
    weights = [np.stack([tie_weights(rng, s, group_size, zero_point) for _ in range(2)])
               for s in ((i, h), (i, h), (h, i))]
    m = layer(method, hidden=h, intermediate=i, experts=2, top_k=1, group_size=group_size, zero_point=zero_point)
    m.load(*weights)
    x, ids, w = routing(rng, 8, experts=2, top_k=1, hidden=h)
    ids[:] = np.arange(8).reshape(8, 1) % 2
    out = m(x, ids, w)
    stored = Q.dequantized_weights(method, *weights, group_size=group_size, zero_point=zero_point)
    assert relative_error(out, moe_reference(x, *stored, ids, w)) < KERNEL_TOL
    # Ties are everywhere, so rounding them to even would be plainly visible.
    assert relative_error(out, moe_reference(x, *[np.round(a * 64) / 64 for a in weights], ids, w)) > 1e-3


@pytest.mark.parametrize("method", ["FP8", "FP8_PERCHANNEL"])
@pytest.mark.parametrize("exponent", range(16))
def test_every_e4m3_code_decodes_exactly(method, exponent):
    """Bytes of one exponent field each (both signs, every mantissa), so a wrong decode of
    any code is large next to the output's RMS."""
    rng = np.random.default_rng(exponent)
    h, i = 64, 32
    mantissas = 7 if exponent == 15 else 8   # 0x7F / 0xFF are NaN
    codes = [(rng.integers(0, 2, (2, *s)) << 7 | exponent << 3 | rng.integers(0, mantissas, (2, *s))).astype(np.uint8)
             for s in ((i, h), (i, h), (h, i))]
    magnitude = 2.0 ** (exponent - 7)
    if method == "FP8":
        scales = [np.full((2, 1, 1), 0.5 / magnitude / np.sqrt(k), np.float32) for k in (h, h, i)]
        stored = [Q.dequantize_fp8_block(c, s) for c, s in zip(codes, scales)]
    else:
        scales = [np.full((2, n, 1), 0.5 / magnitude / np.sqrt(k), np.float32) for n, k in ((i, h), (i, h), (h, i))]
        stored = [Q.dequantize_fp8_perchannel(c, s) for c, s in zip(codes, scales)]
    m = layer(method, hidden=h, intermediate=i, experts=2, top_k=2)
    m.load(*codes, scales=scales)
    x, ids, w = routing(rng, 5, experts=2, top_k=2, hidden=h)
    assert relative_error(m(x, ids, w), moe_reference(x, *stored, ids, w)) < KERNEL_TOL


@pytest.mark.parametrize("backend", ["reference", "avx"])
@pytest.mark.parametrize("down_exponent", [0, 3, 127, 225])
def test_every_e2m1_code_and_e8m0_scale_decodes_exactly(backend, down_exponent):
    """Random codes over all 16 E2M1 values, gate/up scale bytes spread around 2^-3, and down's
    scale bytes near one end of E8M0's range or the other (2^-127: a subnormal f32), so a
    wrong decode of any code or exponent shows next to the output's RMS."""
    if backend == "avx":
        pytest.importorskip("kt_backend_avx")
    rng = np.random.default_rng(down_exponent)
    h, i = 128, 64
    blocks = [rng.integers(0, 256, (2, *s), dtype=np.uint8) for s in ((i, h // 2), (i, h // 2), (h, i // 2))]
    scales = [(124 + rng.integers(-6, 7, (2, n, k // 32))).astype(np.uint8) for n, k in ((i, h), (i, h))]
    scales.append(np.clip(down_exponent + rng.integers(0, 3, (2, h, i // 32)), 0, 254).astype(np.uint8))
    stored = [Q.dequantize_mxfp4(b, s) for b, s in zip(blocks, scales)]
    m = kt_core.MoE(num_experts=2, top_k=2, hidden_size=h, intermediate_size=i, method="MXFP4", backend=backend)
    m.load(*blocks, scales=scales)
    x, ids, w = routing(rng, 5, experts=2, top_k=2, hidden=h)
    tol = KERNEL_TOL if backend == "reference" else 2e-2   # avx quantizes activations to int8 (two passes)
    assert relative_error(m(x, ids, w), moe_reference(x, *stored, ids, w)) < tol


def test_mxfp4_refuses_wrong_inputs():
    gate, up, down = floats()
    blocks, scales = zip(*(Q.quantize_mxfp4(a) for a in (gate, up, down)))
    with pytest.raises(ValueError, match=r"MXFP4: gate blocks must be uint8 \[64, 64\] \(two E2M1 codes per byte\); "
                                         r"got float32 \[64, 128\]"):
        load_one("MXFP4", (gate, up, down), scales=scales)
    with pytest.raises(ValueError, match=r"gate scales must be uint8, bfloat16 or float32 \[64, 4\] \(E8M0 exponents.*"
                                         r"got nothing"):
        load_one("MXFP4", blocks)
    with pytest.raises(ValueError, match=r"gate scales must be uint8, bfloat16 or float32 \[64, 4\].*got int8 \[64, 4\]"):
        load_one("MXFP4", blocks, scales=(scales[0].astype(np.int8), *scales[1:]))
    nan = [s.copy() for s in scales]
    nan[2][7, 1] = 0xFF
    with pytest.raises(ValueError, match=r"down scale \[7, 1\] is not finite \(E8M0 0xFF, or a float NaN/Inf\)"):
        load_one("MXFP4", blocks, scales=tuple(nan))
    values = [np.ldexp(1.0, s.astype(np.int64) - 127).astype(np.float32) for s in scales]
    values[0][3, 2] = np.inf
    with pytest.raises(ValueError, match=r"gate scales hold NaN or Inf at \[3, 2\]"):   # the core's own check
        load_one("MXFP4", blocks, scales=tuple(values))
    with pytest.raises(ValueError, match="MXFP4's scales cover 32 elements; group_size must be 0 or 32, got 64"):
        load_one("MXFP4", blocks, scales=scales, group_size=64)
    with pytest.raises(ValueError, match="zero_point=True is an INT4 option; MXFP4 is symmetric"):
        load_one("MXFP4", blocks, scales=scales, zero_point=True)
    with pytest.raises(ValueError, match="group size 32 does not divide hidden = 80"):
        load_one("MXFP4", floats(80, 64), hidden=80)


def test_gptq_int4_is_int4_transposed():
    """GPTQ's K-major qweight/scales hold INT4's symmetric codes: a GPTQ layer computes exactly
    what an INT4 layer given the same codes (stored u = q + 8, K-major) computes, on the
    reference and on avx (whose packer writes INT4's layout from them)."""
    rng = np.random.default_rng(12)
    weights = random_moe(rng, 2, 256, 128)
    qweight, scales = zip(*(Q.pack_gptq_int4(m, 64) for m in weights))
    word = qweight[0].view(np.uint32)[1, 3, 5]   # expert 1, k 24..31 of column 5
    q, s, _ = Q.quantize_int4(weights[0][1], 64)
    assert [(int(word) >> (4 * i)) & 15 for i in range(8)] == list(q[5, 24:32] + 8)
    assert scales[0][1, 0, 5] == s[5, 0]
    x, ids, w = routing(rng, 7, experts=2, hidden=256)
    for backend in ("reference", "avx"):
        if backend == "avx":
            pytest.importorskip("kt_backend_avx")
        outs = []
        for method, values, sc in (("GPTQ_INT4", qweight, scales), ("INT4", weights, None)):
            m = kt_core.MoE(num_experts=2, top_k=TOP_K, hidden_size=256, intermediate_size=128, method=method,
                            backend=backend, group_size=64)
            m.load(*values, scales=sc)
            outs.append(m(x, ids, w))
        np.testing.assert_array_equal(outs[0], outs[1])


def test_gptq_int4_refuses_wrong_inputs():
    gate, up, down = floats()
    qweight, scales = zip(*(Q.pack_gptq_int4(a, 32) for a in (gate, up, down)))
    with pytest.raises(ValueError, match=r"GPTQ_INT4: gate qweight must be int32 \[16, 64\] \(K-major.*got int32 \[64, 16\]"):
        load_one("GPTQ_INT4", [np.ascontiguousarray(a.T) for a in qweight], scales=scales, group_size=32)
    with pytest.raises(ValueError, match=r"gate scales must be float32, float16 or bfloat16 \[4, 64\] \(K-major: one row "
                                         r"per group of 32\); got nothing"):
        load_one("GPTQ_INT4", qweight, group_size=32)
    with pytest.raises(ValueError, match=r"gate scales must be .*\[2, 64\].*got float32 \[4, 64\]"):
        load_one("GPTQ_INT4", qweight, scales=scales, group_size=64)
    with pytest.raises(ValueError, match="zero_point=True is an INT4 option; GPTQ_INT4 is the symmetric GPTQ format"):
        load_one("GPTQ_INT4", qweight, scales=scales, group_size=32, zero_point=True)
    with pytest.raises(ValueError, match="GPTQ_INT4: group_size 48 is not supported"):
        load_one("GPTQ_INT4", qweight, scales=scales, group_size=48)


def test_fp8_blocks_need_not_divide_the_shape():
    rng = np.random.default_rng(3)
    h, i = 200, 72     # gate/up scale_inv [1, 2], down [2, 1]
    weights = random_moe(rng, 3, h, i)
    gate, up, down, scales = Q.checkpoint_inputs("FP8", *weights)
    assert [s.shape[1:] for s in scales] == [(1, 2), (1, 2), (2, 1)]
    m = layer("FP8", hidden=h, intermediate=i, experts=3)
    m.load(gate, up, down, scales=scales)
    x, ids, w = routing(rng, 9, experts=3, hidden=h)
    stored = Q.dequantized_weights("FP8", *weights)
    assert relative_error(m(x, ids, w), moe_reference(x, *stored, ids, w)) < KERNEL_TOL


def test_fp8_perchannel_scale_as_one_row():
    rng = np.random.default_rng(4)
    weights = random_moe(rng, 2, 64, 32)
    gate, up, down, scales = Q.checkpoint_inputs("FP8_PERCHANNEL", *weights)
    x, ids, w = routing(rng, 4, experts=2, hidden=64)
    outs = []
    for s in (scales, tuple(a.reshape(2, 1, -1) for a in scales)):   # [N, 1] and [1, N]
        m = layer("FP8_PERCHANNEL", hidden=64, intermediate=32, experts=2)
        m.load(gate, up, down, scales=s)
        outs.append(m(x, ids, w))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("backend", ["reference", "avx"])
def test_mxfp4_scales_as_values(backend):
    """kt-kernel's MXFP4 wrapper takes the E8M0 scales as bf16 values: bf16 (torch) and f32 scales
    equal to 2^(e - 127) give the very layer the E8M0 bytes give."""
    torch = pytest.importorskip("torch")
    if backend == "avx":
        pytest.importorskip("kt_backend_avx")
    rng = np.random.default_rng(8)
    gate, up, down, scales = Q.checkpoint_inputs("MXFP4", *random_moe(rng, 2, 128, 64))
    values = [np.ldexp(1.0, s.astype(np.int64) - 127).astype(np.float32) for s in scales]
    x, ids, w = routing(rng, 6, experts=2, hidden=128)
    outs = []
    for s in (scales, values, [torch.from_numpy(v).to(torch.bfloat16) for v in values]):
        m = kt_core.MoE(num_experts=2, top_k=TOP_K, hidden_size=128, intermediate_size=64, method="MXFP4", backend=backend)
        m.load(gate, up, down, scales=s)
        outs.append(m(x, ids, w))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


@pytest.mark.parametrize("method", ["RAWINT4", "FP8", "FP8_PERCHANNEL"])
def test_checkpoint_tensors_from_torch(method):
    """A checkpoint's own dtypes (bfloat16 scales, float8_e4m3fn weights) give the same
    layer as float32 scales and uint8 bytes."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    weights = random_moe(rng, 2, 128, 64)
    gate, up, down, scales = Q.checkpoint_inputs(method, *weights)
    if method == "RAWINT4":
        torch_values = [torch.from_numpy(a) for a in (gate, up, down)]
        torch_scales = [Q.scale_as_torch_bf16(s) for s in scales]
    else:
        torch_values = [torch.from_numpy(a).view(torch.float8_e4m3fn) for a in (gate, up, down)]
        scales = tuple(bf16_round(s) for s in scales)
        torch_scales = [Q.scale_as_torch_bf16(s) for s in scales]
    x, ids, w = routing(rng, 6, experts=2, hidden=128)
    outs = []
    for values, s in (((gate, up, down), scales), (torch_values, torch_scales)):
        m = layer(method, hidden=128, intermediate=64, experts=2)
        m.load(*values, scales=s)
        outs.append(m(x, ids, w))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("weights_kind,ratio", [("gaussian", 1.1), ("heavy-tailed", 1.4)])
def test_int4_groups_beat_per_row(weights_kind, ratio, zero_point):
    """Group-wise INT4 against per-row INT4 (group = K, emulated in NumPy) on long rows.
    Measured rms_error ratios per-row / g128: about 1.2 on Gaussian weights and 1.6 on
    Student-t(4) weights (trained weights are heavy-tailed); g32 improves further."""
    rng = np.random.default_rng(9)
    e, h, i = 4, 1024, 512
    weights = random_moe(rng, e, h, i)
    if weights_kind == "heavy-tailed":
        weights = tuple((rng.standard_t(4, a.shape) / np.sqrt(2 * a.shape[-1])).astype(np.float32) for a in weights)
    x, ids, w = routing(rng, 32, experts=e, hidden=h)
    exact = moe_reference(x, *weights, ids, w)
    per_row = [Q.dequantize_int4(*Q.quantize_int4(a, a.shape[-1], zero_point)) for a in weights]
    errors = {"per-row": rms_error(moe_reference(x, *per_row, ids, w), exact)}
    for g in (128, 64, 32):
        m = layer("INT4", hidden=h, intermediate=i, experts=e, group_size=g, zero_point=zero_point)
        m.load(*weights)
        out = m(x, ids, w)
        stored = Q.dequantized_weights("INT4", *weights, group_size=g, zero_point=zero_point)
        assert relative_error(out, moe_reference(x, *stored, ids, w)) < KERNEL_TOL
        errors[f"g{g}"] = rms_error(out, exact)
    print(f"\nINT4 {weights_kind} zp={zero_point} rms_error: " + ", ".join(f"{k} {v:.3f}" for k, v in errors.items())
          + f"; per-row / g128 = {errors['per-row'] / errors['g128']:.2f}")
    assert errors["g128"] < errors["per-row"] / ratio
    assert errors["g32"] < errors["g64"] < errors["g128"]


def test_default_int4_group_is_128():
    rng = np.random.default_rng(8)
    weights = random_moe(rng, 2, 256, 128)
    x, ids, w = routing(rng, 5, experts=2)
    outs = []
    for g in (0, 128):
        m = layer("INT4", experts=2, group_size=g)
        m.load(*weights)
        outs.append(m(x, ids, w))
    np.testing.assert_array_equal(outs[0], outs[1])


# -- refused inputs ------------------------------------------------------------------------------------

def load_one(method, values, scales=None, hidden=128, intermediate=64, **config):
    """Loads expert 0 of a one-expert layer with `values` (gate, up, down) and `scales`."""
    m = layer(method, hidden=hidden, intermediate=intermediate, experts=1, top_k=1, **config)
    m.load_expert(0, *values, scales=scales)


def floats(hidden=128, intermediate=64):
    return [a[0].astype(np.float32) for a in random_moe(np.random.default_rng(0), 1, hidden, intermediate)]


@pytest.mark.parametrize("group_size", [48, 100, 16, 256])
def test_int4_refuses_unsupported_group_size(group_size):
    with pytest.raises(ValueError, match=f"INT4: group_size {group_size} is not supported; use 32, 64 or 128"):
        load_one("INT4", floats(), group_size=group_size)


def test_int4_refuses_group_not_dividing_k():
    with pytest.raises(ValueError, match="group size 64 does not divide hidden = 96"):
        load_one("INT4", floats(96, 64), hidden=96, group_size=64)
    with pytest.raises(ValueError, match="group size 128 does not divide intermediate = 64"):
        load_one("INT4", floats(), group_size=128)


@pytest.mark.parametrize(("hidden", "intermediate", "group"), [(128, 64, 64), (2880, 64, 64), (320, 96, 32), (256, 256, 128)])
def test_int4_default_group_is_the_largest_dividing_both(hidden, intermediate, group):
    """kt-kernel takes GPT-OSS's hidden 2880 and a 320/96 layer: the default group follows the shape."""
    m = layer("INT4", hidden=hidden, intermediate=intermediate, experts=1, top_k=1)
    assert m.group_size == group
    m.load_expert(0, *floats(hidden, intermediate))


def test_int4_refuses_a_shape_no_group_divides():
    with pytest.raises(ValueError, match=r"INT4 needs a group size in \(32, 64, 128\) dividing hidden \(96\) and "
                                         r"intermediate \(40\), and none does"):
        layer("INT4", hidden=96, intermediate=40, experts=1, top_k=1)


def test_rawint4_refuses_wrong_inputs():
    gate, up, down = floats()
    packed, scale = zip(*(Q.pack_rawint4(a) for a in (gate, up, down)))
    with pytest.raises(ValueError, match=r"RAWINT4: gate must be int32 \[64, 16\].*got float32 \[64, 128\]"):
        load_one("RAWINT4", (gate, up, down), scales=scale)
    with pytest.raises(ValueError, match=r"gate scales must be float32 or bfloat16 \[64, 4\].*got nothing"):
        load_one("RAWINT4", packed)
    bad = (scale[0][:, :2], scale[1], scale[2])
    with pytest.raises(ValueError, match=r"gate scales must be float32 or bfloat16 \[64, 4\].*got float32 \[64, 2\]"):
        load_one("RAWINT4", packed, scales=bad)
    bad = (packed[0], packed[1], packed[2].astype(np.int8))
    with pytest.raises(ValueError, match=r"down must be int32 \[128, 8\].*got int8 \[128, 8\]"):
        load_one("RAWINT4", bad, scales=scale)
    with pytest.raises(ValueError, match="group size 32 does not divide hidden = 80"):
        load_one("RAWINT4", floats(80, 64), hidden=80)
    with pytest.raises(ValueError, match="group_size must be 0 or 32, got 64"):
        load_one("RAWINT4", packed, scales=scale, group_size=64)
    off = [s.copy() for s in scale]   # f32 scales only as bf16 values, as every backend keeps them
    off[0][5, 1] = np.nextafter(off[0][5, 1], np.float32(np.inf))
    with pytest.raises(ValueError, match=r"RAWINT4: gate weight_scale \[5, 1\] = .* is not a bf16 value"):
        load_one("RAWINT4", packed, scales=tuple(off))


@pytest.mark.parametrize("method", ["FP8", "FP8_PERCHANNEL"])
def test_fp8_refuses_wrong_inputs(method):
    gate, up, down, scales = Q.checkpoint_inputs(method, *(a[None] for a in floats()))
    codes, scales = [gate[0], up[0], down[0]], tuple(s[0] for s in scales)
    want_gate = r"\[1, 1\]" if method == "FP8" else r"\[64, 1\]"
    with pytest.raises(ValueError, match=f"{method}: gate scales must be float32 or bfloat16 {want_gate}.*got nothing"):
        load_one(method, codes)
    wrong = (np.ones((2, 2), np.float32), scales[1], scales[2])
    with pytest.raises(ValueError, match=f"gate scales must be .*{want_gate}.*got float32 \\[2, 2\\]"):
        load_one(method, codes, scales=wrong)
    for nan in (0x7F, 0xFF):
        bad = codes[1].copy()
        bad[3, 5] = nan
        with pytest.raises(ValueError, match=rf"up holds the E4M3 NaN code 0x{nan:X} at \[3, 5\]"):
            load_one(method, (codes[0], bad, codes[2]), scales=scales)
    with pytest.raises(ValueError, match=r"gate must be uint8 \[64, 128\] \(E4M3 bytes\); got float32 \[64, 128\]"):
        load_one(method, floats(), scales=scales)
    with pytest.raises(ValueError, match="zero_point=True is an INT4 option"):
        load_one(method, codes, scales=scales, zero_point=True)


@pytest.mark.parametrize(("method", "dtype"), [("INT8", r"int8 \[64, 128\]"), ("INT4", r"uint8 \[64, 64\]")])
def test_quantize_at_load_methods_check_codes(method, dtype):
    gate, up, down = floats()
    q = [Q.quantize_int8(a) for a in (gate, up, down)]
    config = {"group_size": 32} if method == "INT4" else {}
    with pytest.raises(ValueError, match=rf"{method}: gate codes must be {dtype}.*got int32 \[64, 128\]"):
        load_one(method, [a.astype(np.int32) for a, _ in q], **config)
    with pytest.raises(ValueError, match=r"gate scales must not be given.*got float32 \[64, 1\]"):
        load_one(method, (gate, up, down), scales=tuple(s[:, None] for _, s in q), **config)


def test_int8_refuses_int4_options():
    with pytest.raises(ValueError, match="INT8 has one scale per row; group_size must be 0, got 64"):
        load_one("INT8", floats(), group_size=64)
    with pytest.raises(ValueError, match="zero_point=True is an INT4 option; INT8 is symmetric"):
        load_one("INT8", floats(), zero_point=True)


def _one_expert(method):
    """Expert 0's checkpoint tensors for `method`: (codes, scales, zeros) per (gate, up, down)."""
    g, u, d, s, z = Q.checkpoint_arrays(method, *(a[None] for a in floats()))
    return [g[0], u[0], d[0]], [a[0] for a in s], None if z is None else [a[0] for a in z]


@pytest.mark.parametrize("backend", ["reference", "avx"])
def test_nvfp4_refuses_wrong_inputs(backend):
    if backend == "avx":
        pytest.importorskip("kt_backend_avx")
    codes, scales, glob = _one_expert("NVFP4")

    def load(scales=scales, zeros=glob):
        m = kt_core.MoE(num_experts=1, top_k=1, hidden_size=128, intermediate_size=64, method="NVFP4", backend=backend)
        m.load_expert(0, *codes, scales=scales, zeros=zeros)

    load()
    with pytest.raises(ValueError, match=r"NVFP4: .*gate weight_scale_2.*float32"):
        load(zeros=None)
    with pytest.raises(ValueError, match=r"NVFP4: .*gate weight_scale .*\[64, 8\]"):
        load(scales=[np.zeros((64, 4), np.uint8), scales[1], scales[2]])
    nan = scales[0].copy()
    nan[3, 2] = 0xFF
    with pytest.raises(ValueError, match=r"NVFP4: .*gate weight_scale \[3, 2\] is the E4M3 NaN code"):
        load(scales=[nan, scales[1], scales[2]])


@pytest.mark.parametrize("backend", ["reference", "avx"])
def test_mxfp8_refuses_wrong_inputs(backend):
    if backend == "avx":
        pytest.importorskip("kt_backend_avx")
    codes, scales, _ = _one_expert("MXFP8")

    def load(scales=scales):
        m = kt_core.MoE(num_experts=1, top_k=1, hidden_size=128, intermediate_size=64, method="MXFP8", backend=backend)
        m.load_expert(0, *codes, scales=scales)

    load()
    with pytest.raises(ValueError, match=r"MXFP8: .*gate scales .*uint8.*\[64, 4\]"):
        load(scales=[scales[0].astype(np.float32), scales[1], scales[2]])
    nan = scales[2].copy()
    nan[1, 0] = 0xFF
    with pytest.raises(ValueError, match=r"MXFP8: .*down scale \[1, 0\] is E8M0 0xFF"):
        load(scales=[scales[0], scales[1], nan])
