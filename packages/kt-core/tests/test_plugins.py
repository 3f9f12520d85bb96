"""Discovery, selection and ABI checks against misbehaving plugins."""

import sys

import pytest

import kt_core
from kt_core import _native
from kt_core.backends import explain, selection
from kt_core.errors import BackendError, BackendSelectionError

import fake_plugins

DESCRIPTOR = """
from kt_core.backends import BackendDescriptor, Tier, Variant
descriptor = BackendDescriptor(name={name!r}, abi_version={abi!r}, tier=Tier.GENERIC_SIMD,
    variants=(Variant("v1", module={module!r}, requires={requires!r}, methods=("FP32",)),))
"""
NATIVE = """
import fake_plugins
def backend_api(variant):
    return fake_plugins.capsule(**{kwargs!r})
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(fake_plugins.Path(fake_plugins.__file__).parent))

    def add(**sources):
        fake_plugins.install(tmp_path, sources)
        for mod in [m for m in sys.modules if m.startswith("fake_") and m != "fake_plugins"]:
            del sys.modules[mod]
        selection.reset()

    return add


def descriptor(name, module=None, abi=(1, 0), requires=()):
    return DESCRIPTOR.format(name=name, module=module or f"fake_{name}_native", abi=abi, requires=frozenset(requires))


def native(**kwargs):
    return NATIVE.format(kwargs=kwargs)


def rows_by_backend():
    return {r["backend"].split(" =")[0]: r for r in explain()}


def test_reference_is_discovered_through_its_entry_point():
    found = {d.descriptor.name for d in kt_core.backends.discover() if d.descriptor}
    assert "reference" in found


def test_importing_a_descriptor_does_not_import_native_code():
    from conftest import run_python

    r = run_python("import sys, kt_core; kt_core.backends.discover(); kt_core.backends.selector().ranked('FP32');"
                   "print('kt_core.backends.reference._native' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_plugin_that_raises_on_import_is_isolated(plugins):
    plugins(broken="raise ImportError('libfoo.so.3: cannot open shared object file')")
    rows = rows_by_backend()
    assert "libfoo.so.3" in rows["broken"]["reason"]
    assert rows["reference"]["runnable"]
    kt_core.MoE(num_experts=2, top_k=1, hidden_size=8, intermediate_size=8, method="FP32")  # others still work


def test_entry_point_that_is_not_a_descriptor(plugins):
    plugins(notone="descriptor = 42")
    assert "expected a kt_core.backends.BackendDescriptor, found int" in rows_by_backend()["notone"]["reason"]


def test_other_abi_major_is_refused_with_both_versions(plugins):
    plugins(future=descriptor("future", abi=(2, 0)))
    row = rows_by_backend()["future"]
    assert not row["runnable"]
    assert "ABI 2.0" in row["reason"] and "{}.{}".format(*kt_core.abi_version()) in row["reason"]


def test_native_table_of_another_major_is_refused(plugins):
    plugins(liar=descriptor("liar"), liar_native=native(name="liar", major=3, minor=1))
    with pytest.raises(BackendError, match=r"ABI 3\.1, this kt-core speaks {}\.{}".format(*kt_core.abi_version())):
        kt_core.MoE(num_experts=2, top_k=1, hidden_size=8, intermediate_size=8, method="FP32", backend="liar")
    assert "failed to load" in rows_by_backend()["liar"]["reason"]


def test_truncated_table_is_refused(plugins):
    plugins(liar=descriptor("liar"), liar_native=native(name="liar", size=8))
    with pytest.raises(BackendError, match="smaller than ABI 1.0"):
        kt_core.MoE(num_experts=2, top_k=1, hidden_size=8, intermediate_size=8, method="FP32", backend="liar")


def test_descriptor_understating_features_is_caught_before_any_kernel(plugins):
    plugins(liar=descriptor("liar"), liar_native=native(name="liar", features=b"avx2,quantum_tiles"))
    with pytest.raises(BackendError, match="missing: quantum_tiles"):
        kt_core.MoE(num_experts=2, top_k=1, hidden_size=8, intermediate_size=8, method="FP32", backend="liar")


def test_descriptor_claiming_methods_the_native_lacks(plugins):
    plugins(liar=descriptor("liar"), liar_native=native(name="liar"))
    with pytest.raises(BackendError, match="claims methods FP32"):
        kt_core.MoE(num_experts=2, top_k=1, hidden_size=8, intermediate_size=8, method="FP32", backend="liar")


def test_failed_backend_falls_back_to_the_next(plugins):
    plugins(liar=descriptor("liar"), liar_native=native(name="liar", major=9))
    m = kt_core.MoE(num_experts=2, top_k=1, hidden_size=8, intermediate_size=8, method="FP32")
    assert m.backend == "reference/baseline"   # liar ranks higher (generic SIMD) but cannot load


def test_variant_needing_missing_features_scores_zero(plugins):
    plugins(wide=descriptor("wide", requires=("avx1024",)))
    row = rows_by_backend()["wide"]
    assert row["score"] == 0 and "needs avx1024" in row["reason"]


def test_kt_backends_naming_a_missing_backend(monkeypatch):
    monkeypatch.setenv("KT_BACKENDS", "nonesuch")
    with pytest.raises(BackendSelectionError, match="KT_BACKENDS names 'nonesuch'.*Installed: .*reference"):
        selection.selector()


def test_kt_backends_naming_one_that_cannot_run(plugins, monkeypatch):
    plugins(wide=descriptor("wide", requires=("avx1024",)))
    monkeypatch.setenv("KT_BACKENDS", "wide")
    with pytest.raises(BackendSelectionError, match="cannot run on this host.*needs avx1024"):
        selection.selector()


def test_kt_disable_backends(monkeypatch):
    monkeypatch.setenv("KT_DISABLE_BACKENDS", "reference")
    with pytest.raises(BackendError, match="no backend that provides method FP32 can run here.*KT_DISABLE_BACKENDS"):
        kt_core.MoE(num_experts=2, top_k=1, hidden_size=8, intermediate_size=8, method="FP32")


def test_kt_cpu_variant_unknown(monkeypatch):
    monkeypatch.setenv("KT_CPU_VARIANT", "x86-64-v9")
    with pytest.raises(BackendSelectionError, match="KT_CPU_VARIANT='x86-64-v9' is no variant"):
        selection.selector()


def test_unknown_method_names_what_exists():
    with pytest.raises(BackendError, match="no installed backend provides method 'MXFP3'.*BF16, FP32"):
        kt_core.MoE(num_experts=2, top_k=1, hidden_size=8, intermediate_size=8, method="MXFP3")


def test_capsule_of_the_wrong_kind():
    with pytest.raises(TypeError, match="PyCapsule named 'kt.backend_api'"):
        _native.load_backend(object(), "x", "y")


def test_explain_says_why_reference_won():
    from kt_core.backends.reference import descriptor

    row = rows_by_backend()["reference"]
    assert set(row["chosen_for"]) <= set(descriptor.variants[0].methods)
    assert row["score"] == (1, 0)
