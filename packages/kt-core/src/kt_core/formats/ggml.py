"""The ggml block types kt knows (method LLAMAFILE), as plugin.h numbers them.

A kt_dtype for a ggml type is KT_DTYPE_GGML_BASE (0x100) plus ggml's own type number, so the
table below is the whole mapping. Which of them a backend variant can run is in its
descriptor (`Variant.ggml_types`), shown by `kt backends`.
"""

from __future__ import annotations

from dataclasses import dataclass

KT_DTYPE_GGML_BASE = 0x100


@dataclass(frozen=True)
class GgmlType:
    name: str
    ggml_id: int          # ggml's enum ggml_type
    block_elems: int      # elements per block along K
    block_bytes: int      # bytes per block
    # The activation blocks llama.cpp dots this type against (its vec_dot_type), which is what
    # kt's one-pass kernels carry for it: Q8_K, one int8 plane with one scale per 256 k (kt's
    # first activation plane), or Q8_0, one plane with an f16 scale per 32 k (Q8_1, for Q4_1 and
    # Q5_1, holds the same values plus an f16 of their scaled sum for the min term, which kt takes
    # exact: kt carries Q8_0's plane for it).
    llama_activations: str

    @property
    def kt_dtype(self) -> int:
        return KT_DTYPE_GGML_BASE + self.ggml_id

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of k elements (k a multiple of block_elems)."""
        return k // self.block_elems * self.block_bytes


GGML_TYPES = {t.name: t for t in (
    GgmlType("Q4_0", 2, 32, 18, "Q8_0"),
    GgmlType("Q4_1", 3, 32, 20, "Q8_1"),
    GgmlType("Q5_0", 6, 32, 22, "Q8_0"),
    GgmlType("Q5_1", 7, 32, 24, "Q8_1"),
    GgmlType("Q8_0", 8, 32, 34, "Q8_0"),
    GgmlType("Q2_K", 10, 256, 84, "Q8_K"),
    GgmlType("Q3_K", 11, 256, 110, "Q8_K"),
    GgmlType("Q4_K", 12, 256, 144, "Q8_K"),
    GgmlType("Q5_K", 13, 256, 176, "Q8_K"),
    GgmlType("Q6_K", 14, 256, 210, "Q8_K"),
    GgmlType("IQ4_NL", 20, 32, 18, "Q8_0"),
    GgmlType("IQ4_XS", 23, 256, 136, "Q8_K"),
    GgmlType("IQ1_S", 19, 256, 50, "Q8_K"),
    GgmlType("IQ1_M", 29, 256, 56, "Q8_K"),
    GgmlType("IQ2_XXS", 16, 256, 66, "Q8_K"),
    GgmlType("IQ2_XS", 17, 256, 74, "Q8_K"),
    GgmlType("IQ2_S", 22, 256, 82, "Q8_K"),
    GgmlType("IQ3_XXS", 18, 256, 98, "Q8_K"),
    GgmlType("IQ3_S", 21, 256, 110, "Q8_K"),
)}


def ggml_type(name: str) -> GgmlType:
    """The GgmlType called `name` (case-insensitive); KeyError-free: a ValueError naming the known ones."""
    t = GGML_TYPES.get(str(name).upper())
    if t is None:
        raise ValueError(f"ggml type {name!r} is not one kt reads; known: {', '.join(GGML_TYPES)}")
    return t


# GGUF expert types a kt method holds as stored, and that method; they need no LLAMAFILE block
# kernel. Plain floats: BF16's own packed layout holds them exactly, and its one-pass bf16
# activations are what llama.cpp dots BF16 against (its vec_dot_type), so a LLAMAFILE layer of BF16
# experts is a BF16 layer with llama.cpp's numerics by default. F16 and F32 are not read: kt has no
# kernel for them, and BF16 would round F16's mantissa. Codes: ggml's MXFP4 blocks (GPT-OSS's GGUF
# files) are the OCP format GPT-OSS's checkpoints store, an E8M0 byte per 32 and E2M1 codes, only
# in another nibble order (mxfp4_codes): the MXFP4 method's layout holds them exactly.
FLOAT_TYPES = {"BF16": "BF16"}
CODE_TYPES = {"MXFP4": "MXFP4"}
STORED_TYPES = {**FLOAT_TYPES, **CODE_TYPES}


def stored_method(weight_types) -> str | None:
    """The kt method of a layer whose (gate, up, down) GGUF types are all one type a kt method
    holds as stored (STORED_TYPES); None for LLAMAFILE's block types. A layer mixing the two is
    refused by name (kt runs one kernel per layer)."""
    stored = [t for t in weight_types if t in STORED_TYPES]
    if not stored:
        return None
    if len(stored) != len(weight_types) or len(set(stored)) != 1:
        raise ValueError(f"gate, up, down are {', '.join(weight_types)}: kt runs a layer's GGUF experts either all as "
                         f"one type its methods hold as stored ({', '.join(STORED_TYPES)}) or all as block types, "
                         "not a mix")
    return STORED_TYPES[stored[0]]


MXFP4_BLOCK_BYTES = 17   # ggml's block_mxfp4: the E8M0 byte, then 16 bytes of codes for 32 elements


def mxfp4_codes(rows) -> tuple:
    """ggml MXFP4 rows (uint8 [N, K/32 * 17]: per 32 elements the E8M0 byte e, then byte j holding
    element j in its low nibble and element j + 16 in its high one) as the MXFP4 method takes them,
    GPT-OSS's order: (codes uint8 [N, K/2], element 2j in the low nibble of byte j; scales uint8
    [N, K/32]). The same codes and scales (ggml's doubled E2M1 table times half of 2^(e - 127) is
    E2M1 times 2^(e - 127)): a reordering, exact."""
    import numpy as np

    rows = np.asarray(rows)
    if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] % MXFP4_BLOCK_BYTES:
        raise ValueError(f"ggml MXFP4 rows must be uint8 [N, K/32 * 17], got {rows.dtype} {list(rows.shape)}")
    n, blocks = rows.shape[0], rows.shape[1] // MXFP4_BLOCK_BYTES
    b = rows.reshape(n, blocks, MXFP4_BLOCK_BYTES)
    qs = b[:, :, 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)        # [N, blocks, 32] in element order
    packed = codes[:, :, 0::2] | (codes[:, :, 1::2] << 4)
    return np.ascontiguousarray(packed.reshape(n, blocks * 16)), np.ascontiguousarray(b[:, :, 0])
