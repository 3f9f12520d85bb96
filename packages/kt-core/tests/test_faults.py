"""Faults: a backend returning an error status from a kernel or its packer (a clear Python
exception carrying the backend's message, and a layer that still works afterwards), allocation
failure while loading (MemoryError, nothing leaked over 100 create/fail/destroy cycles), a
conversion killed mid-write, and output folders that cannot be written.

The interrupted-by-KeyboardInterrupt and simulated-full-disk conversions are in
test_weights_convert.py; these add a SIGKILLed process, read-only folders and every write."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import abi_plugins
import fake_kernels as fk
import numpy as np
import pytest

import kt_core
from kt_core.backends import selection
from kt_core.testing.reference import moe_reference, random_moe, random_routing, relative_error

from conftest import run_python

KT_ERROR_INVALID_ARGUMENT, KT_ERROR_OUT_OF_MEMORY, KT_ERROR_INTERNAL = 1, 3, 4
# Large enough that the forward runs on the pool threads (above kt-core's serial threshold).
E, H, I, TOP_K, TOKENS = 8, 256, 128, 2, 24


@pytest.fixture(scope="module")
def c_plugin(tmp_path_factory):
    """plugin_fp32.c built against the current header, registered as backend "cfault"."""
    root = tmp_path_factory.mktemp("cfault")
    lib = abi_plugins.build(root, include=Path(kt_core.get_include()), name="cfault")
    return root, lib


@pytest.fixture
def cfault(c_plugin, monkeypatch):
    root, lib = c_plugin
    monkeypatch.syspath_prepend(str(root))
    abi_plugins.register(root, {"cfault": (lib, (kt_core._native.ABI_MAJOR, kt_core._native.ABI_MINOR))})
    selection.reset()
    native = abi_plugins.native_lib("cfault")
    native.kt_test_fail(0, 0)
    yield native
    native.kt_test_fail(0, 0)
    selection.reset()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    w = random_moe(rng, E, H, I)
    x = rng.standard_normal((TOKENS, H)).astype(np.float32)
    ids, wt = random_routing(rng, TOKENS, E, TOP_K)
    return w, x, ids, wt, moe_reference(x, *w, ids, wt)


def layer(backend):
    return kt_core.MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method="FP32", backend=backend)


ENTRIES = {1: "pack_expert", 2: "gate_up_tile", 3: "down_tile"}


@pytest.mark.parametrize("entry", [2, 3])
@pytest.mark.parametrize(("status", "error"), [(KT_ERROR_INTERNAL, RuntimeError),
                                               (KT_ERROR_INVALID_ARGUMENT, ValueError),
                                               (KT_ERROR_OUT_OF_MEMORY, MemoryError)])
def test_a_failing_kernel_raises_its_message_and_the_layer_recovers(cfault, data, entry, status, error):
    w, x, ids, wt, want = data
    moe = layer("cfault")
    moe.load(*w)
    assert relative_error(moe(x, ids, wt), want) < 1e-5
    cfault.kt_test_fail(entry, status)
    with pytest.raises(error, match=f"C plugin: {ENTRIES[entry]} failed on purpose"):
        moe(x, ids, wt)
    with pytest.raises(error, match=f"C plugin: {ENTRIES[entry]} failed on purpose"):   # and through submit/sync
        moe.submit(x, ids, wt)
        moe.sync()
    cfault.kt_test_fail(0, 0)
    assert relative_error(moe(x, ids, wt), want) < 1e-5      # still usable once the backend recovers


def test_a_failing_packer_loads_nothing(cfault, data):
    w, x, ids, wt, want = data
    moe = layer("cfault")
    cfault.kt_test_fail(1, KT_ERROR_INTERNAL)
    with pytest.raises(RuntimeError, match="packing expert weights failed: C plugin: pack_expert failed on purpose"):
        moe.load(*w)
    assert moe.packed_bytes == 0                              # all experts land or none
    cfault.kt_test_fail(0, 0)
    moe.load(*w)
    assert relative_error(moe(x, ids, wt), want) < 1e-5


def test_a_failing_whole_op_entry(monkeypatch, data):
    """A backend with moe_forward (the whole-op entry) failing, via the ctypes fake backend."""
    import sys
    import types

    from kt_core.backends import BackendDescriptor, Tier, Variant
    from kt_core.backends.discovery import Discovered

    fake = fk.FakeBackend(name="wholeop", whole_op=True)
    module = types.ModuleType("wholeop_native")
    module.backend_api = lambda variant: fake.capsule()
    monkeypatch.setitem(sys.modules, "wholeop_native", module)
    d = BackendDescriptor(name="wholeop", abi_version=(1, 1), tier=Tier.GENERIC_SIMD,
                          variants=(Variant("v1", module="wholeop_native", methods=("FP32",)),))
    sel = selection.Selector((Discovered("wholeop = test", d, None),), kt_core.host())
    monkeypatch.setattr(kt_core.moe, "selector", lambda: sel)
    w, x, ids, wt, want = data
    moe = layer("wholeop")
    moe.load(*w)
    fake.fail["moe_forward"] = KT_ERROR_OUT_OF_MEMORY
    with pytest.raises(MemoryError, match="fake moe_forward failed on purpose"):
        moe(x[:3], ids[:3], wt[:3])
    fake.fail.clear()
    assert relative_error(moe(x[:3], ids[:3], wt[:3]), want[:3]) < 1e-5


LEAK_CHECK = textwrap.dedent("""
    import resource, numpy as np, kt_core
    from kt_core import pool
    E, H, I = 16, 512, 1024                 # 6 MiB of packed FP32 per expert, 96 MiB per layer
    rng = np.random.default_rng(0)
    w = [rng.standard_normal((E, I, H), dtype=np.float32), rng.standard_normal((E, I, H), dtype=np.float32),
         rng.standard_normal((E, H, I), dtype=np.float32)]
    def live():
        return sum(n["bytes_live"] for n in pool.numa_usage())
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
    def cycle():
        m = kt_core.MoE(num_experts=E, top_k=2, hidden_size=H, intermediate_size=I, method="FP32", backend="reference")
        try:
            m.load(*w)
        except MemoryError as exc:
            del m
            return str(exc)
        raise SystemExit("loading did not fail")
    ok = kt_core.MoE(num_experts=E, top_k=2, hidden_size=H, intermediate_size=I, method="FP32", backend="reference")
    ok.load(*w)                             # pool threads and scratch exist before the limit
    ok(np.ones((4, H), np.float32), np.zeros((4, 2), np.int64), np.ones((4, 2), np.float32))
    del ok
    base_live = live()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vm + 48 * 2**20, hard))   # half a layer fits
    messages = {cycle() for _ in range(10)}
    warm = rss()
    for _ in range(100):
        cycle()
    grown = rss() - warm
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    print(json.dumps({"messages": sorted(messages), "rss_growth": grown, "live": live() - base_live}))
""").replace("import resource,", "import json, resource,")


def test_allocation_failure_while_loading_leaks_nothing():
    r = run_python(LEAK_CHECK, KT_NUM_THREADS="2")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["live"] == 0, result                      # every expert of a failed load was freed
    assert result["rss_growth"] < 16 * 2**20, result        # 100 create/fail/destroy cycles: flat
    # The MemoryError says what could not be allocated (it used to read "std::bad_alloc").
    assert result["messages"] == [f"kt could not allocate {3 * 512 * 1024 * 4} bytes (6 MiB) for NUMA node 0: "
                                  "Cannot allocate memory"], result
