"""The weight formats of docs/formats.md in NumPy, bit for bit: what a checkpoint of each
method holds, and the weights a backend must compute with once it has packed them.

Quantizers take float weights [..., N, K] (a row is an output channel, K the reduction
dimension; leading dimensions stack experts) and do the f32 arithmetic the document fixes.
Dequantizers return float64: scale * code is exact there, as it is in the reference
backend's double accumulation, so `moe_reference` over them is the oracle's exact target.
"""

from __future__ import annotations

import numpy as np

from .reference import bf16_round

RAWINT4_GROUP = 32
FP8_BLOCK = 128
E4M3_MAX = 448.0


def _f32(w) -> np.ndarray:
    return np.ascontiguousarray(w, dtype=np.float32)


def round_half_away(x) -> np.ndarray:
    """std::lround on f32 values: nearest, ties away from zero (NumPy's round is half-even).
    Done in float64, where x + 0.5 is exact for every f32 x."""
    x = np.asarray(x, dtype=np.float64)
    return np.trunc(x + np.copysign(0.5, x))


def _codes(w: np.ndarray, s: np.ndarray, lo: int, hi: int, offset=0) -> np.ndarray:
    """clamp(round(w / s) + offset, lo, hi) with the f32 quotient; s = 0 gives 0, as in the packer."""
    with np.errstate(over="ignore"):
        quotient = np.divide(w, s, out=np.zeros_like(w), where=s != 0)
    return np.where(s != 0, np.clip(round_half_away(quotient) + offset, lo, hi), 0).astype(np.int8)


# -- INT8 ------------------------------------------------------------------------------------

def quantize_int8(w):
    """Per-row symmetric INT8: s = max|w| / 127 (f32), q = clamp(round(w / s), -127, 127).
    Returns (q int8 [..., N, K], s float32 [..., N])."""
    w = _f32(w)
    s = np.max(np.abs(w), axis=-1, keepdims=True) / np.float32(127)
    return _codes(w, s, -127, 127), s[..., 0]


def dequantize_int8(q, s) -> np.ndarray:
    return np.asarray(s, dtype=np.float64)[..., None] * np.asarray(q, dtype=np.float64)


# -- INT4 ------------------------------------------------------------------------------------

def _grouped(w: np.ndarray, group_size: int) -> np.ndarray:
    k = w.shape[-1]
    if group_size <= 0 or k % group_size:
        raise ValueError(f"group size {group_size} does not divide K = {k}")
    return w.reshape(*w.shape[:-1], k // group_size, group_size)


def quantize_int4(w, group_size: int = 128, zero_point: bool = False):
    """Group-wise INT4 over `group_size` consecutive k (0 means 128). Backends take 32, 64
    or 128; any divisor of K is computed here, e.g. K itself to emulate per-row INT4.

    Symmetric: s = max|w| / 7, q = clamp(round(w / s), -8, 7); returns (q, s, None).
    Asymmetric: lo = min(w, 0), hi = max(w, 0), s = (hi - lo) / 15,
    z = clamp(round(-lo / s), 0, 15), q = clamp(round(w / s) + z, 0, 15); returns (q, s, z).
    q int8 [..., N, K]; s float32 and z int8 [..., N, K / group_size]."""
    g = _grouped(_f32(w), group_size or 128)
    if not zero_point:
        s = np.max(np.abs(g), axis=-1, keepdims=True) / np.float32(7)
        return _codes(g, s, -8, 7).reshape(np.shape(w)), s[..., 0], None
    lo = np.minimum(g.min(axis=-1, keepdims=True), np.float32(0))
    hi = np.maximum(g.max(axis=-1, keepdims=True), np.float32(0))
    s = (hi - lo) / np.float32(15)
    z = _codes(-lo, s, 0, 15)
    q = _codes(g, s, 0, 15, offset=z.astype(np.float64))
    return q.reshape(np.shape(w)), s[..., 0], z[..., 0]


def dequantize_int4(q, s, z=None) -> np.ndarray:
    """s[n, g] * (q - z[n, g]) in float64; the group size is K / s.shape[-1]."""
    q, s = np.asarray(q, dtype=np.float64), np.asarray(s, dtype=np.float64)
    codes = _grouped(q, q.shape[-1] // s.shape[-1])
    if z is not None:
        codes = codes - np.asarray(z, dtype=np.float64)[..., None]
    return (s[..., None] * codes).reshape(np.shape(q))


# -- RAWINT4 (compressed-tensors pack-quantized) -----------------------------------------------

def pack_rawint4(w):
    """Symmetric INT4 with group 32 in the compressed-tensors layout RAWINT4 consumes.
    The scale is rounded to bfloat16 before the codes are computed, as a bf16 checkpoint
    stores it: s = bf16(max|w| / 7), q = clamp(round(w / s), -8, 7).
    Returns (weight_packed int32 [..., N, K/8] with element k in bits 4*(k%8) of word k/8,
    stored as q + 8; weight_scale float32 [..., N, K/32] holding bf16 values: pass it as is,
    or as torch bfloat16 through scale_as_torch_bf16)."""
    g = _grouped(_f32(w), RAWINT4_GROUP)
    s = bf16_round(np.max(np.abs(g), axis=-1, keepdims=True) / np.float32(7))
    nibbles = (_codes(g, s, -8, 7).astype(np.int64) + 8).reshape(*np.shape(w)[:-1], -1, 8)
    words = np.sum(nibbles << (4 * np.arange(8)), axis=-1).astype(np.uint32)
    return words.view(np.int32), s[..., 0]


def unpack_rawint4(packed) -> np.ndarray:
    """The INT4 codes q in [-8, 7] (int8 [..., N, K]) of weight_packed words."""
    words = np.asarray(packed, dtype=np.int32).view(np.uint32)
    nibbles = (words[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    return (nibbles.astype(np.int8) - 8).reshape(*words.shape[:-1], -1)


def dequantize_rawint4(packed, scale) -> np.ndarray:
    return dequantize_int4(unpack_rawint4(packed), scale)


def scale_as_torch_bf16(scale):
    """A float32 array of bf16 values as the torch bfloat16 tensor a checkpoint holds (exact).
    Needs torch."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32)).to(torch.bfloat16)


# -- FP8 E4M3 ----------------------------------------------------------------------------------

def decode_e4m3(codes) -> np.ndarray:
    """E4M3 "fn" bytes to float32 (exact): bias 7, no infinities, 0x7F and 0xFF are NaN,
    exponent field 0 is subnormal (m * 2^-9)."""
    b = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    e, m = (b >> 3) & 0xF, b & 7
    magnitude = np.where(e == 0, m * 2.0**-9, (8 + m) * np.exp2(e - 10.0))
    value = np.where(b & 0x80, -magnitude, magnitude)
    return np.where((b & 0x7F) == 0x7F, np.nan, value).astype(np.float32)


# The finite non-negative E4M3 values in code order (0x00..0x7E), which is also value order.
_E4M3_POSITIVE = decode_e4m3(np.arange(0x7F)).astype(np.float64)


def encode_e4m3(x) -> np.ndarray:
    """Float values to E4M3 bytes: round to nearest, ties to even (the even code), saturating
    to ±448; NaN gives 0x7F. The sign bit is kept, also for values that round to zero."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    below = np.clip(np.searchsorted(_E4M3_POSITIVE, a, side="right") - 1, 0, 0x7E)
    above = np.minimum(below + 1, 0x7E)
    middle = (_E4M3_POSITIVE[below] + _E4M3_POSITIVE[above]) / 2
    round_up = (a > middle) | ((a == middle) & (below % 2 == 1))
    code = np.where(round_up, above, below).astype(np.uint8)
    code |= np.signbit(x).astype(np.uint8) << 7
    return np.where(np.isnan(x), np.uint8(0x7F), code).astype(np.uint8)


def _blocks(w: np.ndarray, block: int) -> np.ndarray:
    """w [..., N, K] zero-padded to whole blocks, as [..., N/block, block, K/block, block]."""
    n, k = w.shape[-2:]
    nb, kb = -(-n // block), -(-k // block)
    padded = np.zeros((*w.shape[:-2], nb * block, kb * block), dtype=w.dtype)
    padded[..., :n, :k] = w
    return padded.reshape(*w.shape[:-2], nb, block, kb, block)


def _expand_blocks(scale: np.ndarray, block: int, n: int, k: int) -> np.ndarray:
    return np.repeat(np.repeat(scale, block, axis=-2), block, axis=-1)[..., :n, :k]


def quantize_fp8_block(w, block: int = FP8_BLOCK):
    """DeepSeek-style FP8: per block x block tile, scale_inv = max|w| / 448 (f32) and
    byte = e4m3(w / scale_inv) (f32 quotient; a zero tile gives zero bytes).
    Returns (uint8 [..., N, K], scale_inv float32 [..., ceil(N/block), ceil(K/block)])."""
    w = _f32(w)
    n, k = w.shape[-2:]
    scale_inv = np.max(np.abs(_blocks(w, block)), axis=(-3, -1)) / np.float32(E4M3_MAX)
    s = _expand_blocks(scale_inv, block, n, k)
    return encode_e4m3(np.divide(w, s, out=np.zeros_like(w), where=s != 0)), scale_inv


def dequantize_fp8_block(codes, scale_inv, block: int = FP8_BLOCK) -> np.ndarray:
    codes = np.asarray(codes)
    s = _expand_blocks(np.asarray(scale_inv, dtype=np.float64), block, *codes.shape[-2:])
    return decode_e4m3(codes).astype(np.float64) * s


def quantize_fp8_perchannel(w):
    """Per-row FP8: scale = max|w| / 448 (f32), byte = e4m3(w / scale).
    Returns (uint8 [..., N, K], scale float32 [..., N])."""
    w = _f32(w)
    s = np.max(np.abs(w), axis=-1, keepdims=True) / np.float32(E4M3_MAX)
    return encode_e4m3(np.divide(w, s, out=np.zeros_like(w), where=s != 0)), s[..., 0]


def dequantize_fp8_perchannel(codes, scale) -> np.ndarray:
    """scale may be [..., N] or [..., N, 1]."""
    codes = np.asarray(codes)
    s = np.asarray(scale, dtype=np.float64).reshape(*codes.shape[:-1], 1)
    return decode_e4m3(codes).astype(np.float64) * s


# -- GPTQ_INT4 (symmetric GPTQ, desc_act=false) -------------------------------------------------

def pack_gptq_int4(w, group_size: int = 128):
    """Symmetric GPTQ-Int4 as AutoGPTQ checkpoints store it: INT4's symmetric rule per group of
    `group_size` k (s = max|w| / 7, q = clamp(round(w / s), -8, 7)), laid out K-major.
    Returns (qweight int32 [..., K/8, N]: element k of column n in bits 4*(k%8) of word [k/8, n],
    stored q + 8; scales float32 [..., K/group_size, N])."""
    q, s, _ = quantize_int4(w, group_size)
    u = (np.swapaxes(q, -1, -2).astype(np.int64) + 8)                       # [..., K, N]
    u = u.reshape(*u.shape[:-2], u.shape[-2] // 8, 8, u.shape[-1])
    words = np.sum(u << (4 * np.arange(8))[:, None], axis=-2).astype(np.uint32)
    return words.view(np.int32), np.ascontiguousarray(np.swapaxes(s, -1, -2))


def dequantize_gptq_int4(qweight, scales) -> np.ndarray:
    """float64 [..., N, K] (kt's orientation) of GPTQ tensors."""
    words = np.asarray(qweight, dtype=np.int32).view(np.uint32)             # [..., K/8, N]
    nibbles = (words[..., None, :] >> (4 * np.arange(8, dtype=np.uint32))[:, None]) & 0xF
    q = nibbles.astype(np.int8).reshape(*words.shape[:-2], -1, words.shape[-1]) - 8   # [..., K, N]
    return dequantize_int4(np.swapaxes(q, -1, -2), np.swapaxes(np.asarray(scales), -1, -2))


# -- MXFP4 (OCP microscaling FP4) ---------------------------------------------------------------

MXFP4_BLOCK = 32
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def _ceil_exponent(amax, element_max):
    """The smallest E in [-127, 127] with amax <= element_max * 2^E (-127 for an all-zero block)."""
    mantissa, exponent = np.frexp(amax / element_max)       # = mantissa * 2^exponent, mantissa in [0.5, 1)
    e = np.where(mantissa == 0.5, exponent - 1, exponent)    # ceil(log2(amax / element_max)), exact
    return np.clip(np.where(amax == 0, -127, e), -127, 127)


def _e2m1_packed(a, negative, shape):
    """E2M1 codes nearest the magnitudes a (ties to the even code), sign from `negative`, two per
    byte: element 2j in the low nibble of byte j. Returns uint8 [*shape[:-1], K/2]."""
    magnitude = np.select([a <= 0.25, a < 0.75, a <= 1.25, a < 1.75, a <= 2.5, a < 3.5, a <= 5.0], range(7), 7)
    codes = (magnitude | (negative << 3)).astype(np.uint8).reshape(*shape[:-1], -1)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def _e2m1_values(blocks) -> np.ndarray:
    blocks = np.asarray(blocks, dtype=np.uint8)
    return E2M1_VALUES[np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], -1)]


def quantize_mxfp4(w):
    """MXFP4 as GPT-OSS's checkpoints store it. Per 32 consecutive k: the smallest exponent E
    with max|w| <= 6 * 2^E (E in [-127, 127]; an all-zero block gets -127), stored as the E8M0
    byte E + 127; each element becomes the E2M1 code nearest w / 2^E, ties to the even code.
    Returns (blocks uint8 [..., N, K/2], element 2j in the low nibble of byte j; scales uint8
    [..., N, K/32])."""
    g = _grouped(np.asarray(w, dtype=np.float64), MXFP4_BLOCK)
    e = _ceil_exponent(np.max(np.abs(g), axis=-1, keepdims=True), 6.0)
    blocks = _e2m1_packed(np.abs(g) / np.ldexp(1.0, e), np.signbit(g), np.shape(w))
    return blocks, (e[..., 0] + 127).astype(np.uint8)


def dequantize_mxfp4(blocks, scales) -> np.ndarray:
    scale = np.ldexp(1.0, np.asarray(scales, dtype=np.int64) - 127)
    return _e2m1_values(blocks) * np.repeat(scale, MXFP4_BLOCK, axis=-1)


# -- NVFP4 (ModelOpt FP4: E4M3 scales per 16 and a per-tensor global scale) ------------------------

NVFP4_BLOCK = 16


def quantize_nvfp4(w):
    """NVFP4 as ModelOpt checkpoints store it, per matrix [N, K] of the stack: global =
    max|w| / (6 * 448) (f32; weight_scale_2), per 16 consecutive k the E4M3 byte nearest
    max|block| / 6 / global (weight_scale), and each element the E2M1 code nearest
    w / (scale * global), ties to the even code (a zero scale gives zero codes).
    Returns (weight uint8 [..., N, K/2], element 2j in the low nibble of byte j; weight_scale
    uint8 [..., N, K/16]; weight_scale_2 float32 [..., 1, 1])."""
    w = np.asarray(w, dtype=np.float64)
    amax = np.max(np.abs(w), axis=(-2, -1), keepdims=True)
    glob = (amax / (6.0 * E4M3_MAX)).astype(np.float32)
    glob = np.where(glob == 0, np.float32(1), glob)
    g = _grouped(w, NVFP4_BLOCK)
    scale_codes = encode_e4m3(np.max(np.abs(g), axis=-1) / 6.0 / glob.astype(np.float64))
    step = decode_e4m3(scale_codes).astype(np.float64)[..., None] * glob.astype(np.float64)[..., None]
    a = np.divide(np.abs(g), step, out=np.zeros_like(g), where=step != 0)
    return _e2m1_packed(a, np.signbit(g), w.shape), scale_codes, glob


def dequantize_nvfp4(blocks, scales, global_scale) -> np.ndarray:
    scale = decode_e4m3(scales).astype(np.float64) * np.asarray(global_scale, dtype=np.float64)
    return _e2m1_values(blocks) * np.repeat(scale, NVFP4_BLOCK, axis=-1)


# -- MXFP8 (OCP microscaling FP8) ------------------------------------------------------------------

MXFP8_BLOCK = 32


def quantize_mxfp8(w):
    """MXFP8 as MiniMax-M3 ships it. Per 32 consecutive k: the smallest exponent E with
    max|w| <= 448 * 2^E (E in [-127, 127]; an all-zero block gets -127), stored as the E8M0
    byte E + 127 (weight_scale_inv), and each element the E4M3 byte of w / 2^E (round to
    nearest even). Returns (uint8 [..., N, K], scales uint8 [..., N, K/32])."""
    g = _grouped(np.asarray(w, dtype=np.float64), MXFP8_BLOCK)
    e = _ceil_exponent(np.max(np.abs(g), axis=-1, keepdims=True), E4M3_MAX)
    return encode_e4m3(g / np.ldexp(1.0, e)).reshape(np.shape(w)), (e[..., 0] + 127).astype(np.uint8)


def dequantize_mxfp8(codes, scales) -> np.ndarray:
    scale = np.ldexp(1.0, np.asarray(scales, dtype=np.int64) - 127)
    return decode_e4m3(codes).astype(np.float64) * np.repeat(scale, MXFP8_BLOCK, axis=-1)


# -- whole layers --------------------------------------------------------------------------------

CHECKPOINT_METHODS = ("RAWINT4", "FP8", "FP8_PERCHANNEL", "MXFP4", "GPTQ_INT4", "MXFP8", "NVFP4")


def checkpoint_arrays(method: str, gate, up, down, *, group_size: int = 0):
    """What `MoE.load` takes for `method`, made from float weights [E, N, K]: (gate, up,
    down, scales, zeros). Methods that quantize at load get the floats back and scales and
    zeros None; the checkpoint formats get their codes and a (gate, up, down) triple of scale
    stacks; NVFP4's zeros are its global scales (weight_scale_2, [E, 1, 1] each).
    group_size: GPTQ_INT4's (0 means 128)."""
    if method not in CHECKPOINT_METHODS:
        return gate, up, down, None, None
    quantize = {"RAWINT4": pack_rawint4, "FP8": quantize_fp8_block, "FP8_PERCHANNEL": quantize_fp8_perchannel,
                "MXFP4": quantize_mxfp4, "GPTQ_INT4": lambda m: pack_gptq_int4(m, group_size or 128),
                "MXFP8": quantize_mxfp8, "NVFP4": quantize_nvfp4}[method]
    parts = [quantize(m) for m in (gate, up, down)]
    if method == "FP8_PERCHANNEL":   # MoE.load takes 2-D scale matrices: [N, 1] per expert
        parts = [(q, s[..., None]) for q, s in parts]
    zeros = tuple(p[2] for p in parts) if method == "NVFP4" else None
    return parts[0][0], parts[1][0], parts[2][0], tuple(p[1] for p in parts), zeros


def checkpoint_inputs(method: str, gate, up, down, *, group_size: int = 0):
    """checkpoint_arrays without the zeros, for the methods that have none (every checkpoint
    format but NVFP4): (gate, up, down, scales)."""
    if method == "NVFP4":
        raise ValueError("NVFP4 also needs its global scales (MoE.load's zeros): use checkpoint_arrays")
    return checkpoint_arrays(method, gate, up, down, group_size=group_size)[:4]


def dequantized_weights(method: str, gate, up, down, *, group_size: int = 0, zero_point: bool = False):
    """The weights a backend computes with after loading float weights through
    checkpoint_inputs(method, ...) and packing them: (gate, up, down), float64 for the
    quantized methods."""
    weights = (gate, up, down)
    if method == "FP32":
        return weights
    if method == "BF16":
        return tuple(bf16_round(m) for m in weights)
    if method == "INT8":
        return tuple(dequantize_int8(*quantize_int8(m)) for m in weights)
    if method == "INT4":
        return tuple(dequantize_int4(*quantize_int4(m, group_size, zero_point)) for m in weights)
    if method == "RAWINT4":
        return tuple(dequantize_rawint4(*pack_rawint4(m)) for m in weights)
    if method == "FP8":
        return tuple(dequantize_fp8_block(*quantize_fp8_block(m)) for m in weights)
    if method == "FP8_PERCHANNEL":
        return tuple(dequantize_fp8_perchannel(*quantize_fp8_perchannel(m)) for m in weights)
    if method == "MXFP4":
        return tuple(dequantize_mxfp4(*quantize_mxfp4(m)) for m in weights)
    if method == "GPTQ_INT4":
        return tuple(dequantize_gptq_int4(*pack_gptq_int4(m, group_size or 128)) for m in weights)
    if method == "MXFP8":
        return tuple(dequantize_mxfp8(*quantize_mxfp8(m)) for m in weights)
    if method == "NVFP4":
        return tuple(dequantize_nvfp4(*quantize_nvfp4(m)) for m in weights)
    raise ValueError(f"no weight format {method!r}; docs/formats.md lists FP32, BF16, INT8, INT4, RAWINT4, FP8, "
                     "FP8_PERCHANNEL, MXFP4, MXFP8, NVFP4 and GPTQ_INT4")
