"""kt_core.probes: the measured roof of `kt bench`. Rates are not asserted (a benchmark's job);
that every kind this host runs is measured, and only those, is."""

import pytest

import kt_core
from kt_core import probes

from conftest import run_python

# kind -> the host features it needs (any of the alternatives)
NEEDS = {"f32_fma": [{"avx512f"}, {"avx2", "fma"}], "bf16_dot": [{"avx512f", "avx512_bf16"}],
         "int8_dot": [{"avx512f", "avx512_vnni"}, {"avx2"}]}


def test_the_kinds_are_those_the_host_can_run():
    features = kt_core.host().features
    want = [k for k, alternatives in NEEDS.items() if any(a <= features for a in alternatives)]
    assert probes.compute_peak_kinds() == want


def test_every_kind_measures_a_rate():
    for kind in probes.compute_peak_kinds():
        assert probes.compute_peak(kind, seconds=0.02) > 0


def test_a_kind_the_host_cannot_run_is_refused_naming_what_it_can():
    with pytest.raises(ValueError, match=r"this host cannot measure 'fp4_dot' \(it measures: "):
        probes.compute_peak("fp4_dot")


def test_the_isa_cap_applies():
    if kt_core.host().arch != "x86_64" or "avx2" not in kt_core.host().features:
        pytest.skip("needs an x86-64 host with AVX2")
    r = run_python("from kt_core import probes; print(probes.compute_peak_kinds())", KT_MAX_ISA="x86-64-v3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['f32_fma', 'int8_dot']"
