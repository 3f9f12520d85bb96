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
    # first activation plane), or Q8_0, one plane with an f16 scale per 32 k.
    llama_activations: str

    @property
    def kt_dtype(self) -> int:
        return KT_DTYPE_GGML_BASE + self.ggml_id

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of k elements (k a multiple of block_elems)."""
        return k // self.block_elems * self.block_bytes


GGML_TYPES = {t.name: t for t in (
    GgmlType("Q4_0", 2, 32, 18, "Q8_0"),
    GgmlType("Q8_0", 8, 32, 34, "Q8_0"),
    GgmlType("Q2_K", 10, 256, 84, "Q8_K"),
    GgmlType("Q3_K", 11, 256, 110, "Q8_K"),
    GgmlType("Q4_K", 12, 256, 144, "Q8_K"),
    GgmlType("Q5_K", 13, 256, 176, "Q8_K"),
    GgmlType("Q6_K", 14, 256, 210, "Q8_K"),
    GgmlType("IQ4_XS", 23, 256, 136, "Q8_K"),
)}


def ggml_type(name: str) -> GgmlType:
    """The GgmlType called `name` (case-insensitive); KeyError-free: a ValueError naming the known ones."""
    t = GGML_TYPES.get(str(name).upper())
    if t is None:
        raise ValueError(f"ggml type {name!r} is not one kt reads; known: {', '.join(GGML_TYPES)}")
    return t


# GGUF expert tensors of plain floats, and the kt method whose kernels run them. They need no
# block kernel: BF16's own packed layout holds them exactly, and its one-pass bf16 activations
# are what llama.cpp dots BF16 against (its vec_dot_type), so a LLAMAFILE layer of BF16 experts
# is a BF16 layer with llama.cpp's numerics by default. F16 and F32 are not read: kt has no
# kernel for them, and BF16 would round F16's mantissa.
FLOAT_TYPES = {"BF16": "BF16"}


def float_method(weight_types) -> str | None:
    """The kt method of a layer whose (gate, up, down) GGUF types are all one float type; None
    for block types. A layer mixing the two is refused by name (kt runs one kernel per layer)."""
    floats = [t for t in weight_types if t in FLOAT_TYPES]
    if not floats:
        return None
    if len(floats) != len(weight_types) or len(set(floats)) != 1:
        raise ValueError(f"gate, up, down are {', '.join(weight_types)}: kt runs a layer's GGUF experts either all as "
                         f"one float type ({', '.join(FLOAT_TYPES)}) or all as block types, not a mix")
    return FLOAT_TYPES[floats[0]]
