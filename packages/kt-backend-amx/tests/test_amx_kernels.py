"""The AMX kernels on every format they serve, against kt-backend-avx on the same packed bytes
(integer formats: bit-identical outputs — both sum the same integers exactly and finish in the
same order; BF16: f32 sums in another order) and against float64 over the weights the packed
codes stand for. Row counts cover full and partial 16-row tiles and several row blocks."""

import os

import numpy as np
import pytest

from kt_core import MoE
from kt_core.backends import selection
from kt_core.testing.quantize import checkpoint_inputs, dequantized_weights
from kt_core.testing.reference import moe_reference, random_moe, random_routing, relative_error

E, H, I, K = 8, 256, 128, 4

CASES = [
    ("BF16", {}, 1e-4),
    ("BF16", {"fast_activations": True}, 3e-2),   # bf16 activations: kt-kernel's and torch's level
    ("INT8", {}, 2e-3),
    ("INT8", {"fast_activations": True}, 0.15),   # one int8 activation pass: kt-kernel's error level
    ("INT4", {"group_size": 32}, 2e-3),
    ("INT4", {"group_size": 64, "zero_point": True}, 2e-3),
    ("INT4", {"group_size": 128}, 2e-3),
    ("INT4", {"group_size": 128, "fast_activations": True}, 0.15),
]


def _layer(method, backend, w, **kw):
    m = MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method, backend=backend, max_tokens=512,
            **kw)
    m.load(*w)
    return m


@pytest.mark.parametrize("method,kw,tol", CASES, ids=[f"{m}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for m, kw, _ in CASES])
def test_matches_avx_and_reference(amx, native, method, kw, tol):
    rng = np.random.default_rng(1)
    w = random_moe(rng, E, H, I)
    tokens = 70          # ~35 rows per expert: two full 16-row tiles and a partial one
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids, wt = random_routing(rng, tokens, E, K)
    ids[:3, :] = [0, 1, 2, 3]  # expert 0..3 get a few extra rows; expert 7 may get few
    tiles = _layer(method, "amx", w, **kw)
    assert "tdp" in tiles.kernel_id_for(tokens), tiles.kernel_id_for(tokens)
    before = native.emulated_dot_instructions() if hasattr(native, "emulated_dot_instructions") else None
    got = np.asarray(tiles(x, ids, wt))
    if before is not None:
        assert native.emulated_dot_instructions() > before, "the tile path did not run"
    simd = np.asarray(_layer(method, "avx", w, **kw)(x, ids, wt))
    if method == "BF16":
        assert relative_error(got, simd) < 1e-4   # f32 sums in another order (and DAZ/FTZ)
    else:
        np.testing.assert_array_equal(got, simd)
    err = relative_error(got, moe_reference(x, *dequantized_weights(method, *w, group_size=kw.get("group_size", 0),
                                                          zero_point=kw.get("zero_point", False)), ids, wt))
    assert err < tol, f"{method} {kw}: {err:.2e} vs float64 over the stored weights"
    if kw.get("fast_activations"):   # the coarser activations really were taken
        assert err > 1e-3, f"{method} {kw}: {err:.2e} is the default's precision"


@pytest.mark.parametrize("rows", [1, 5, 15, 16, 17, 33])
def test_every_tile_height(amx, rows):
    """One expert, `rows` rows: partial tiles of each height and block counts, INT8 and BF16."""
    rng = np.random.default_rng(rows)
    w = random_moe(rng, E, H, I)
    x = rng.standard_normal((rows, H)).astype(np.float32)
    ids = np.full((rows, K), -1, dtype=np.int64)
    ids[:, 0] = 3
    wt = np.ones((rows, K), dtype=np.float32)
    for method in ("INT8", "BF16"):
        got = np.asarray(_layer(method, "amx", w)(x, ids, wt))
        ref = np.asarray(_layer(method, "avx", w)(x, ids, wt))
        assert relative_error(got, ref) < 1e-4, (method, rows)


@pytest.mark.parametrize("method,fast,tol", [("RAWINT4", False, 2e-3), ("GPTQ_INT4", False, 2e-3), ("MXFP4", False, 2e-3),
                                             ("FP8", False, 1e-4), ("FP8_PERCHANNEL", False, 1e-4), ("FP8", True, 3e-2)])
def test_checkpoint_formats(amx, native, method, fast, tol):
    """Formats loaded as checkpoints ship them: codes + scales, packed without conversion.
    FP8 with fast_activations: bf16 activations on both backends."""
    rng = np.random.default_rng(3)
    w = random_moe(rng, E, H, I)
    gate, up, down, scales = checkpoint_inputs(method, *w)
    x = rng.standard_normal((48, H)).astype(np.float32)
    ids, wt = random_routing(rng, 48, E, K)
    outs = []
    for backend in ("amx", "avx"):
        m = MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method, backend=backend,
                fast_activations=fast)
        m.load(gate, up, down, scales=scales)
        before = native.emulated_dot_instructions() if hasattr(native, "emulated_dot_instructions") else None
        outs.append(np.asarray(m(x, ids, wt)))
        if before is not None and backend == "amx":
            assert native.emulated_dot_instructions() > before, "the tile path did not run"
    if method in ("RAWINT4", "GPTQ_INT4", "MXFP4"):   # the same integers summed exactly, finished alike
        np.testing.assert_array_equal(outs[0], outs[1])
    else:   # f32 sums of exact bf16 products, in another order than AVX's
        assert relative_error(outs[0], outs[1]) < 1e-4
    err = relative_error(outs[0], moe_reference(x, *dequantized_weights(method, *w), ids, wt))
    assert err < tol, f"{method}: {err:.2e} vs float64 over the stored weights"
    if method.startswith("FP8"):   # exact to ~1e-6 by default; bf16 activations only when asked
        assert (err > 1e-3) == fast, f"{method} fast_activations={fast}: {err:.2e}"


def test_decode_goes_to_avx_on_the_same_packed_weights(amx, monkeypatch):
    """With the default crossover, a decode batch runs on kt-backend-avx's kernels over the
    AMX layer's own packed bytes, and a prefill batch on the tiles; both agree with AVX."""
    monkeypatch.setenv("KT_AMX_MIN_ROWS", "4")
    selection.reset()
    rng = np.random.default_rng(4)
    w = random_moe(rng, E, H, I)
    m = _layer("INT8", None, w)
    assert m.backend.startswith("amx/"), m.backend
    assert m.small_batch_backend is not None and m.small_batch_backend.startswith("avx/")
    assert "tdp" not in m.kernel_id_for(1) and "tdp" in m.kernel_id_for(64)
    ref = _layer("INT8", "avx", w)
    for tokens in (1, 64):
        x = rng.standard_normal((tokens, H)).astype(np.float32)
        ids, wt = random_routing(rng, tokens, E, K)
        np.testing.assert_array_equal(np.asarray(m(x, ids, wt)), np.asarray(ref(x, ids, wt)))


@pytest.mark.parametrize("method,rows", [("BF16", 2), ("INT8", 3), ("FP8", 3), ("INT4", 6), ("RAWINT4", 8), ("MXFP4", 8)])
def test_each_method_hands_off_at_its_measured_crossover(amx, monkeypatch, method, rows):
    """Without KT_AMX_MIN_ROWS each method keeps its own crossover (rows per expert, measured on
    AMX silicon: docs/performance.md): a layer averaging fewer goes to avx as a whole."""
    monkeypatch.delenv("KT_AMX_MIN_ROWS")
    selection.reset()
    m = MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method)
    assert m.backend.startswith("amx/") and m.small_batch_backend.startswith("avx/"), (m.backend, m.small_batch_backend)
    first = rows * E // K     # the fewest tokens whose experts average `rows` rows
    assert "tdp" in m.kernel_id_for(first) and "tdp" not in m.kernel_id_for(first - 1), method


def test_shapes_the_tiles_cannot_step_run_on_avx512(amx, native):
    """INT8 tiles step 64 k: with hidden 96 every expert takes the wrapped AVX-512 kernels."""
    rng = np.random.default_rng(5)
    w = random_moe(rng, E, 96, 80)
    x = rng.standard_normal((40, 96)).astype(np.float32)
    ids, wt = random_routing(rng, 40, E, K)
    layers = [MoE(num_experts=E, top_k=K, hidden_size=96, intermediate_size=80, method="INT8", backend=b)
              for b in ("amx", "avx")]
    for m in layers:
        m.load(*w)
    before = native.emulated_dot_instructions() if hasattr(native, "emulated_dot_instructions") else None
    got = np.asarray(layers[0](x, ids, wt))
    if before is not None:
        assert native.emulated_dot_instructions() == before
    np.testing.assert_array_equal(got, np.asarray(layers[1](x, ids, wt)))


def test_emulation_build_is_refused_without_the_runtime_switch(amx, monkeypatch):
    from kt_backend_amx import _build
    if not _build.EMULATED:
        pytest.skip("hardware build")
    monkeypatch.delenv("KT_AMX_EMULATE")
    selection.reset()
    row = next(r for r in selection.selector().explain() if r["backend"] == "amx")
    assert not row["runnable"] and "software tile emulation build" in row["reason"], row
    assert os.environ.get("KT_AMX_EMULATE") is None


TRAINING_CASES = [("BF16", {}), ("BF16", {"fast_activations": True}), ("INT8", {}), ("INT4", {"group_size": 32}),
                  ("INT4", {"group_size": 64, "zero_point": True}), ("RAWINT4", {}), ("MXFP4", {}), ("FP8", {}),
                  ("FP8_PERCHANNEL", {})]


@pytest.mark.parametrize("method,kw", TRAINING_CASES,
                         ids=[f"{m}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for m, kw in TRAINING_CASES])
def test_training_products_run_on_the_tiles(amx, native, method, kw):
    """Training's grouped products (kt_core.MoE.grouped_*) on a trainable layer: the raw gate/up
    tile (ABI 1.4) is the forward's tiles without the activation, so it matches avx's as the forward
    does (integer formats bit for bit, BF16 and FP8 to float rounding); the transposed tiles (ABI 1.5) take split-bf16 gradients
    and weights, within 4e-5 of avx's f32 products (bf16 gradients alone with fast_activations,
    as avx's vdpbf16ps path: 1e-2). Experts of 1 to 37 rows: tile heights and the handover to avx
    below the tiles' crossover."""
    rng = np.random.default_rng(6)
    w = random_moe(rng, E, H, I)
    if method in ("RAWINT4", "MXFP4", "FP8", "FP8_PERCHANNEL"):   # checkpoint formats: codes and scales
        gate, up, down, scales = checkpoint_inputs(method, *w)
        load = {"scales": scales}
        w = (gate, up, down)
    else:
        load = {}
    layers = {}
    for backend in ("amx", "avx"):
        m = MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method, backend=backend,
                trainable=True, **kw)
        m.load(*w, **load)
        layers[backend] = m
    counts = np.array([1, 0, 16, 37, 5, 17, 0, 33], dtype=np.int64)
    rows = int(counts.sum())
    x = rng.standard_normal((rows, H)).astype(np.float32)
    dgate_up = rng.standard_normal((rows, 2 * I)).astype(np.float32)
    dy = rng.standard_normal((rows, H)).astype(np.float32)
    outs = {}
    for backend, m in layers.items():
        before = native.emulated_dot_instructions() if hasattr(native, "emulated_dot_instructions") else None
        outs[backend] = {"gate_up": m.grouped_gate_up(x, counts), "gate_up^T": m.grouped_gate_up_transposed(dgate_up, counts),
                         "down^T": m.grouped_down_transposed(dy, counts)}
        if before is not None and backend == "amx":
            assert native.emulated_dot_instructions() > before, "the tile path did not run"
    if method in ("BF16", "FP8", "FP8_PERCHANNEL"):   # float sums in another order
        assert relative_error(outs["amx"]["gate_up"], outs["avx"]["gate_up"]) < 1e-5
    else:
        np.testing.assert_array_equal(outs["amx"]["gate_up"], outs["avx"]["gate_up"])
    tol = 1e-2 if kw.get("fast_activations") else 4e-5
    for name in ("gate_up^T", "down^T"):
        err = relative_error(outs["amx"][name], outs["avx"][name])
        assert err < tol, f"{method} {kw} {name}: {err:.2e} vs avx"
