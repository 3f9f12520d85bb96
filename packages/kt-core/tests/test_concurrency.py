"""Many Python threads on kt at once, the async submit/sync path misused, fork() and exit with
work in flight (issue #9, docs/reliability.md "Concurrency").

Forwards are bit-identical from call to call (fixed summation order), so every output here is
compared exactly with the same forward run alone: a race shows as a differing bit, not as a
tolerance. The pool runs 4 threads in 2 virtual NUMA groups on whatever cores there are, so
loops are preempted mid-body and groups steal from each other even on a 2-core machine.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time

import numpy as np
import pytest

import kt_core
from kt_core import _native, pool
from kt_core.testing.reference import random_moe, random_routing

from conftest import run_python

E, H, I, K = 8, 256, 128, 2    # 64 tokens x 2 slots: above the serial threshold (pooled path)
THREADS = 4


@pytest.fixture(scope="module", autouse=True)
def oversubscribed_pool():
    pool.configure(num_threads=4, virtual_numa=2, pin=False, spin_us=20)
    yield
    pool.configure()


class Case:
    """A loaded layer, a few inputs and each input's output computed alone."""

    def __init__(self, seed: int, tokens=(64, 1, 7), method="BF16"):
        rng = np.random.default_rng(seed)
        self.weights = random_moe(rng, E, H, I)
        self.layer = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method)
        self.layer.load(*self.weights)
        self.inputs = []
        for t in tokens:
            x = rng.standard_normal((t, H)).astype(np.float32)
            ids, w = random_routing(rng, t, E, K)
            self.inputs.append((x, ids, w))
        self.want = [self.layer(*inp) for inp in self.inputs]

    def check(self, i, got):
        np.testing.assert_array_equal(got, self.want[i])


def run_threads(target, count=THREADS):
    """Start `count` threads at a barrier; re-raise the first failure on this thread."""
    barrier = threading.Barrier(count)
    errors = []

    def body(k):
        try:
            barrier.wait()
            target(k)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread is still running after 120 s: deadlock"
    if errors:
        raise errors[0]


def test_threads_drive_different_layers():
    cases = [Case(s) for s in range(THREADS)]

    def drive(k):
        c = cases[k]
        for it in range(15):
            i = it % len(c.inputs)
            c.check(i, c.layer(*c.inputs[i]))

    run_threads(drive)


def test_threads_drive_the_same_layer():
    """Serialised: each thread gets exactly the output its own input gives alone."""
    c = Case(10, tokens=(64, 1, 7, 33))

    def drive(k):
        for it in range(15):
            i = (it + k) % len(c.inputs)
            c.check(i, c.layer(*c.inputs[i]))

    run_threads(drive)


def test_reloading_a_layer_while_other_threads_forward_it():
    """Reloads install the new packed weights under the forward lock (they raced the forwards'
    reads before). Reloading the same values keeps every output exact."""
    c = Case(11)
    gate, up, down = c.weights

    def drive(k):
        for it in range(12):
            if k == 0:
                e = it % E
                if it % 2:
                    c.layer.load_expert(e, gate[e], up[e], down[e])
                else:
                    c.layer.load_experts({e: (gate[e], up[e], down[e])})
            else:
                i = (it + k) % len(c.inputs)
                c.check(i, c.layer(*c.inputs[i]))

    run_threads(drive)


def test_racing_submits_one_wins_the_others_are_refused_clearly():
    """One forward may be in flight per process: of threads submitting at once (different
    layers or the same one), the losers get a RuntimeError saying so; every winner's sync
    returns its exact output."""
    cases = [Case(20 + s) for s in range(2)]
    wins, refusals = [0] * THREADS, [0] * THREADS

    def drive(k):
        c = cases[k % 2]
        for attempt in range(10_000):   # until this thread has won 6 times
            i = (attempt + k) % len(c.inputs)
            try:
                c.layer.submit(*c.inputs[i])
            except RuntimeError as e:
                assert "already submitted" in str(e)
                refusals[k] += 1
                time.sleep(0.0005)
                continue
            wins[k] += 1
            c.check(i, c.layer.sync())
            if wins[k] == 6:
                return

    run_threads(drive)
    assert wins == [6] * THREADS, (wins, refusals)
    assert sum(refusals) > 0, "no submit was ever refused: the race was not exercised"
    assert not _native.pool_job_pending()


def test_submit_while_another_layer_has_work_in_flight():
    a, b = Case(30), Case(31)
    a.layer.submit(*a.inputs[0])
    with pytest.raises(RuntimeError, match="already submitted; call sync_forward"):
        b.layer.submit(*b.inputs[0])
    b.check(1, b.layer(*b.inputs[1]))   # a plain forward waits for the submitted one
    a.check(0, a.layer.sync())
    b.layer.submit(*b.inputs[2])
    b.check(2, b.layer.sync())


def test_sync_twice_and_sync_without_submit():
    c = Case(40)
    with pytest.raises(RuntimeError, match="without a submitted forward"):
        c.layer.sync()
    c.layer.submit(*c.inputs[0])
    c.check(0, c.layer.sync())
    with pytest.raises(RuntimeError, match="without a submitted forward"):
        c.layer.sync()


def test_sync_on_another_thread_than_submit():
    c = Case(41)
    got = []
    c.layer.submit(*c.inputs[0])
    t = threading.Thread(target=lambda: got.append(c.layer.sync()))
    t.start()
    t.join(timeout=60)
    assert got, "sync on another thread did not return"
    c.check(0, got[0])


def test_wrapper_submit_without_sync_then_submit_again():
    """KTMoEWrapper's async pair: a second submit_forward before sync_forward is refused, the
    first one's result is intact."""
    c = Case(42)
    gate, up, down = c.weights
    w = kt_core.KTMoEWrapper(layer_idx=0, num_experts=E, num_experts_per_tok=K, hidden_size=H, moe_intermediate_size=I,
                             gpu_experts_mask=None, cpuinfer_threads=None, threadpool_count=1, weight_path=None,
                             chunked_prefill_size=4096, method="BF16")
    w.load_weights_from_tensors(gate, up, down)
    x, ids, wt = c.inputs[0]
    want = w.forward(x, ids, wt)
    w.submit_forward(x, ids, wt)
    with pytest.raises(RuntimeError, match="already submitted"):
        w.submit_forward(x, ids, wt)
    np.testing.assert_array_equal(w.sync_forward(x), want)


def test_dropping_a_layer_with_work_in_flight():
    """The dropped layer's forward is waited for, so the pool's job slot is free again (it
    stayed taken for good before: nobody could sync it, every later submit was refused)."""
    doomed, other = Case(50), Case(51)
    doomed.layer.submit(*doomed.inputs[0])
    del doomed
    gc.collect()
    assert not _native.pool_job_pending()
    other.layer.submit(*other.inputs[0])
    other.check(0, other.layer.sync())


def test_pool_reconfigured_while_another_thread_forwards():
    """pool.configure() waits for forwards in flight instead of freeing the pool under them
    (it did: the forward kept a reference to the replaced pool). In a subprocess, so a crash
    fails this test only."""
    r = run_python("""
import threading, numpy as np, kt_core
from kt_core.testing.reference import random_moe, random_routing
rng = np.random.default_rng(0)
m = kt_core.MoE(num_experts=8, top_k=2, hidden_size=256, intermediate_size=256, method="BF16")
m.load(*random_moe(rng, 8, 256, 256))
x = rng.standard_normal((64, 256)).astype(np.float32)
ids, w = random_routing(rng, 64, 8, 2)
want = m(x, ids, w)
stop, bad, runs = threading.Event(), [], [0]
def spin():
    while not stop.is_set():
        if not np.array_equal(m(x, ids, w), want):
            bad.append(1)
        runs[0] += 1
t = threading.Thread(target=spin)
t.start()
for i in range(30):
    kt_core.pool.configure(num_threads=1 + i % 4, virtual_numa=i % 3, pin=False, spin_us=i % 2 * 50)
stop.set()
t.join()
print("forwards", runs[0], "bad", len(bad), flush=True)
assert not bad and runs[0] > 0
""")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]


EXIT_SCRIPT = """
import sys, numpy as np, kt_core
from kt_core.testing.reference import random_moe, random_routing
rng = np.random.default_rng(0)
m = kt_core.MoE(num_experts=8, top_k=2, hidden_size=256, intermediate_size=256, method="BF16")
m.load(*random_moe(rng, 8, 256, 256))
x = rng.standard_normal((64, 256)).astype(np.float32)
ids, w = random_routing(rng, 64, 8, 2)
m.submit(x, ids, w)
if sys.argv[-1] == "drop":
    del m
print("exiting", flush=True)
"""


@pytest.mark.parametrize("how", ["keep", "drop"])
def test_process_exit_with_work_in_flight(how, tmp_path):
    """Exit with a submitted, never synced forward: a clean exit (it aborted with 'Fatal Python
    error: PyThreadState_Get' when the pinned objects were released after finalization)."""
    import subprocess

    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KT_")}
    r = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "exiting"
    assert "leaked" not in r.stderr and "Fatal" not in r.stderr, r.stderr[-2000:]


FORK_SCRIPT = """
import os, sys, time, numpy as np, kt_core
from kt_core.testing.reference import random_moe, random_routing
kt_core.pool.configure(num_threads=4, pin=False)
rng = np.random.default_rng(0)
m = kt_core.MoE(num_experts=8, top_k=2, hidden_size=256, intermediate_size=256, method="BF16")
m.load(*random_moe(rng, 8, 256, 256))
x = rng.standard_normal((64, 256)).astype(np.float32)
ids, w = random_routing(rng, 64, 8, 2)
want = m(x, ids, w)
pending = sys.argv[-1] == "pending"
if pending:
    m.submit(x, ids, w)
pid = os.fork()
if pid == 0:
    if pending:
        try:
            m.sync()
            print("child: sync of the parent's forward returned", flush=True)
        except RuntimeError as e:
            print("child refused:", e, flush=True)
    ok = np.array_equal(m(x, ids, w), want)
    m.submit(x, ids, w)
    ok = ok and np.array_equal(m.sync(), want)
    ok = ok and kt_core.pool.info().num_threads == 4
    print("child ok" if ok else "child WRONG", flush=True)
    sys.exit(0 if ok else 1)   # a full exit: static destructors join the child's pool
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("child hung", flush=True)
    sys.exit(2)
print("child status", os.waitstatus_to_exitcode(status), flush=True)
if pending:
    assert np.array_equal(m.sync(), want)
assert np.array_equal(m(x, ids, w), want)
print("parent ok", flush=True)
"""


@pytest.mark.parametrize("pending", ["idle", "pending"])
def test_fork_after_the_pool_started(pending, tmp_path):
    """The child gets a fresh pool (submit+sync hung there before, and so did exit); a forward
    submitted before fork() is refused clearly in the child and synced normally in the parent."""
    import subprocess

    script = tmp_path / "fork.py"
    script.write_text(FORK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KT_")}
    r = subprocess.run([sys.executable, str(script), pending], capture_output=True, text=True, timeout=150, env=env)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert "child ok" in lines and "child status 0" in lines and "parent ok" in lines, r.stdout
    if pending == "pending":
        assert any(line.startswith("child refused:") and "fork()" in line for line in lines), r.stdout


def test_exit_with_a_daemon_thread_mid_forward():
    """Interpreter exit while a daemon thread is inside forwards: a clean exit. CPython < 3.14
    ends such a thread with pthread_exit() when it takes the GIL back, which aborted the
    process ('terminate called without an active exception'); it now parks instead."""
    r = run_python("""
import threading, numpy as np, kt_core
from kt_core.testing.reference import random_moe, random_routing
rng = np.random.default_rng(0)
m = kt_core.MoE(num_experts=8, top_k=2, hidden_size=256, intermediate_size=256, method="BF16")
m.load(*random_moe(rng, 8, 256, 256))
x = rng.standard_normal((64, 256)).astype(np.float32)
ids, w = random_routing(rng, 64, 8, 2)
started = threading.Event()
def spin():
    started.set()
    while True:
        m(x, ids, w)
threading.Thread(target=spin, daemon=True).start()
started.wait()
print("exiting", flush=True)
""")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "exiting"
    assert "terminate" not in r.stderr and "leaked" not in r.stderr, r.stderr[-2000:]
