"""The application's commands, run through kt-core's `kt` script as a user types them."""

import re

import pytest

from conftest import run_python


def kt(*args, **env):
    return run_python(f"import sys; from kt_core.cli import main; sys.exit(main([*{list(args)!r}]))", **env)


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
