"""kt-backend-amx's tests run the build that is installed: the software-tile emulation build
(KT_AMX_EMULATE=1 at build time) anywhere with AVX-512 VNNI/BF16, the hardware build only on
an AMX host. Each test is skipped, naming what is missing, where the variant cannot run."""

import os

import pytest

from kt_backend_amx import _build, descriptor
from kt_core.backends import selection
from kt_core.host import host

if _build.EMULATED:
    os.environ["KT_AMX_EMULATE"] = "1"   # the emulation build is refused without it
# Every batch on the tiles unless a test asks for the AVX hand-off (the crossover).
os.environ.setdefault("KT_AMX_MIN_ROWS", "0")

VARIANT = descriptor.variants[0]


@pytest.fixture
def amx(monkeypatch):
    """The installed variant, runnable here, with selection rebuilt around the test's environment."""
    missing = host().missing(VARIANT.requires)
    if missing:
        pytest.skip(f"amx/{VARIANT.name} needs {', '.join(missing)}, which this host lacks")
    selection.reset()
    yield VARIANT
    selection.reset()


@pytest.fixture
def native(amx):
    from kt_backend_amx import _native
    return _native
