import json

import pytest

from conftest import run_python


def kt(*args, **env):
    return run_python(f"import sys; from kt_core.cli import main; sys.exit(main([*{list(args)!r}]))", **env)


def test_version_json():
    r = kt("version", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["plugin_abi"] == "1.8" and "reference" in data["backends"]


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


def _installed():
    from kt_core.backends import discover

    return {d.descriptor.name for d in discover() if d.descriptor}


# (variable, value, fails): every KT_* variable a user sets, good and bad values, names in any case.
ENVIRONMENTS = [
    ("KT_BACKENDS", "reference", False), ("KT_BACKENDS", "Reference", False), ("KT_BACKENDS", "nope", True),
    ("KT_BACKENDS", "avx", None), ("KT_BACKENDS", "AVX,reference", None), ("KT_DISABLE_BACKENDS", "avx", False),
    ("KT_MAX_ISA", "x86-64-v3", False), ("KT_MAX_ISA", "X86-64-V3", False), ("KT_MAX_ISA", "foo", True),
    ("KT_CPU_VARIANT", "baseline", False), ("KT_CPU_VARIANT", "bogus", True),
    ("KT_SPIN_US", "-1", True), ("KT_SPIN_US", "99999999999", True), ("KT_SPIN_US", "2ms", True),
    ("KT_SPIN_US", "5000", False), ("KT_VIRTUAL_NUMA", "foo", True), ("KT_VIRTUAL_NUMA", "2", False),
]


@pytest.mark.parametrize("command", ["version", "doctor", "backends"])
@pytest.mark.parametrize(("var", "value", "fails"), ENVIRONMENTS, ids=[f"{v}={x}" for v, x, _ in ENVIRONMENTS])
def test_every_variable_with_every_command(command, var, value, fails):
    """A bad setting is one line on stderr and exit 1, never a traceback; `kt version` reads none of them."""
    import kt_core

    if var == "KT_MAX_ISA" and kt_core.host().arch != "x86_64":
        pytest.skip("x86 ISA levels")
    if fails is None:   # names avx: fine where it is installed and runs here
        fails = "avx" not in _installed() or not any(c.runnable for c in kt_core.backends.selector().candidates
                                                     if c.backend == "avx")
    if var in ("KT_SPIN_US", "KT_VIRTUAL_NUMA") and command == "backends":
        fails = False   # pool settings: `kt backends` starts no pool
    r = kt(command, **{var: value})
    assert "Traceback" not in r.stderr, r.stderr
    if fails and command != "version":
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stderr.startswith(f"kt {command}: "), r.stderr
        assert var in r.stderr or var.lower().removeprefix("kt_") in r.stderr, r.stderr
    else:
        assert r.returncode == 0, r.stdout + r.stderr


def test_backends_table_is_one_line_per_variant_at_80_columns():
    import kt_core

    r = kt("backends", COLUMNS="80")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines()[2:] if line.strip()]
    variants = [c for c in kt_core.backends.selector().candidates]
    assert len(rows) == len(variants) and all(len(line) <= 80 for line in rows), r.stdout
    assert all(line.split()[1] in ("0",) or "." in line.split()[1] for line in rows)   # one kind of score


def test_doctor_explains_the_pool_line():
    r = kt("doctor")
    assert "the calling thread +" in r.stdout and "[-1" not in r.stdout


def test_commands_of_the_application_without_it_say_what_to_install():
    code = ("import sys; import kt_core.cli as c; c._application = lambda: None; "
            "sys.exit(c.main(['run']))")
    r = run_python(code)
    assert r.returncode == 2 and "pip install kt" in r.stderr, r.stderr


def test_version_imports_nothing_it_does_not_print():
    code = ("import sys; from kt_core.cli import main; main(['version']); "
            "print(sorted(m for m in ('torch', 'typer', 'rich') if m in sys.modules))")
    r = run_python(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("[]"), r.stdout + r.stderr
