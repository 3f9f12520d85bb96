"""Measure where BLIS beats kt-backend-avx on this host and keep it (crossover.py's file).

    python -m kt_backend_blis.calibrate [--hidden 2048 --intermediate 768] [--rows 16 32 ... 1024]

For each method, one layer of 8 experts with top-8 routing (every token reaches every expert, so
rows per expert = tokens) is run through kt-backend-blis and through kt-backend-avx on the same
packed weights, median of --repeats; BLIS serves a method from the smallest measured row count at
which it is at least --margin faster and stays faster at every larger count, and never if there
is none. The default shape is a Qwen3-30B-A3B expert; a model of another shape can be measured
with its own. Uses kt-core's thread pool as configured (KT_NUM_THREADS, as when serving).
"""

from __future__ import annotations

import argparse
import os
import time

METHODS = ("BF16", "INT8", "INT4", "RAWINT4", "FP8", "FP8_PERCHANNEL", "MXFP4", "GPTQ_INT4")


def _layer_pair(method: str, hidden: int, intermediate: int, max_tokens: int, seed: int = 0):
    import numpy as np

    from kt_core import MoE
    from kt_core.formats.codes import int4_group_for
    from kt_core.testing.quantize import checkpoint_inputs
    from kt_core.testing.reference import random_moe

    experts = 8
    group = int4_group_for(hidden, intermediate) if method in ("INT4", "GPTQ_INT4") else 0
    gate, up, down, scales = checkpoint_inputs(method, *random_moe(np.random.default_rng(seed), experts, hidden,
                                                                  intermediate), group_size=group)
    blis = MoE(num_experts=experts, top_k=experts, hidden_size=hidden, intermediate_size=intermediate, method=method,
               max_tokens=max_tokens, backend="blis", group_size=group)
    blis.load(gate, up, down, scales=scales)
    avx = MoE(num_experts=experts, top_k=experts, hidden_size=hidden, intermediate_size=intermediate, method=method,
              max_tokens=max_tokens, backend="avx", group_size=group)
    avx.load(gate, up, down, scales=scales)
    return blis, avx


def _median_ms(layer, x, ids, w, repeats: int) -> float:
    layer(x, ids, w)   # warm-up: scratch and caches
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        layer(x, ids, w)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3


def measure(methods, hidden: int, intermediate: int, rows_list, repeats: int, log=print) -> list[dict]:
    import numpy as np
    rng = np.random.default_rng(1)
    out = []
    for method in methods:
        blis, avx = _layer_pair(method, hidden, intermediate, max(rows_list))
        for rows in rows_list:
            x = rng.standard_normal((rows, hidden), dtype=np.float32)
            ids = np.tile(np.arange(8, dtype=np.int64), (rows, 1))
            w = np.full((rows, 8), 1 / 8, np.float32)
            b, a = _median_ms(blis, x, ids, w, repeats), _median_ms(avx, x, ids, w, repeats)
            row = {"method": method, "rows": rows, "blis_ms": round(b, 3), "avx_ms": round(a, 3),
                   "avx_kernel": avx.kernel_id, "speedup": round(a / b, 3)}
            log(f"  {method:15s} {rows:5d} rows/expert: blis {b:9.2f} ms  avx {a:9.2f} ms  blis x{a / b:.2f}")
            out.append(row)
        del blis, avx
    return out


def crossover(measured: list[dict], margin: float) -> dict[str, int | None]:
    """Per method: the smallest row count from which BLIS is faster by `margin` at every count."""
    result = {}
    for method in dict.fromkeys(r["method"] for r in measured):
        rows = sorted((r for r in measured if r["method"] == method), key=lambda r: r["rows"])
        start = None
        for r in reversed(rows):
            if r["speedup"] < 1 + margin:
                break
            start = r["rows"]
        result[method] = start
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kt_backend_blis.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--margin", type=float, default=0.05, help="how much faster BLIS must be (0.05: 5%%)")
    p.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
    args = p.parse_args(argv)
    # Both sides must run every batch on their own kernels while measuring.
    os.environ["KT_BLIS_MIN_ROWS"] = "0"
    from kt_core.backends import selection
    selection.reset()
    from kt_core import host

    from . import crossover as store
    print(f"kt-backend-blis calibration on {host().brand} ({host().isa_level}), BLIS "
          f"{__import__('kt_backend_blis._native', fromlist=['x']).blis_arch()} kernels; "
          f"layer {args.hidden} x {args.intermediate}, 8 experts, top-8")
    measured = measure(args.methods, args.hidden, args.intermediate, args.rows, args.repeats)
    table = crossover(measured, args.margin)
    for method, rows in table.items():
        print(f"  {method:15s} BLIS from {rows} rows per expert" if rows is not None else
              f"  {method:15s} BLIS never faster: kt-backend-avx serves it")
    if not args.dry_run:
        previous, _ = store._calibrated()
        merged = {**(previous or dict.fromkeys(METHODS)), **table}
        settings = {"hidden": args.hidden, "intermediate": args.intermediate, "repeats": args.repeats,
                    "margin": args.margin}
        print(f"wrote {store.save(merged, measured, settings)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
