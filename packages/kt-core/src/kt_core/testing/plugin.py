"""pytest plugin running kt's conformance suite against one backend.

    pytest -p kt_core.testing.plugin --kt-backend NAME --pyargs kt_core.testing.conformance

Every variant of the backend is tried: the ones this host can run are forced one at a time
through KT_CPU_VARIANT; the others are skipped, naming the missing CPU features.
"""

from __future__ import annotations

import os

import pytest

from ..backends import selection
from ..backends.discovery import discover
from ..host import host

# Error allowed between a backend and the reference backend on the same packed weights,
# as max |difference| / RMS(reference output). FP32 and BF16 differ only in accumulation
# order and, for BF16 kernels, in rounding intermediate activations to bf16.
DEFAULT_TOLERANCE = {"FP32": 1e-4, "BF16": 2e-2, "INT8": 2e-2, "INT4": 2e-2, "RAWINT4": 2e-2, "FP8": 2e-2,
                     "FP8_PERCHANNEL": 2e-2, "LLAMAFILE": 2e-2, "MXFP4": 2e-2,
                     "GPTQ_INT4": 2e-2, "MXFP8": 2e-2, "NVFP4": 2e-2}


def pytest_addoption(parser):
    group = parser.getgroup("kt", "kt backend conformance")
    group.addoption("--kt-backend", action="append", default=[],
                    help="backend to test (repeatable); default: every installed backend")
    group.addoption("--kt-variant", action="append", default=[], metavar="BACKEND/VARIANT",
                    help="only this variant (repeatable), e.g. avx/x86-64-v3; default: every variant")
    group.addoption("--kt-tolerance", action="append", default=[], metavar="METHOD=VALUE",
                    help="override a method's tolerance, e.g. INT4=0.05")


def _variants(config):
    wanted = config.getoption("--kt-backend")
    found = [d.descriptor for d in discover() if d.descriptor is not None]
    names = {d.name for d in found}
    for name in wanted:
        if name not in names:
            raise pytest.UsageError(f"--kt-backend {name}: no such installed backend (installed: {', '.join(sorted(names))})")
    pairs = [(d, v) for d in found if not wanted or d.name in wanted for v in d.variants]
    only = config.getoption("--kt-variant")
    named = {f"{d.name}/{v.name}" for d, v in pairs}
    for name in only:
        if name not in named:
            raise pytest.UsageError(f"--kt-variant {name}: no such variant (installed: {', '.join(sorted(named))})")
    return [(d, v) for d, v in pairs if not only or f"{d.name}/{v.name}" in only]


def pytest_generate_tests(metafunc):
    if "kt_case" in metafunc.fixturenames:
        cases = [(d, v, m) for d, v in _variants(metafunc.config) for m in v.methods]
        metafunc.parametrize("kt_case", cases, ids=[f"{d.name}-{v.name}-{m}" for d, v, m in cases])


@pytest.fixture
def kt_tolerance(request):
    table = dict(DEFAULT_TOLERANCE)
    for item in request.config.getoption("--kt-tolerance"):
        method, _, value = item.partition("=")
        table[method.upper()] = float(value)
    return table


@pytest.fixture
def kt_variant(kt_case, monkeypatch):
    """(descriptor, variant, method) with the variant forced through KT_CPU_VARIANT."""
    descriptor, variant, method = kt_case
    missing = host().missing(variant.requires)
    if missing:
        pytest.skip(f"{descriptor.name}/{variant.name} needs {', '.join(missing)}, which this host lacks")
    if host().arch not in descriptor.arch:
        pytest.skip(f"{descriptor.name} is built for {', '.join(descriptor.arch)}, this host is {host().arch}")
    problem = descriptor.probe() if descriptor.probe is not None else None
    if problem:
        pytest.skip(f"{descriptor.name}/{variant.name} cannot run here: {problem}")
    for var in ("KT_BACKENDS", "KT_DISABLE_BACKENDS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KT_CPU_VARIANT", variant.name)
    selection.reset()
    yield kt_case
    monkeypatch.delenv("KT_CPU_VARIANT")
    selection.reset()


def pytest_report_header(config):
    return f"kt: host {host().brand} ({host().isa_level}), KT_MAX_ISA={os.environ.get('KT_MAX_ISA', '-')}"
