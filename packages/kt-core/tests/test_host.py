import dataclasses

import pytest

import kt_core
from kt_core.errors import BackendSelectionError
from kt_core.host import isa_levels

from conftest import run_python

# /proc/cpuinfo spells some features differently from kt.
CPUINFO_NAMES = {"sse4_2": "sse4_2", "lzcnt": "abm", "avx512_vbmi": "avx512vbmi", "avx512_fp16": "avx512_fp16",
                 "amx_tile": "amx_tile", "amx_int8": "amx_int8", "amx_bf16": "amx_bf16"}


def cpuinfo_flags() -> set[str]:
    for line in open("/proc/cpuinfo"):
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def test_host_is_immutable_and_cached():
    h = kt_core.host()
    assert h is kt_core.host()
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.arch = "other"


def test_features_agree_with_the_kernel():
    h = kt_core.host()
    flags = cpuinfo_flags()
    for feature in h.detected_features:
        assert CPUINFO_NAMES.get(feature, feature) in flags, f"{feature} detected but not in /proc/cpuinfo"


def test_topology_counts_physical_cores():
    h = kt_core.host()
    assert 1 <= h.physical_cores <= h.logical_cpus
    assert sum(len(n.cores) for n in h.numa_nodes) == h.physical_cores
    assert h.topology_source


def test_isa_level_is_the_highest_satisfied():
    h = kt_core.host()
    levels = isa_levels(h.arch)
    assert levels[h.isa_level] <= h.features
    names = list(levels)
    above = names[names.index(h.isa_level) + 1:]
    assert all(not levels[n] <= h.features for n in above)


def test_max_isa_caps_features():
    result = run_python("import kt_core; h = kt_core.host(); print(h.isa_level, sorted(h.features)); print(h.notes)",
                        KT_MAX_ISA="x86-64-v3")
    if kt_core.host().arch != "x86_64":
        pytest.skip("x86 ISA levels")
    assert result.returncode == 0, result.stderr
    assert "avx512f" not in result.stdout.splitlines()[0]
    if "avx512f" in kt_core.host().detected_features:
        assert "withheld by KT_MAX_ISA=x86-64-v3" in result.stdout


def test_unknown_max_isa_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("KT_MAX_ISA", "pentium-mmx")
    kt_core.host.cache_clear()
    with pytest.raises(BackendSelectionError, match="KT_MAX_ISA='pentium-mmx' is not an ISA level"):
        kt_core.host()


def test_include_and_cmake_dirs_ship_the_abi():
    from pathlib import Path

    assert (Path(kt_core.get_include()) / "kt" / "plugin.h").is_file()
    assert (Path(kt_core.get_cmake_dir()) / "ktcoreConfig.cmake").is_file()
    assert (Path(kt_core.get_cmake_dir()) / "KtCommon.cmake").is_file()
    assert kt_core.abi_version() == (1, 8)   # plugin.h: KT_PLUGIN_ABI_MAJOR.MINOR
