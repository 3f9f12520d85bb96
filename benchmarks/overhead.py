"""Fixed costs of kt-core: the pool's fork-join and one MoE forward on a tiny shape.

    .venv/bin/python benchmarks/overhead.py [--json results/overhead.json]

Reported in the same run, so ratios hold on a noisy machine:
  - fork-join: µs per empty parallel loop (one task per thread), kt's pool vs a
    concurrent.futures.ThreadPoolExecutor doing the same fork-join from Python;
  - MoE per-call: µs per forward of a tiny layer (4 experts, hidden 32, intermediate 16,
    1 token, top-2) through kt_core.MoE, vs the same arithmetic in NumPy.
Medians of repeated batches; spread = (max - min) / median over the batches.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import kt_core
from kt_core import _native
from kt_core.testing.reference import random_moe, random_routing


def batches(fn, per_batch: int, repeats: int = 7) -> tuple[float, float]:
    """(median, spread) of µs per call."""
    results = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            fn()
        results.append((time.perf_counter() - t0) / per_batch * 1e6)
    med = statistics.median(results)
    return med, (max(results) - min(results)) / med


def fork_join(threads: int) -> dict:
    kt_core.pool.configure(num_threads=threads)
    kt_runs = [_native.bench_fork_join(20000, threads) for _ in range(7)]
    executor = ThreadPoolExecutor(max_workers=threads)
    noop = lambda: None  # noqa: E731

    def python_fork_join():
        for f in [executor.submit(noop) for _ in range(threads)]:
            f.result()

    py_med, py_spread = batches(python_fork_join, 2000)
    executor.shutdown()
    kt_med = statistics.median(kt_runs)
    return {"threads": threads, "kt_us": kt_med, "kt_spread": (max(kt_runs) - min(kt_runs)) / kt_med,
            "threadpoolexecutor_us": py_med, "threadpoolexecutor_spread": py_spread, "ratio": py_med / kt_med}


def moe_call(threads: int) -> dict:
    kt_core.pool.configure(num_threads=threads)
    rng = np.random.default_rng(0)
    gate, up, down = random_moe(rng, 4, 32, 16)
    layer = kt_core.MoE(num_experts=4, top_k=2, hidden_size=32, intermediate_size=16, method="FP32", backend="reference")
    layer.load(gate, up, down)
    x = rng.standard_normal((1, 32)).astype(np.float32)
    ids, w = random_routing(rng, 1, 4, 2)

    def numpy_moe():
        acc = np.zeros(32, dtype=np.float32)
        for j in range(2):
            e = ids[0, j]
            a = gate[e] @ x[0]
            acc += w[0, j] * (down[e] @ (a / (1 + np.exp(-a)) * (up[e] @ x[0])))
        return acc

    kt_med, kt_spread = batches(lambda: layer(x, ids, w), 2000)
    np_med, np_spread = batches(numpy_moe, 2000)
    return {"threads": threads, "kt_us": kt_med, "kt_spread": kt_spread, "numpy_us": np_med, "numpy_spread": np_spread,
            "ratio": np_med / kt_med}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write results here")
    args = parser.parse_args()
    cores = kt_core.host().physical_cores
    threads = sorted({1, cores})
    result = {
        "machine": {"cpu": kt_core.host().brand, "isa_level": kt_core.host().isa_level, "physical_cores": cores,
                    "python": platform.python_version()},
        "fork_join": [fork_join(t) for t in threads],
        "moe_call": [moe_call(t) for t in threads],
    }
    print(f"machine: {result['machine']}")
    for r in result["fork_join"]:
        print(f"fork-join, {r['threads']} thread(s): kt {r['kt_us']:.2f} µs (±{r['kt_spread']:.0%}), "
              f"ThreadPoolExecutor {r['threadpoolexecutor_us']:.2f} µs -> kt {r['ratio']:.1f}x faster")
    for r in result["moe_call"]:
        print(f"MoE forward (E=4, H=32, I=16, T=1, k=2), {r['threads']} thread(s): kt {r['kt_us']:.2f} µs "
              f"(±{r['kt_spread']:.0%}), NumPy {r['numpy_us']:.2f} µs -> ratio {r['ratio']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
