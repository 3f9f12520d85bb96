"""`kt config` and the YAML defaults kt run / kt bench / kt convert read, as a user types them."""

import pytest

from conftest import run_python


def kt(config, *args):
    return run_python(f"import sys; from kt_core.cli import main; sys.exit(main([*{list(args)!r}]))",
                      KT_CONFIG=str(config))


@pytest.fixture
def config(tmp_path):
    return tmp_path / "kt" / "config.yaml"


def test_set_get_list_unset_round_trip(config):
    assert kt(config, "config", "set", "run.kt_method", "INT4").returncode == 0
    assert kt(config, "config", "set", "run.port", "8081").returncode == 0
    assert kt(config, "config", "set", "bench.tokens", "1", "32").returncode == 0
    assert kt(config, "config", "get", "run.port").stdout.strip() == "8081"
    listed = kt(config, "config", "list").stdout
    assert "bench.tokens = [1, 32]" in listed and "run.kt_method = 'INT4'" in listed
    assert kt(config, "config", "unset", "run.port").returncode == 0
    r = kt(config, "config", "get", "run.port")
    assert r.returncode == 1 and "run.port is not set" in r.stderr


def test_defaults_reach_the_commands_and_flags_win(config):
    kt(config, "config", "set", "run.kt_method", "INT8")
    kt(config, "config", "set", "run.port", "8123")
    r = kt(config, "run", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "experts                INT8" in r.stdout and ":8123/v1" in r.stdout
    r = kt(config, "run", "--dry-run", "--port", "9000", "--kt-method", "BF16")
    assert ":9000/v1" in r.stdout and "experts                BF16" in r.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["run.port", "abc"], "abc is not a value kt run --port takes"),
    (["bench.tokens", "0"], "0 is not a value kt bench --tokens takes"),
    (["run.nope", "1"], "kt run has no option 'nope'"),
    (["chat.url", "x"], "config keys are COMMAND.OPTION with COMMAND one of run, bench, convert"),
    (["run.fast_activations", "maybe"], "is the flag --fast-activations: true or false"),
    (["run.port", "1", "2"], "takes one value, got 2"),
])
def test_bad_keys_and_values_are_refused_and_nothing_is_written(config, args, message):
    r = kt(config, "config", "set", *args)
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert not config.exists()


def test_bad_yaml_names_the_file_and_the_line(config):
    config.parent.mkdir(parents=True)
    config.write_text("run:\n  port: 8000\n  kt_method: [INT4\n")
    r = kt(config, "run", "--dry-run")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{config}, line 4 is not valid YAML" in r.stderr, r.stderr
    config.write_text("serve:\n  port: 1\n")
    r = kt(config, "run", "--dry-run")
    assert r.returncode == 1 and "has settings for serve; only run, bench, convert read one" in r.stderr
