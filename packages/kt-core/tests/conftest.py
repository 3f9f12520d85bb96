import os
import subprocess
import sys

from kt_core.testing.fixtures import clean_kt_environment  # noqa: F401


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (for settings fixed at first use, and crash isolation)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KT_")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)
