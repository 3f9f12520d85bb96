"""What a gated activation kt-core applies itself costs against the kernels' own SiLU, measured in one run.

    python benchmarks/gated_activations.py [--shape gemma4-26b-a4b] [--methods BF16 INT8 INT4]
        [--tokens 1 32 512] [--threads 2] [--repeats 5]

SiLU(g)·u runs in the backend's fused gate/up tile. GELU-tanh(g)·u (Gemma 4) and the limit after SiLU
(Step-3.7, Ling-2.5) have no kernel: kt-core asks the backend for the raw gate and up products
(gate_up_raw_tile, plugin ABI 1.4) and applies the activation itself (moe_layer.cpp). Per method and
token count, three layers of the same shape and weights (one per activation) are timed alternately,
call after call in a rotating order, on the same routings (a fresh routing per round), so the host's
drift hits all three alike; the figure is each activation's median time over SiLU's. Prints `kt doctor`'s ISA line first.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import kt_core
from kt_core.testing.reference import random_moe, random_routing

SHAPES = {   # hidden, expert intermediate, experts, top-k
    "gemma4-26b-a4b": (2816, 704, 128, 8),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
}
ACTIVATIONS = {
    "silu": {},
    "gelu-tanh": {"gate_activation": "gelu_tanh"},
    "limit-after": {"swiglu_limit": 7.0, "swiglu_limit_after_act": True},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gemma4-26b-a4b")
    ap.add_argument("--methods", nargs="+", default=["BF16", "INT8", "INT4"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 32, 512])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    H, I, E, K = SHAPES[args.shape]
    host = kt_core.host()
    print(f"host: {host.brand}, {host.isa_level} ({host.physical_cores} cores)")
    kt_core.pool.configure(num_threads=args.threads)
    rng = np.random.default_rng(0)
    weights = random_moe(rng, E, H, I)
    print(f"shape {args.shape}: hidden {H}, expert intermediate {I}, {E} experts, top-{K}; {args.threads} threads")
    print(f"{'method':6} {'tokens':>6} {'backend':28} {'silu ms':>9} " + " ".join(f"{a + ' ×':>14}" for a in ACTIVATIONS
                                                                                   if a != "silu"))
    for method in args.methods:
        layers = {}
        for name, settings in ACTIVATIONS.items():
            layer = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method,
                                max_tokens=max(args.tokens), **settings)
            layer.load(*weights)
            layers[name] = layer
        for tokens in args.tokens:
            x = rng.standard_normal((tokens, H)).astype(np.float32)
            times = {name: [] for name in layers}
            order = list(layers)
            for r in range(2 + args.repeats):   # two warm-up rounds; the order rotates, no layer always first
                ids, w = random_routing(rng, tokens, E, K)
                for name in order[r % 3:] + order[:r % 3]:
                    layer = layers[name]
                    t0 = time.perf_counter()
                    layer(x, ids, w)
                    times[name].append(time.perf_counter() - t0)
            med = {name: statistics.median(t[2:]) for name, t in times.items()}
            ratios = " ".join(f"{med[a] / med['silu']:>14.3f}" for a in layers if a != "silu")
            print(f"{method:6} {tokens:>6} {layers['silu'].backend:28} {med['silu'] * 1e3:>9.2f} {ratios}", flush=True)


if __name__ == "__main__":
    main()
