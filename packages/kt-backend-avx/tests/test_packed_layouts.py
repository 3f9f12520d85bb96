"""kt-core's public layout header (kt/formats/packed_layouts.h) describes the bytes kt-backend-avx
packs: a reader compiled against that header alone — as a BLIS, KML or third-party backend would
read avx's packed experts without a second copy — recovers, from `packed_expert`, exactly the
weights the kernels compute with, on every variant this host runs and every layout."""

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

import kt_core
from kt_core.formats.ggml import ggml_type
from kt_core.testing import quantize
from kt_core.testing.ggml_blocks import dequantize, random_blocks
from kt_core.testing.reference import random_moe

READER = Path(__file__).parent / "layout_reader" / "layout_reader.cpp"


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    lib = tmp_path_factory.mktemp("layout_reader") / "liblayout_reader.so"
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{kt_core.get_include()}",
                    str(READER), "-o", str(lib)], check=True)
    fn = ctypes.CDLL(str(lib)).kt_unpack_expert
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                   *[np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")] * 3]
    fn.ggml = ctypes.CDLL(str(lib)).kt_unpack_ggml_expert
    fn.ggml.restype = ctypes.c_size_t
    fn.ggml.argtypes = [np.ctypeslib.ndpointer(np.int32), ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64,
                        *[np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")] * 3]
    return fn


# (method, group size, zero points, hidden, intermediate): K not a multiple of 4 or even 2 where the
# layout pads (BF16, INT8, FP8), every INT4 header kind.
CASES = [("BF16", 0, False, 202, 99), ("BF16", 0, False, 256, 128), ("INT8", 0, False, 202, 130),
         ("INT4", 32, False, 256, 160), ("INT4", 64, True, 256, 128), ("INT4", 128, False, 256, 128),
         ("RAWINT4", 0, False, 256, 160), ("FP8", 0, False, 202, 130), ("FP8_PERCHANNEL", 0, False, 256, 144),
         ("MXFP4", 0, False, 256, 160), ("MXFP8", 0, False, 256, 160), ("NVFP4", 0, False, 256, 144)]


CASE_IDS = [f"{m}-g{g}-z{int(z)}-{h}x{i}" for m, g, z, h, i in CASES]


@pytest.mark.parametrize("method,group,zero_point,hidden,intermediate", CASES, ids=CASE_IDS)
def test_public_header_reads_avx_packed_experts(reader, variant, method, group, zero_point, hidden, intermediate):
    rng = np.random.default_rng(hidden + intermediate + group)
    E = 2
    w = random_moe(rng, E, hidden, intermediate)
    gate, up, down, scales, zeros = quantize.checkpoint_arrays(method, *w)
    layer = kt_core.MoE(num_experts=E, top_k=1, hidden_size=hidden, intermediate_size=intermediate, method=method,
                        group_size=group, zero_point=zero_point)
    assert layer.backend == f"avx/{variant}"
    layer.load(gate, up, down, scales=scales, zeros=zeros)
    stored = quantize.dequantized_weights(method, *w, group_size=group, zero_point=zero_point)
    for e in range(E):
        packed = layer.packed_expert(e)
        got = [np.zeros((intermediate, hidden), np.float32), np.zeros((intermediate, hidden), np.float32),
               np.zeros((hidden, intermediate), np.float32)]
        n = reader(layer.layout_id.encode(), packed, hidden, intermediate, group or 128, int(zero_point), *got)
        assert n == len(packed) == layer.expert_bytes, f"{layer.layout_id}: header says {n} bytes, avx packed {len(packed)}"
        for name, g, want in zip(("gate", "up", "down"), got, stored):
            want = np.asarray(want[e], np.float64)
            # The reader applies the header's f32 arithmetic (INT4 zero points: s*u - s*z); the
            # oracle computes in float64: they agree to f32 rounding of the largest weight.
            err = np.max(np.abs(g - want)) / np.max(np.abs(want))
            assert err <= 1e-6, f"{layer.layout_id} {name} of expert {e}: max error {err:.1e} of max |w|"


def test_unknown_layout_is_not_read(reader):
    z = np.zeros((16, 16), np.float32)
    assert reader(b"kt-ggml-v4", b"\0" * 64, 16, 16, 128, 0, z, z, z) == 0


# LLAMAFILE: every ggml type, and one type per matrix as a GGUF file mixes them (Q4_K_M's Q6_K down).
GGML_CASES = [(t, t, t) for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
                                   "IQ4_XS", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")]
GGML_CASES += [("Q4_K", "Q5_K", "Q6_K"), ("Q4_K", "Q4_K", "Q5_0")]   # the latter: llama-quantize's fallback for K % 256


@pytest.mark.parametrize("types", GGML_CASES, ids=["-".join(t) for t in GGML_CASES])
def test_public_header_reads_avx_packed_ggml_experts(reader, variant, types):
    """kt/formats/ggml_panels.h's reader recovers, from avx's kt-ggml-v8 bytes, the weights gguf-py's
    dequantizer gives for the file's blocks."""
    rng = np.random.default_rng(len(set(types)))
    E, hidden, intermediate = 2, 512, 288 if ggml_type(types[2]).block_elems == 32 else 256   # K a multiple of the block
    shapes = ((E, intermediate, hidden), (E, intermediate, hidden), (E, hidden, intermediate))
    blocks = [random_blocks(rng, t, s) for t, s in zip(types, shapes)]
    layer = kt_core.MoE(num_experts=E, top_k=1, hidden_size=hidden, intermediate_size=intermediate, method="LLAMAFILE",
                        weight_types=types)
    assert layer.backend == f"avx/{variant}" and layer.layout_id == "kt-ggml-v8"
    layer.load(*blocks)
    codes = np.array([ggml_type(t).kt_dtype for t in types], np.int32)
    # Decode reads every packed byte: the file's bytes + 3 % at most (Q4_K's 4.625 bits against 4.5,
    # +2.8 %; Q2_K and the 32-element types exactly the file's), but for Q3_K's int8 scales (3.56 bits against
    # 3.44, +3.6 %): its 6-bit scales kept as the file has them decoded 5-45 % slower (the unpacking,
    # wherever it went, put a memory wait at each block's start; docs/performance.md).
    file_bytes = sum(b[0].nbytes for b in blocks)
    bound = 1.037 if "Q3_K" in types else 1.03
    exact = ("Q2_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")   # the file's bytes, no more
    if all(t in exact or ggml_type(t).block_elems == 32 for t in types):
        assert layer.expert_bytes == file_bytes
    assert file_bytes <= layer.expert_bytes <= bound * file_bytes, \
        f"{types}: {layer.expert_bytes} packed bytes per expert against the file's {file_bytes}"
    for e in range(E):
        packed = layer.packed_expert(e)
        got = [np.zeros(s[1:], np.float32) for s in shapes]
        n = reader.ggml(codes, packed, hidden, intermediate, *got)
        assert n == len(packed) == layer.expert_bytes, f"header says {n} bytes, avx packed {len(packed)}"
        for name, g, b, t in zip(("gate", "up", "down"), got, blocks, types):
            want = dequantize(b[e], t).astype(np.float64)
            # The reader's f32 products (d * sc * u - dmin * m) against gguf-py's: f32 rounding.
            err = np.max(np.abs(g - want)) / np.max(np.abs(want))
            assert err <= 1e-6, f"{t} {name} of expert {e}: max error {err:.1e} of max |w|"
