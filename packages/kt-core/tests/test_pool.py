import time

import numpy as np
import pytest

import kt_core
from kt_core import _native, pool
from kt_core.testing.reference import moe_reference, random_moe, random_routing, relative_error

from conftest import run_python


def test_default_pool_uses_physical_cores():
    result = run_python("import kt_core; i = kt_core.pool.info(); print(i.num_threads, len(i.groups))")
    assert result.returncode == 0, result.stderr
    threads, groups = map(int, result.stdout.split())
    assert threads == kt_core.host().physical_cores
    assert groups == len(kt_core.host().numa_nodes)


def test_virtual_numa_splits_groups_and_shards_experts():
    code = """
import numpy as np, kt_core
from kt_core.testing.reference import random_moe, random_routing, moe_reference, relative_error
kt_core.pool.configure(num_threads=2, virtual_numa=2)
info = kt_core.pool.info()
assert len(info.groups) == 2 and [g[1] for g in info.groups] == [1, 1], info
rng = np.random.default_rng(0)
w = random_moe(rng, 8, 32, 16)
m = kt_core.MoE(num_experts=8, top_k=3, hidden_size=32, intermediate_size=16, method="FP32", backend="reference")
m.load(*w)
assert [m.expert_group(e) for e in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
x = rng.standard_normal((50, 32)).astype(np.float32)
ids, wt = random_routing(rng, 50, 8, 3)
print(relative_error(m(x, ids, wt), moe_reference(x, *w, ids, wt)))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) < 1e-6


def test_reconfigure_and_single_thread():
    pool.configure(num_threads=1)
    assert pool.info().num_threads == 1
    rng = np.random.default_rng(1)
    w = random_moe(rng, 4, 32, 16)
    m = kt_core.MoE(num_experts=4, top_k=2, hidden_size=32, intermediate_size=16, method="FP32", backend="reference")
    m.load(*w)
    x = rng.standard_normal((5, 32)).astype(np.float32)
    ids, wt = random_routing(rng, 5, 4, 2)
    m.submit(x, ids, wt)                       # with no worker, sync() runs the job itself
    assert relative_error(m.sync(), moe_reference(x, *w, ids, wt)) < 1e-6
    pool.configure()
    assert pool.info().num_threads == kt_core.host().physical_cores


def test_submit_releases_the_gil():
    """Python keeps running while a submitted forward computes."""
    pool.configure()
    if pool.info().num_threads < 2:
        pytest.skip("needs a worker thread")
    rng = np.random.default_rng(2)
    w = random_moe(rng, 8, 512, 256)
    m = kt_core.MoE(num_experts=8, top_k=8, hidden_size=512, intermediate_size=256, method="FP32", backend="reference")
    m.load(*w)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    ids, wt = random_routing(rng, 64, 8, 8)
    m.submit(x, ids, wt)
    ticks = 0
    while _native.pool_job_pending() and ticks < 10_000_000:
        ticks += 1                          # pure-Python work: only possible without the GIL held
        if ticks % 1000 == 0 and not _native.pool_job_pending():
            break
    out = m.sync()
    assert ticks > 0
    assert out.shape == (64, 512)


def test_submit_twice_is_refused():
    rng = np.random.default_rng(3)
    w = random_moe(rng, 4, 64, 32)
    m = kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="FP32", backend="reference")
    m.load(*w)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    ids, wt = random_routing(rng, 3, 4, 2)
    m.submit(x, ids, wt)
    with pytest.raises(RuntimeError, match="already submitted"):
        m.submit(x, ids, wt)
    m.sync()
    with pytest.raises(RuntimeError, match="without a submitted forward"):
        m.sync()


def test_fork_join_overhead_is_measurable():
    # Not a timing assertion: the microbenchmark must run and return a positive figure.
    assert _native.bench_fork_join(1000, pool.info().num_threads) > 0


def test_idle_pool_does_not_spin():
    import resource

    pool.configure()
    _native.bench_fork_join(10, 2)
    time.sleep(0.05)                         # past the spin window
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(0.5)
    after = resource.getrusage(resource.RUSAGE_SELF)
    busy = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert busy < 0.1, f"idle pool used {busy:.2f} s of CPU in 0.5 s"


def test_spin_window_comes_from_kt_spin_us():
    code = "import kt_core; from kt_core import _native; kt_core.pool.ensure(); print(_native.pool_info()['spin_us'])"
    assert run_python(code).stdout.split() == ["100"]
    result = run_python(code, KT_SPIN_US="5000")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["5000"]
    for bad, message in (("-1", "must be in [0, 10000000]"), ("99999999999", "must be in [0, 10000000]"),
                         ("2ms", "must be an integer")):
        result = run_python(code, KT_SPIN_US=bad)
        assert result.returncode != 0 and message in result.stderr, result.stderr
