"""Decode's two ceilings, per method: what kt's kernels stream when memory is not the limit, and
what the machine reads, each next to kt's real 1-token decode in one process.

    .venv/bin/python benchmarks/decode_ceiling.py [--methods BF16 INT8 INT4 RAWINT4 FP8]
        [--threads 1 2] [--rounds 6] [--json results/decode_ceiling.json]

Per method:
  - core ceiling: one thread's 1-token forwards over the same 8 experts of hidden x 128 (a few
    MiB, cache-resident), the best of 3 x --rounds batches spread over seconds: what the kernels
    stream per core when memory is not the limit, in weight bytes per second;
and per thread count, in rounds (the machine is shared and its bandwidth drifts within minutes,
so each probe is taken right before its decode batch and the ratio is per round):
  - probe: the pool's threads summing a 512 MiB buffer (kt_core's read-bandwidth probe, huge
    pages like the weights);
  - decode: 1-token forwards over --experts experts of hidden x intermediate (far larger than the
    L3), a fresh top-8 per call: the real decode, weight bytes per second of the median call.
A method whose core ceiling sits near the probe's share per thread cannot reach the probe in
decode: every load has to overlap its arithmetic. Weights are random (the rate does not depend
on their values), 16 distinct experts copied into every slot.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import kt_core
from kt.bench.runner import _expert_weights
from kt_core import _native

TOP_K = 8


def build_layer(method: str, experts: int, hidden: int, inter: int, rng) -> kt_core.MoE:
    layer = kt_core.MoE(num_experts=experts, top_k=TOP_K, hidden_size=hidden, intermediate_size=inter, method=method,
                        max_tokens=8)
    sources = [_expert_weights(rng, method, hidden, inter) for _ in range(min(experts, 16))]
    for e in range(experts):
        g, u, d, scales, zeros = sources[e % len(sources)]
        layer.load_expert(e, g, u, d, scales, zeros)
    return layer


def decode_gbps(layer: kt_core.MoE, calls: list, x, w) -> float:
    """Weight bytes per second of the median call (each call reads TOP_K whole experts)."""
    times = []
    for ids in calls:
        t0 = time.perf_counter()
        layer(x, ids, w)
        times.append(time.perf_counter() - t0)
    return TOP_K * layer.expert_bytes / statistics.median(times) / 1e9


def ceiling(method: str, args, rng) -> float:
    """One core's decode rate on cache-resident experts: the kernels alone, memory aside."""
    kt_core.pool.configure(num_threads=1)
    small = build_layer(method, TOP_K, args.hidden, 128, rng)
    x, w = inputs(args, rng)
    same = [torch.arange(TOP_K)[None]] * args.calls
    decode_gbps(small, same, x, w)   # warm-up
    # A batch lasts milliseconds, so one burst of a neighbour's load could hide every one of
    # them: the batches are spread over a few seconds, and the best counts (noise only slows).
    best = 0.0
    for _ in range(3 * args.rounds):
        best = max(best, decode_gbps(small, same, x, w))
        time.sleep(0.2)
    return best


def inputs(args, rng):
    # bf16 torch tensors, as a server passes them: they go to the kernels as addresses.
    x = torch.from_numpy(rng.standard_normal((1, args.hidden)).astype(np.float32)).to(torch.bfloat16)
    return x, torch.full((1, TOP_K), 1.0 / TOP_K)


def measure(method: str, threads: int, args, rng) -> dict:
    kt_core.pool.configure(num_threads=threads)
    large = build_layer(method, args.experts, args.hidden, args.intermediate, rng)
    x, w = inputs(args, rng)
    fresh = [torch.from_numpy(rng.choice(args.experts, TOP_K, replace=False)[None]) for _ in range(args.calls)]
    decode_gbps(large, fresh, x, w)   # warm-up
    rounds = []
    for _ in range(args.rounds):
        probe = statistics.median(_native.bench_read_bandwidth(512 << 20, 3))
        rounds.append({"probe_gbps": probe, "decode_gbps": decode_gbps(large, fresh, x, w)})
    return {"method": method, "threads": threads, "backend": large.backend, "kernel_id": large.kernel_id,
            "expert_bytes": large.expert_bytes,
            "median_probe_gbps": statistics.median(r["probe_gbps"] for r in rounds),
            "median_decode_gbps": statistics.median(r["decode_gbps"] for r in rounds),
            "decode_share_of_probe": statistics.median(r["decode_gbps"] / r["probe_gbps"] for r in rounds),
            "rounds": rounds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=["BF16", "INT8", "INT4", "RAWINT4", "FP8"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--calls", type=int, default=60, help="forwards per batch")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    h = kt_core.host()
    result = {"machine": {"cpu": h.brand, "isa_level": h.isa_level, "python": platform.python_version(),
                          "kt_core": kt_core.__version__},
              "config": {k: v for k, v in vars(args).items() if k != "json"}, "ceilings": {}, "rows": []}
    print(f"{h.brand} ({h.isa_level}); layer {args.experts} x (hidden {args.hidden}, intermediate {args.intermediate}), "
          f"1 token, top-{TOP_K}; medians of {args.rounds} rounds")
    print(f"{'method':8s} {'core ceiling':>12s} {'threads':>7s} {'probe':>6s} {'per thread':>10s} {'decode':>6s} "
          f"{'decode/probe':>12s}   (GB/s of weights read)")
    rng = np.random.default_rng(args.seed)
    for method in args.methods:
        core = ceiling(method, args, rng)
        result["ceilings"][method] = core
        for threads in args.threads:
            r = measure(method, threads, args, rng)
            result["rows"].append(r)
            print(f"{method:8s} {core:12.1f} {threads:7d} {r['median_probe_gbps']:6.1f} "
                  f"{r['median_probe_gbps'] / threads:10.1f} {r['median_decode_gbps']:6.1f} "
                  f"{100 * r['decode_share_of_probe']:11.0f}%", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
