"""kt-backend-avx's descriptor: pure data; the native module is imported only when selected."""

from pathlib import Path

from kt_core.backends import BackendDescriptor, Tier, Variant

_V3 = frozenset({"avx2", "fma", "f16c"})
_V4 = _V3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
_V4_VNNI_BF16 = _V4 | {"avx512_vnni", "avx512_bf16", "avx512_vbmi"}
_METHODS = ("BF16", "INT8", "INT4", "RAWINT4", "FP8", "FP8_PERCHANNEL", "LLAMAFILE")
# ggml block types the LLAMAFILE kernels read (native/kernels/ggml.cpp), the same on every target.
_GGML = ("Q4_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
_MODULE = "kt_backend_avx._native"

descriptor = BackendDescriptor(
    name="avx",
    abi_version=(1, 1),
    tier=Tier.GENERIC_SIMD,
    arch=("x86_64",),
    description="x86 expert kernels: AVX2, AVX-512, AVX-512 with VNNI/BF16",
    variants=(
        Variant("x86-64-v3", module=_MODULE, requires=_V3, methods=_METHODS, rank=1, ggml_types=_GGML),
        Variant("x86-64-v4", module=_MODULE, requires=_V4, methods=_METHODS, rank=2, ggml_types=_GGML),
        Variant("x86-64-v4-vnni-bf16", module=_MODULE, requires=_V4_VNNI_BF16, methods=_METHODS, rank=3, ggml_types=_GGML),
    ),
)


def kernel_sources_dir() -> str:
    """The installed x86 method kernels' sources (packers, activation quantizers, tiles), for a
    backend that compiles them into its own target (kt-backend-amx's CMake asks for this)."""
    return str(Path(__file__).parent / "kernels")
