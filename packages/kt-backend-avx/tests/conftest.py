import pytest

from kt_core.backends import selection


@pytest.fixture(autouse=True)
def clean_kt_environment(monkeypatch):
    for var in ("KT_BACKENDS", "KT_DISABLE_BACKENDS", "KT_CPU_VARIANT", "KT_MAX_ISA"):
        monkeypatch.delenv(var, raising=False)
    selection.reset()
    yield
    selection.reset()
