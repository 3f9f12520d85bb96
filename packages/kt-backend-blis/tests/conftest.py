import pytest


@pytest.fixture(autouse=True)
def _no_user_calibration(tmp_path, monkeypatch):
    """Tests never read or write the user's calibration file, and start without an override."""
    monkeypatch.setenv("KT_BLIS_CROSSOVER", str(tmp_path / "blis_crossover.json"))
    monkeypatch.delenv("KT_BLIS_MIN_ROWS", raising=False)
    for var in ("KT_BACKENDS", "KT_DISABLE_BACKENDS", "KT_CPU_VARIANT"):
        monkeypatch.delenv(var, raising=False)
    from kt_core.backends import selection
    selection.reset()
    yield
    selection.reset()
