import json
import re

import pytest

from conftest import run_python


def kt(*args, **env):
    return run_python(f"import sys; from kt_core.cli import main; sys.argv = ['kt', *{list(args)!r}]; main()", **env)


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
    assert r.returncode == 0
    assert "KT_BACKENDS names 'nonesuch'" in r.stdout


@pytest.mark.parametrize("max_isa", ["x86-64-v3"])
def test_doctor_shows_the_cap(max_isa):
    import kt_core

    if kt_core.host().arch != "x86_64":
        pytest.skip("x86 ISA levels")
    r = kt("doctor", "--json", KT_MAX_ISA=max_isa)
    data = json.loads(r.stdout)
    assert data["cpu"]["max_isa"] == max_isa
    assert "avx512f" not in data["cpu"]["features"]


def test_demo_generates_with_torch_and_kt_experts(tmp_path):
    pytest.importorskip("transformers", reason="kt demo runs a transformers model")
    r = kt("demo", "--tokens", "16", XDG_CACHE_HOME=str(tmp_path))
    assert r.returncode == 0, r.stderr + r.stdout
    assert "wrote the tiny Qwen3-MoE preset" in r.stdout
    assert (tmp_path / "kt" / "presets" / "tiny-qwen3-moe-v1" / "config.json").is_file()
    texts = re.findall(r"^(torch|kt) experts: +'(.*)' +\[([\d.]+) tokens/s\]$", r.stdout, re.M)
    assert [t[0] for t in texts] == ["torch", "kt"] and texts[0][1] == texts[1][1], r.stdout
    assert "the texts agree: all 16 generated tokens are the same" in r.stdout

    r = kt("demo", "--tokens", "8", "--method", "INT4", XDG_CACHE_HOME=str(tmp_path))
    assert r.returncode == 0, r.stderr + r.stdout
    assert "loaded the tiny Qwen3-MoE preset" in r.stdout and "experts: INT4 on" in r.stdout
