"""kt-core's aarch64 host detection, run where it means something: on an arm64 host, or under
qemu-aarch64 by `nox -s aarch64` with several CPU models (cortex-a72: NEON only; neoverse-n1:
+dotprod; max: SVE2, I8MM, BF16, with sve-max-vq for the vector length). KT_EXPECT_ARM_FEATURES
and KT_EXPECT_SVE_BITS, set by that session, say what the emulated CPU has."""

import os

import pytest

import kt_core
from kt_core.host import _cap, isa_levels

pytestmark = pytest.mark.skipif(kt_core.host().arch != "aarch64",
                                reason=f"aarch64 host detection; this host is {kt_core.host().arch}")
ARM_FEATURES = {"neon", "asimddp", "i8mm", "bf16", "sve", "sve2"}


def test_features_are_arm_names_and_the_level_follows_them():
    h = kt_core.host()
    assert "neon" in h.features and h.features <= ARM_FEATURES, h.features
    level = isa_levels("aarch64")[h.isa_level]
    assert level <= h.features
    higher = [n for n, f in isa_levels("aarch64").items() if f > level]
    assert all(not f <= h.features for f in (isa_levels("aarch64")[n] for n in higher))


def test_what_the_emulated_cpu_has_is_detected():
    want = os.environ.get("KT_EXPECT_ARM_FEATURES")
    if not want:
        pytest.skip("KT_EXPECT_ARM_FEATURES is set by `nox -s aarch64` for its qemu CPU models")
    assert set(kt_core.host().detected_features) == set(want.split(","))


def test_sve_vector_length():
    h = kt_core.host()
    if "sve" not in h.features:
        assert h.sve_vector_bits == 0
        return
    assert h.sve_vector_bits in range(128, 2049, 128), h.sve_vector_bits
    if want := os.environ.get("KT_EXPECT_SVE_BITS"):
        assert h.sve_vector_bits == int(want)


def test_max_isa_caps_arm_levels():
    # In-process: under qemu-user a child interpreter cannot be started (no binfmt_misc).
    h = kt_core.host()
    capped, notes = _cap("aarch64", h.detected_features, "armv8-a")
    assert capped == {"neon"}
    assert sorted(notes) == sorted(f"{f}: withheld by KT_MAX_ISA=armv8-a" for f in h.detected_features - {"neon"})
    with pytest.raises(kt_core.errors.BackendSelectionError, match="not an ISA level of aarch64"):
        _cap("aarch64", h.detected_features, "x86-64-v3")


def test_compute_probe_runs_the_neon_loops():
    kinds = kt_core._native.compute_peak_kinds()
    assert "f32_fma" in kinds
    assert ("int8_dot" in kinds) == ("asimddp" in kt_core.host().features)
    assert kt_core._native.compute_peak_macs("f32_fma", 0.05) > 0
