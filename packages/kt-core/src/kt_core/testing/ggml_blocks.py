"""ggml blocks for tests and the conformance suite, made with the `gguf` package (kt's GGUF
files for tests are written by kt.testing.gguf_files from these).

Blocks are real encodings: `gguf.quants.quantize` of random weights for the types it can
encode (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), random bytes with finite, moderate f16 scales for the others (gguf-py
has no K-quant encoder; every bit pattern of their codes is a valid block). The dequantized
weights come from `gguf.quants.dequantize`, the oracle the kernels are held to.
"""

from __future__ import annotations

import numpy as np

from ..formats.ggml import CODE_TYPES, FLOAT_TYPES, ggml_type
from .reference import bf16_round

# Byte offsets of each type's f16 scale fields within a block, and a magnitude that keeps
# weights around 0.1 (the largest sub-scale x code product differs per type; small ones are
# f16 subnormals, which the kernels must decode too).
_F16_FIELDS = {"Q4_0": (0,), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
               "Q6_K": (208,), "IQ4_XS": (0,), "IQ2_XXS": (0,), "IQ3_XXS": (0,), "IQ4_NL": (0,),
               "IQ1_S": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_S": (0,)}
_SCALE = {"Q2_K": 2e-3, "Q3_K": 5e-4, "Q4_K": 1e-4, "Q5_K": 5e-5, "Q6_K": 2.5e-5, "IQ4_XS": 2.5e-5, "IQ2_XXS": 1e-3,
          "IQ3_XXS": 2e-4, "IQ4_NL": 8e-4, "IQ1_S": 3e-3, "IQ1_M": 3e-3, "IQ2_XS": 1e-3,
          "IQ2_S": 1e-3, "IQ3_S": 2e-4}
_ENCODED = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")   # gguf-py quantizes these


def random_blocks(rng: np.random.Generator, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """uint8 [..., N, bytes per row] of ggml type `type_name` for float shape [..., N, K]."""
    import gguf

    if str(type_name).upper() == "BF16":   # the file's rows: round-to-nearest-even bf16 bits
        rounded = bf16_round(rng.standard_normal(shape, dtype=np.float32) * 0.05)
        return (rounded.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    if str(type_name).upper() in CODE_TYPES:   # MXFP4 (GPT-OSS's files): gguf's own quantizer
        return gguf.quants.quantize((rng.standard_normal(shape) * 0.05).astype(np.float32),
                                    gguf.GGMLQuantizationType[str(type_name).upper()])
    t = ggml_type(type_name)
    qtype = gguf.GGMLQuantizationType[t.name]
    if t.name in _ENCODED:
        return gguf.quants.quantize((rng.standard_normal(shape) * 0.05).astype(np.float32), qtype)
    *lead, n, k = shape
    blocks = rng.integers(0, 256, size=(*lead, n, k // t.block_elems, t.block_bytes), dtype=np.uint8)
    for at in _F16_FIELDS.get(t.name, ()):
        scales = (rng.uniform(0.25, 1.0, size=blocks.shape[:-1]) * _SCALE[t.name]).astype(np.float16)
        blocks[..., at:at + 2] = scales[..., None].view(np.uint8)
    if t.name == "IQ1_M":   # its f16 d in the top nibbles of the four words at byte 48 (nibble m: d's bits 4m..)
        d = (rng.uniform(0.25, 1.0, size=blocks.shape[:-1]) * _SCALE[t.name]).astype(np.float16).view(np.uint16)
        for m in range(4):
            blocks[..., 49 + 2 * m] = (blocks[..., 49 + 2 * m] & 0x0F) | (((d >> (4 * m)) & 0x0F) << 4).astype(np.uint8)
    return blocks.reshape(*lead, n, t.row_bytes(k))


def dequantize(blocks: np.ndarray, type_name: str) -> np.ndarray:
    import gguf

    if str(type_name).upper() in FLOAT_TYPES:
        return (np.ascontiguousarray(blocks).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    name = str(type_name).upper() if str(type_name).upper() in CODE_TYPES else ggml_type(type_name).name
    return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[name])


def q8k_activations(x: np.ndarray) -> np.ndarray:
    """What llama.cpp's Q8_K activation blocks carry of a float32 vector, as float64: per 256
    elements (the last group may be shorter, as kt's groups are), ggml's quantize_row_q8_K —
    the signed element of largest magnitude m, q = nearest(x * (-127 / m)) (ties to even, as
    its magic-number rounding does), value q / (-127 / m) — in float32 like ggml."""
    x = np.asarray(x, np.float32)
    out = np.zeros(x.shape, np.float64)
    for k0 in range(0, x.shape[-1], 256):
        g = x[..., k0:k0 + 256]
        m = np.take_along_axis(g, np.abs(g).argmax(-1)[..., None], -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            iscale = np.where(m != 0, np.float32(-127.0) / m, np.float32(0)).astype(np.float32)
            d = np.where(m != 0, np.float32(1.0) / iscale, np.float32(0)).astype(np.float32)
        q = np.minimum(np.rint(g * iscale), 127)
        out[..., k0:k0 + 256] = (q * d).astype(np.float32)
    return out


def q8_0_activations(x: np.ndarray) -> np.ndarray:
    """What llama.cpp's Q8_0 activation blocks carry of a float32 vector (the ones it dots Q4_0
    and Q8_0 against), as float64: per 32 elements, ggml's x86 quantize_row_q8_0 — a = max|x|,
    q = nearest(x * (127 / a)) (ties to even: its AVX rounding), the scale a / 127 stored as f16."""
    x = np.asarray(x, np.float32)
    g = x.reshape(*x.shape[:-1], -1, 32)
    a = np.abs(g).max(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(a != 0, np.float32(127.0) / a, np.float32(0)).astype(np.float32)
    d = (a / np.float32(127.0)).astype(np.float16).astype(np.float32)
    return (np.rint(g * inv) * d).astype(np.float32).astype(np.float64).reshape(x.shape)


def llama_activations(types) -> tuple:
    """(layer input, intermediate) activations of a one-pass LLAMAFILE layer with ggml types
    (gate, up, down), for testing.reference.moe_reference: gate and up must agree."""
    # BF16: llama.cpp's bf16 activations; Q8_1 carries Q8_0's values (ggml.GgmlType.llama_activations).
    pick = {"Q8_K": q8k_activations, "Q8_0": q8_0_activations, "Q8_1": q8_0_activations, "BF16": bf16_round}

    def blocks(t):
        return "BF16" if str(t).upper() in FLOAT_TYPES else ggml_type(t).llama_activations

    first, down = (pick[blocks(t)] for t in (types[0], types[2]))
    if pick[blocks(types[1])] is not first:
        raise ValueError(f"gate {types[0]} and up {types[1]} take different activation blocks: two inputs, not one")
    return first, down
