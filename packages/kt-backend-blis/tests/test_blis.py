"""kt-backend-blis: its kernels against kt-backend-avx on the same packed bytes and against the
reference backend, the hand-off of small batches to avx, the measured crossover and how the
backend declines when it is not calibrated or BLIS is missing."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kt_backend_blis
from kt_backend_blis import _build, calibrate, crossover
from kt_core import MoE, host
from kt_core.backends import explain, selection
from kt_core.formats.codes import int4_group_for
from kt_core.testing.quantize import checkpoint_inputs
from kt_core.testing.reference import random_moe, random_routing, relative_error

E, H, I, TOP_K = 8, 256, 192, 2
RUNNABLE = [t["name"] for t in kt_backend_blis.TARGETS if not host().missing(t["features"])]
SKIPPED = {t["name"]: host().missing(t["features"]) for t in kt_backend_blis.TARGETS if host().missing(t["features"])}


def row(name="blis", variant=None):
    return next(r for r in explain() if r["backend"] == name and (variant is None or r["variant"] == variant))


def layers(method, variant, monkeypatch, tokens=64, backends=("blis", "avx", "reference"), seed=0):
    monkeypatch.setenv("KT_CPU_VARIANT", variant)
    selection.reset()
    rng = np.random.default_rng(seed)
    group = int4_group_for(H, I) if method in ("INT4", "GPTQ_INT4") else 0
    gate, up, down, scales = checkpoint_inputs(method, *random_moe(rng, E, H, I), group_size=group)
    out = {}
    for b in backends:
        m = MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method=method, backend=b,
                group_size=group, max_tokens=tokens)
        m.load(gate, up, down, scales=scales)
        out[b] = m
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids, w = random_routing(rng, tokens, E, TOP_K)
    return out, (x, ids, w)


def test_variants_this_host_lacks_are_named():
    for name, missing in SKIPPED.items():
        assert missing, name   # skipped variants name what they lack (test ids below skip them)
    assert RUNNABLE or SKIPPED


@pytest.mark.parametrize("variant", [t["name"] for t in kt_backend_blis.TARGETS])
@pytest.mark.parametrize("method", kt_backend_blis.METHODS)
def test_each_method_matches_avx_on_the_same_packed_bytes(method, variant, monkeypatch):
    if variant in SKIPPED:
        pytest.skip(f"blis/{variant} needs {', '.join(SKIPPED[variant])}, which this host lacks")
    monkeypatch.setenv("KT_BLIS_MIN_ROWS", "0")   # BLIS takes every batch
    m, (x, ids, w) = layers(method, variant, monkeypatch)
    blis, avx, ref = m["blis"], m["avx"], m["reference"]
    assert blis.backend == f"blis/{variant}" and blis.packer_backend == f"avx/{variant}"
    assert blis.kernel_id_for(64).startswith("moe.") and ".sgemm.blis." in blis.kernel_id_for(64)
    assert bytes(blis.packed_expert(0)) == bytes(avx.packed_expert(0)), "one layout: avx's bytes"
    want = ref(x, ids, w)
    e_blis, e_avx = relative_error(blis(x, ids, w), want), relative_error(avx(x, ids, w), want)
    # f32 activations and an f32 GEMM on the same weights: at least as accurate as avx's kernels
    # (two-pass int8 or split-bf16 activations), within float rounding of the reference.
    assert e_blis <= 2e-5, (method, e_blis)
    assert e_blis <= e_avx + 2e-6, (method, e_blis, e_avx)
    if method == "BF16":
        assert relative_error(blis(x, ids, w), avx(x, ids, w)) <= 1e-4


@pytest.mark.skipif(not RUNNABLE, reason="no kt-backend-blis variant runs on this host")
def test_clamped_swiglu_matches_the_reference(monkeypatch):
    monkeypatch.setenv("KT_BLIS_MIN_ROWS", "0")
    monkeypatch.setenv("KT_CPU_VARIANT", RUNNABLE[0])
    selection.reset()
    rng = np.random.default_rng(3)
    g, u, d = random_moe(rng, E, H, I)
    x = rng.standard_normal((32, H)).astype(np.float32) * 4
    ids, w = random_routing(rng, 32, E, TOP_K)
    outs = []
    for b in ("blis", "reference"):
        m = MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method="BF16", backend=b,
                swiglu_limit=7.0, swiglu_alpha=1.702)
        m.load(g, u, d)
        outs.append(m(x, ids, w))
    assert relative_error(*outs) <= 2e-5


@pytest.mark.skipif(not RUNNABLE, reason="no kt-backend-blis variant runs on this host")
def test_small_batches_go_to_avx_and_long_ones_to_blis(monkeypatch):
    monkeypatch.setenv("KT_BLIS_MIN_ROWS", "BF16=16")   # BF16 from 16 rows per expert: 64 tokens at E=8, top-2
    m, (x, ids, w) = layers("BF16", RUNNABLE[-1], monkeypatch, tokens=256, backends=("blis", "reference"))
    blis, ref = m["blis"], m["reference"]
    assert blis.small_batch_backend == blis.packer_backend == f"avx/{RUNNABLE[-1]}"
    assert ".sgemm.blis." in blis.kernel_id_for(64) and ".sgemm." not in blis.kernel_id_for(63)
    assert ".sgemm." not in blis.kernel_id_for(1)
    for t in (1, 63, 64, 256):
        assert relative_error(blis(x[:t], ids[:t], w[:t]), ref(x[:t], ids[:t], w[:t])) <= 2e-3, t


@pytest.mark.skipif(not RUNNABLE, reason="no kt-backend-blis variant runs on this host")
def test_default_selection_follows_the_calibration(monkeypatch):
    crossover.save({**dict.fromkeys(crossover.METHODS), "INT8": 32}, [], {"test": True})
    selection.reset()
    assert row()["runnable"]
    for method, want in (("INT8", "blis/"), ("BF16", "avx/")):
        m = MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method=method, max_tokens=1024)
        assert m.backend.startswith(want), (method, m.backend)
    short = MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method="INT8", max_tokens=64)
    assert short.backend.startswith("avx/")    # a layer that never reaches 32 rows per expert: avx outright


def test_without_a_calibration_blis_is_unused_and_says_how_to_calibrate():
    r = row()
    assert not r["runnable"]
    assert r["reason"].startswith("needs a crossover measured on this host (no calibration at")
    assert "python -m kt_backend_blis.calibrate" in r["reason"]


@pytest.mark.parametrize("field,value", [("cpu", "some other CPU"), ("avx_build", "0123456789abcdef")])
def test_a_calibration_from_another_host_or_avx_build_is_ignored(monkeypatch, field, value):
    """Another CPU, or the same host after kt-backend-avx changed (its prefill may have become faster
    than BLIS where it was slower): the crossover must be measured again."""
    p = crossover.save(dict.fromkeys(crossover.METHODS, 8), [], {})
    data = json.loads(p.read_text())
    assert data["host"]["avx_build"] != "not installed"
    data["host"][field] = value
    p.write_text(json.dumps(data))
    selection.reset()
    assert "was measured on another host, BLIS or kt-backend-avx build" in row()["reason"]


def test_a_calibration_where_blis_never_won_keeps_avx(monkeypatch):
    crossover.save(dict.fromkeys(crossover.METHODS), [], {})
    selection.reset()
    assert row()["reason"].startswith("needs a method where BLIS beats kt-backend-avx here: calibrated")


@pytest.mark.parametrize("value,message", [("-3", "should be an integer >= 0 or 'never', found '-3'"),
                                           ("BF16=x", "BF16 should be an integer >= 0 or 'never', found 'x'"),
                                           ("FP4=8", "unknown method 'FP4'")])
def test_bad_overrides_are_named(monkeypatch, value, message):
    monkeypatch.setenv("KT_BLIS_MIN_ROWS", value)
    selection.reset()
    assert row()["reason"].startswith("needs a valid KT_BLIS_MIN_ROWS") and message in row()["reason"]


def test_a_missing_blis_library_declines_with_the_reason(monkeypatch):
    monkeypatch.setenv("KT_BLIS_MIN_ROWS", "0")
    monkeypatch.setattr(_build, "BLIS_SONAME", "libblis-not-installed.so.99")
    selection.reset()
    r = row()
    assert not r["runnable"] and "needs the BLIS shared library libblis-not-installed.so.99, which does not load" in r["reason"]
    assert _build.BLIS_LIBRARY in r["reason"]


def test_crossover_is_the_first_count_from_which_blis_stays_faster():
    rows = [{"method": "BF16", "rows": n, "speedup": s} for n, s in ((16, 0.5), (64, 1.2), (128, 0.99), (256, 1.3),
                                                                     (512, 1.6))]
    rows += [{"method": "INT8", "rows": n, "speedup": 0.8} for n in (16, 512)]
    assert calibrate.crossover(rows, 0.05) == {"BF16": 256, "INT8": None}


@pytest.mark.skipif(not RUNNABLE, reason="no kt-backend-blis variant runs on this host")
def test_calibration_measures_and_writes_this_hosts_table(capsys, monkeypatch):
    monkeypatch.setenv("KT_BLIS_MIN_ROWS", "0")   # main() sets it for its measurement; restored after
    assert calibrate.main(["--hidden", "128", "--intermediate", "64", "--rows", "4", "64", "--methods", "BF16", "INT8",
                           "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "BF16" in out and "rows/expert" in out and "wrote" in out
    data = json.loads(crossover.path().read_text())
    assert data["host"] == crossover.host_key() and {r["method"] for r in data["measured"]} == {"BF16", "INT8"}
    assert set(data["min_rows"]) == set(crossover.METHODS)
