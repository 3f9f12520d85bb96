"""pytest fixtures backend test suites share. Import them into a conftest.py:

    from kt_core.testing.fixtures import clean_kt_environment  # noqa: F401
"""

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
