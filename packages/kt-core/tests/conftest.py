import os
import subprocess
import sys

import pytest

from kt_core.backends import selection


@pytest.fixture(autouse=True)
def clean_kt_environment(monkeypatch):
    """Each test starts from an unconfigured selection with no KT_* overrides."""
    for var in ("KT_BACKENDS", "KT_DISABLE_BACKENDS", "KT_CPU_VARIANT", "KT_MAX_ISA"):
        monkeypatch.delenv(var, raising=False)
    selection.reset()
    yield
    selection.reset()


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (for settings fixed at first use, and crash isolation)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KT_")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)
