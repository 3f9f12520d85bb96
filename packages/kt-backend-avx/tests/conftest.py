import pytest

import kt_core
from kt_backend_avx import descriptor
from kt_core.backends import selection
from kt_core.testing.fixtures import clean_kt_environment  # noqa: F401


@pytest.fixture(params=[v.name for v in descriptor.variants])
def variant(request, monkeypatch):
    """Each of the backend's variants in turn, forced with KT_CPU_VARIANT; skipped, naming the
    missing features, where this host cannot run it."""
    v = next(x for x in descriptor.variants if x.name == request.param)
    missing = kt_core.host().missing(v.requires)
    if missing:
        pytest.skip(f"{v.name} needs {', '.join(missing)}, which this host lacks")
    monkeypatch.setenv("KT_CPU_VARIANT", v.name)
    selection.reset()
    return v.name
