"""The software tiles against hand-computed cases: the instructions' arithmetic (int32 wrap,
signedness of each operand, bf16 pairs with denormals-as-zero, flush-to-zero and the SDM's
even/odd accumulation) — the emulation is what every AMX kernel test on this machine runs on."""

import struct

import numpy as np
import pytest

from kt_backend_amx import _build

pytestmark = pytest.mark.skipif(not _build.EMULATED, reason="hardware build: no software tiles to test")


def i32(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 4}i", data))


def f32(data: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def bf16_pairs(values) -> bytes:
    """bf16 bit patterns (ints) to little-endian bytes."""
    return struct.pack(f"<{len(values)}H", *values)


def test_int8_dot_products_by_hand(native):
    a = bytes([1, 2, 3, 4])                  # one row, one dword
    b = bytes([5, 6, 7, 8])                  # one B row (k quad 0), one column
    assert i32(native.tile_dot("tdpbssd", a, b, bytes(4), 1, 4, 4)) == [1 * 5 + 2 * 6 + 3 * 7 + 4 * 8]
    neg = bytes([0xFF, 0x80, 0, 0])          # -1, -128 signed; 255, 128 unsigned
    w = bytes([2, 0xFF, 0, 0])               # 2, -1 signed; 2, 255 unsigned
    assert i32(native.tile_dot("tdpbssd", neg, w, bytes(4), 1, 4, 4)) == [-1 * 2 + -128 * -1]
    assert i32(native.tile_dot("tdpbusd", neg, w, bytes(4), 1, 4, 4)) == [255 * 2 + 128 * -1]
    assert i32(native.tile_dot("tdpbsud", neg, w, bytes(4), 1, 4, 4)) == [-1 * 2 + -128 * 255]
    assert i32(native.tile_dot("tdpbuud", neg, w, bytes(4), 1, 4, 4)) == [255 * 2 + 128 * 255]


def test_int32_accumulation_wraps(native):
    c = struct.pack("<i", 2**31 - 1)
    out = i32(native.tile_dot("tdpbssd", bytes([1, 0, 0, 0]), bytes([1, 0, 0, 0]), c, 1, 4, 4))
    assert out == [-(2**31)]                 # 0x7fffffff + 1 wraps, it does not saturate


def test_int8_full_tiles_match_numpy(native):
    rng = np.random.default_rng(0)
    for op, sa, sb in (("tdpbssd", True, True), ("tdpbusd", False, True), ("tdpbsud", True, False),
                       ("tdpbuud", False, False)):
        a = rng.integers(0, 256, (16, 64), dtype=np.uint8)
        b = rng.integers(0, 256, (16, 64), dtype=np.uint8)
        c = rng.integers(-2**20, 2**20, (16, 16), dtype=np.int32)
        av = a.view(np.int8).astype(np.int64) if sa else a.astype(np.int64)
        bv = b.view(np.int8).astype(np.int64) if sb else b.astype(np.int64)
        # B row k holds (k-quad k) x 16 columns x 4 bytes: element (4k + i, n) = b[k, 4n + i].
        bk = bv.reshape(16, 16, 4).transpose(0, 2, 1).reshape(64, 16)
        expect = (c.astype(np.int64) + av @ bk).astype(np.int32)
        got = np.frombuffer(native.tile_dot(op, a.tobytes(), b.tobytes(), c.tobytes(), 16, 64, 64), dtype=np.int32)
        np.testing.assert_array_equal(got.reshape(16, 16), expect, err_msg=op)


ONE, TWO, TINY = 0x3F80, 0x4000, 0x0001     # bf16 1.0, 2.0, the smallest denormal


def test_bf16_pairs_by_hand(native):
    a = bf16_pairs([TWO, 0x4040])            # (2, 3)
    b = bf16_pairs([0x4080, 0x40A0])         # (4, 5)
    assert f32(native.tile_dot("tdpbf16ps", a, b, struct.pack("<f", 1.0), 1, 4, 4)) == [1 + 2 * 4 + 3 * 5]


def test_bf16_denormal_inputs_read_as_zero(native):
    big = 0x7F00                             # 2^127
    out = f32(native.tile_dot("tdpbf16ps", bf16_pairs([TINY, 0]), bf16_pairs([big, 0]), bytes(4), 1, 4, 4))
    assert out == [0.0]                      # 2^-133 * 2^127 would be 2^-6 without DAZ


def test_bf16_denormal_results_flush_to_zero(native):
    small = 0x1C80                           # 2^-70: the product 2^-140 is an fp32 denormal
    out = f32(native.tile_dot("tdpbf16ps", bf16_pairs([small, 0]), bf16_pairs([small, 0]), bytes(4), 1, 4, 4))
    assert out == [0.0]


def test_bf16_even_and_odd_products_sum_before_the_accumulator(native):
    # Each product is 2^-24. Added one at a time to C = 1 both would round away (ties to even);
    # the SDM sums the even and odd accumulators first (2^-23) and adds that once.
    tiny = 0x3380                            # 2^-24
    out = f32(native.tile_dot("tdpbf16ps", bf16_pairs([tiny, tiny]), bf16_pairs([ONE, ONE]),
                              struct.pack("<f", 1.0), 1, 4, 4))
    assert out == [float(np.float32(1) + np.float32(2.0**-23))]


def test_bad_shapes_are_refused(native):
    with pytest.raises(ValueError, match="m must be 1..16"):
        native.tile_dot("tdpbssd", bytes(4), bytes(4), bytes(4), 17, 4, 4)
    with pytest.raises(ValueError, match="unknown instruction"):
        native.tile_dot("tdpbxyz", bytes(4), bytes(4), bytes(4), 1, 4, 4)
