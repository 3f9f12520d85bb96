"""Plugin ABI compatibility, with plugins compiled from C against real headers: a plugin built
against an older minor of kt/plugin.h (1.0, before kt_moe_config.weight_dtype) loads and
computes with this core; one claiming a newer minor or another major is refused with both
versions named, by selection (descriptor) and by the native check (table); and plugin.h
cannot change without a version bump (tools/abi_hash.py, `nox -s abi`)."""

from __future__ import annotations

import sys
from pathlib import Path

import abi_plugins
import numpy as np
import pytest

import kt_core
from kt_core import _native
from kt_core.backends import explain, selection
from kt_core.errors import BackendError
from kt_core.testing.reference import moe_reference, random_moe, random_routing, relative_error

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
import abi_hash  # noqa: E402

CURRENT = (_native.ABI_MAJOR, _native.ABI_MINOR)
NOW = f"{CURRENT[0]}.{CURRENT[1]}"
HEADER = ROOT / "packages" / "kt-core" / "include"


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(abi_plugins.__file__).parent))

    def add(**specs):
        abi_plugins.register(tmp_path, specs)
        selection.reset()

    yield add
    selection.reset()


def layer(name, **kw):
    return kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="FP32", backend=name, **kw)


def check_forward(moe):
    rng = np.random.default_rng(0)
    w = random_moe(rng, 4, 64, 32)
    moe.load(*w)
    x = rng.standard_normal((7, 64)).astype(np.float32)
    ids, wt = random_routing(rng, 7, 4, 2)
    assert relative_error(moe(x, ids, wt), moe_reference(x, *w, ids, wt)) < 1e-5


def test_the_1_0_header_fixture_is_the_released_one():
    """tests/abi/kt-1.0 must stay the header ABI 1.0 shipped: its hash is the lock's 1.0 entry."""
    text = (abi_plugins.HEADER_1_0 / "kt" / "plugin.h").read_text()
    assert abi_hash.version(text) == "1.0"
    assert abi_hash.read_lock()["1.0"] == abi_hash.digest(text)


def test_plugin_built_against_abi_1_0_loads_and_computes(tmp_path, plugins):
    lib = abi_plugins.build(tmp_path, include=abi_plugins.HEADER_1_0, name="old")
    plugins(old=(lib, (1, 0)))
    moe = layer("old")
    assert moe.backend == "old/v1"
    check_forward(moe)
    native = abi_plugins.native_lib("old")
    # The core sends its own, longer kt_moe_config; the 1.0 plugin reads only its prefix.
    assert native.kt_test_own_config_size() < native.kt_test_seen_config_size()
    row = {r["backend"]: r for r in explain()}["old"]
    assert row["runnable"] and row["reason"] != "ok"


def test_plugin_built_against_the_current_header_loads(tmp_path, plugins):
    plugins(cur=(abi_plugins.build(tmp_path, include=HEADER, name="cur"), CURRENT))
    check_forward(layer("cur"))


@pytest.mark.parametrize("pad", [8, 64])
def test_method_tables_are_walked_with_their_own_size(tmp_path, plugins, pad):
    """Two method tables, each longer than this header's kt_method_kernels (as a plugin built
    against a later minor, whose table gained fields, lays them out): the host reads the second
    at the plugin's stride, and it computes."""
    lib = abi_plugins.build(tmp_path, include=HEADER, name="wide", defines={"KT_TEST_METHOD_PAD": str(pad)})
    plugins(wide=(lib, CURRENT, ("FP32", "BF16")))
    assert [m["method"] for m in _native.load_backend(abi_plugins.native_lib_capsule("wide"), "wide", "v1").methods] \
        == ["FP32", "BF16"]
    moe = kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="BF16", backend="wide")
    check_forward(moe)


def test_a_newer_minor_is_refused_naming_both_versions(tmp_path, plugins):
    newer = f"{CURRENT[0]}.{CURRENT[1] + 1}"
    lib = abi_plugins.build(tmp_path, include=HEADER, name="newer", defines={"KT_TEST_CLAIM_MINOR": str(CURRENT[1] + 1)})
    # Descriptor honest about it: selection refuses before importing anything.
    plugins(newer=(lib, (CURRENT[0], CURRENT[1] + 1)))
    row = {r["backend"]: r for r in explain()}["newer"]
    assert not row["runnable"] and f"needs plugin ABI {newer}, this kt-core speaks up to {NOW}" in row["reason"]
    with pytest.raises(BackendError, match=rf"cannot run method FP32 here.*needs plugin ABI {newer}, this kt-core "
                                           rf"speaks up to {NOW}"):
        layer("newer")
    # Descriptor claiming the current version: the native table's own claim is checked.
    plugins(newer=(lib, CURRENT))
    with pytest.raises(BackendError, match=rf"needs kt plugin ABI {newer} but this kt-core speaks only up to {NOW}"):
        layer("newer")


def test_another_major_is_refused_naming_both_versions(tmp_path, plugins):
    other = CURRENT[0] + 1
    lib = abi_plugins.build(tmp_path, include=HEADER, name="major", defines={"KT_TEST_CLAIM_MAJOR": str(other)})
    plugins(major=(lib, (other, 0)))
    row = {r["backend"]: r for r in explain()}["major"]
    assert not row["runnable"] and f"built for plugin ABI {other}.0, this kt-core speaks {NOW}" in row["reason"]
    plugins(major=(lib, CURRENT))
    with pytest.raises(BackendError, match=rf"built for kt plugin ABI {other}\.{CURRENT[1]}, this kt-core speaks {NOW}"):
        layer("major")
    assert f"{other}.{CURRENT[1]}" in {r["backend"]: r for r in explain()}["major"]["reason"]


# -- the header lock -------------------------------------------------------------------------------
@pytest.fixture
def header_copy(tmp_path):
    header = tmp_path / "plugin.h"
    header.write_text(abi_hash.HEADER.read_text())
    lock = tmp_path / "plugin-abi.lock"
    lock.write_text(abi_hash.LOCK.read_text())
    return header, lock


def test_the_committed_header_matches_its_recorded_hash():
    assert abi_hash.check() == []


def test_a_header_change_without_a_version_bump_fails(header_copy):
    header, lock = header_copy
    text = header.read_text()
    header.write_text(text.replace("    kt_dtype weight_dtype[3];", "    kt_dtype weight_dtype[3];\n    int64_t extra;"))
    problems = abi_hash.check(header, lock, doc=None)
    assert len(problems) == 1 and f"changed since plugin ABI {NOW} was recorded" in problems[0]
    assert "bump KT_PLUGIN_ABI_MINOR" in problems[0] and "--record" in problems[0]


def test_comment_and_whitespace_edits_are_free(header_copy):
    header, lock = header_copy
    header.write_text(header.read_text().replace("/* kt_moe_config.quant_flags */", "/* quant flags, reworded */\n\n"))
    assert abi_hash.check(header, lock, doc=None) == []


def test_a_bump_needs_its_hash_recorded_and_recorded_versions_never_change(header_copy):
    header, lock = header_copy
    bumped = f"{CURRENT[0]}.{CURRENT[1] + 1}"
    header.write_text(header.read_text()
                      .replace(f"#define KT_PLUGIN_ABI_MINOR {CURRENT[1]}", f"#define KT_PLUGIN_ABI_MINOR {CURRENT[1] + 1}")
                      .replace("    kt_dtype weight_dtype[3];", "    kt_dtype weight_dtype[3];\n    int64_t extra;"))
    assert f"declares plugin ABI {bumped}, which plugin-abi.lock does not record" in abi_hash.check(header, lock, None)[0]
    assert abi_hash.record(header=header, lock=lock) == bumped
    assert abi_hash.check(header, lock, doc=None) == []
    assert abi_hash.read_lock(lock)[NOW] == abi_hash.read_lock()[NOW]          # the old entry is kept
    header.write_text(header.read_text().replace("int64_t extra;", "int32_t extra;"))
    with pytest.raises(SystemExit, match=f"ABI {bumped} is already recorded with another hash"):
        abi_hash.record(header=header, lock=lock)


def test_the_docs_version_history_names_the_current_version(header_copy, tmp_path):
    header, lock = header_copy
    doc = tmp_path / "plugin-abi.md"
    doc.write_text("| ABI | change |\n|---|---|\n| 1.0 | the tables |\n")
    problems = abi_hash.check(header, lock, doc)
    assert problems == ([] if NOW == "1.0" else [f"plugin-abi.md's version history has no row for ABI {NOW}"])


@pytest.mark.parametrize("header", ["1.0", "current"])
def test_a_plugin_that_does_not_claim_the_clamped_swiglu_never_gets_a_layer_with_it(tmp_path, plugins, header):
    """ABI 1.2's swiglu_limit / swiglu_alpha reach only kernels whose table claims
    KT_ACTIVATION_SWIGLU: a plugin built against 1.0 (no such field) or merely recompiled
    against today's header (field 0) is refused by name, and still serves plain layers."""
    include = abi_plugins.HEADER_1_0 if header == "1.0" else HEADER
    plugins(plain=(abi_plugins.build(tmp_path, include=include, name="plain"), (1, 0) if header == "1.0" else CURRENT))
    with pytest.raises(ValueError, match=r"backend 'plain' method FP32 \(.*\) does not apply swiglu_limit / "
                                         r"swiglu_alpha \(its kernel table does not claim KT_ACTIVATION_SWIGLU\)"):
        layer("plain", swiglu_limit=7.0, swiglu_alpha=1.702)
    check_forward(layer("plain"))
