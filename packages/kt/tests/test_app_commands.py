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


@pytest.fixture(scope="module")
def preset_cache(tmp_path_factory):
    """One cache for the module: kt demo writes its tiny preset once."""
    return tmp_path_factory.mktemp("cache")


APP_COMMANDS = {
    "bench": ["bench", "--hidden", "64", "--intermediate", "32", "--experts", "4", "--top-k", "2", "--tokens", "1",
              "--repeats", "1", "--warmup", "0", "--bandwidth-mib", "8"],
    "convert": ["convert", "MODEL", "OUT"],
    "demo": ["demo", "--tokens", "1"],
    "run": ["run", "--dry-run"],
}
# A dry run starts no pool; kt convert's codes need no backend.
NOT_READ = {("run", "KT_VIRTUAL_NUMA"), ("run", "KT_SPIN_US"), ("convert", "KT_BACKENDS"), ("convert", "KT_CPU_VARIANT")}
BAD_SETTINGS = [("KT_VIRTUAL_NUMA", "foo"), ("KT_SPIN_US", "-1"), ("KT_BACKENDS", "nope"), ("KT_MAX_ISA", "foo"),
                ("KT_CPU_VARIANT", "bogus")]


@pytest.mark.parametrize("command", sorted(APP_COMMANDS))
@pytest.mark.parametrize(("var", "value"), BAD_SETTINGS, ids=[f"{v}={x}" for v, x in BAD_SETTINGS])
def test_a_bad_setting_is_one_line_for_the_application_s_commands(tmp_path, preset_cache, command, var, value):
    """What the command reads fails in one line naming the variable, exit 1; what it never reads
    (the pool settings in a dry run, the backends in a convert that fails first) lets it run."""
    pytest.importorskip("torch")
    if command == "demo":
        pytest.importorskip("transformers", reason="kt demo runs a transformers model")
    from kt.testing.checkpoints import write_checkpoint

    write_checkpoint(tmp_path / "m", "qwen3_moe", hidden=64, intermediate=32, experts=4, layers=1, dense_prefix=0)
    args = [str(tmp_path / "m") if a == "MODEL" else str(tmp_path / "out") if a == "OUT" else a
            for a in APP_COMMANDS[command]]
    r = kt(*args, **{var: value}, XDG_CACHE_HOME=str(preset_cache))
    assert "Traceback" not in r.stderr, r.stderr
    if r.returncode != 0:
        assert r.returncode == 1 and r.stderr.startswith(f"kt {command}: ") and var in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    else:
        assert (command, var) in NOT_READ, (r.stdout, r.stderr)


def test_install_hints_keep_their_extras():
    """Rich markup used to eat `[serve]` out of `pip install 'kt[serve]'`."""
    code = ("import sys; sys.modules['httpx'] = None; from kt_core.cli import main; "
            "sys.exit(main(['chat', '--url', 'http://127.0.0.1:9/v1']))")
    r = run_python(code)
    assert r.returncode == 1 and "pip install 'kt[serve]'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
