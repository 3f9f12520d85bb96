"""pytest fixtures backend test suites share. Import them into a conftest.py:

    from kt_core.testing.fixtures import clean_kt_environment, run_python  # noqa: F401
"""

import os
import subprocess
import sys

import pytest

from ..backends import selection

KT_SELECTION_VARIABLES = ("KT_BACKENDS", "KT_DISABLE_BACKENDS", "KT_CPU_VARIANT", "KT_MAX_ISA")


@pytest.fixture(autouse=True)
def clean_kt_environment(monkeypatch):
    """Each test starts from an unconfigured selection with no KT_* overrides (they are read once
    per selection, so a test that sets one must not leak it into the next)."""
    for var in KT_SELECTION_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    selection.reset()
    yield
    selection.reset()


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter without the caller's KT_* settings, plus `env` (for
    settings fixed at first use, and crash isolation)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KT_")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)
