import json

import pytest

from conftest import run_python


def kt(*args, **env):
    return run_python(f"import sys; from kt_core.cli import main; sys.exit(main([*{list(args)!r}]))", **env)


def test_version_json():
    r = kt("version", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["plugin_abi"] == "1.1" and "reference" in data["backends"]


def test_doctor_json_recommends_threads_per_physical_core():
    import kt_core

    r = kt("doctor", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["recommended"]["cpuinfer_threads"] == kt_core.host().physical_cores
    assert data["recommended"]["threadpool_count"] == len(kt_core.host().numa_nodes)
    assert "physical core" in data["recommended"]["cpuinfer_threads_reason"]
    assert data["cpu"]["isa_level"] == kt_core.host().isa_level
    assert any(b["backend"] == "reference" for b in data["backends"])


def test_doctor_human_output():
    r = kt("doctor")
    assert r.returncode == 0, r.stderr
    assert "recommended" in r.stdout and "NUMA" in r.stdout


def test_backends_explains_choice():
    r = kt("backends", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["variants"]
    chosen = {m for row in rows for m in row["chosen_for"]}
    assert {"BF16", "FP32"} <= chosen
    for row in rows:
        assert row["reason"].startswith("chosen" if row["chosen_for"] else ("runnable; outranked by", "needs", "failed",
                                                                            "disabled", "not listed", "broken",
                                                                            "KT_CPU_VARIANT", "built for"))


def test_backends_reports_environment_errors():
    r = kt("backends", KT_BACKENDS="nonesuch")
    assert r.returncode == 1
    assert "KT_BACKENDS names 'nonesuch'" in r.stderr


@pytest.mark.parametrize("max_isa", ["x86-64-v3"])
def test_doctor_shows_the_cap(max_isa):
    import kt_core

    if kt_core.host().arch != "x86_64":
        pytest.skip("x86 ISA levels")
    r = kt("doctor", "--json", KT_MAX_ISA=max_isa)
    data = json.loads(r.stdout)
    assert data["cpu"]["max_isa"] == max_isa
    assert "avx512f" not in data["cpu"]["features"]
