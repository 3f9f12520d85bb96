"""One MoE layer's forward, repeated: the loop to put under `perf record` (or to time one change
against another build, alternating interpreters), with nothing else in the process worth sampling
after the set-up.

    python benchmarks/layer_forward.py --method INT8 --tokens 1024 [--experts 32 --top-k 2]
        [--threads 1] [--repeats 200] [--fast-activations]
    perf record -o int8.data python benchmarks/layer_forward.py --method INT8 --repeats 200

Default shape: Qwen3-30B-A3B's expert size (hidden 2048, intermediate 768) with 32 experts top-2,
so 1024 tokens give 64 rows per expert, as 128 experts top-8 do, at a quarter of the weights.
Checkpoint formats (RAWINT4, FP8, NVFP4, ...) are packed from codes made by kt_core.testing.quantize.
Prints the backend's kernel id, ms per forward (mean over the repeats) and GMAC/s of the
layer's products.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kt_core import MoE, pool
from kt_core.testing.quantize import checkpoint_arrays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="INT8")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--fast-activations", action="store_true")
    a = ap.parse_args()
    if a.top_k > a.experts:
        raise SystemExit(f"--top-k {a.top_k} exceeds --experts {a.experts}")

    pool.configure(num_threads=a.threads)
    E, K, H, I = a.experts, a.top_k, a.hidden, a.intermediate
    rng = np.random.default_rng(0)
    w = [rng.standard_normal((E, I, H), dtype=np.float32) * 0.02, rng.standard_normal((E, I, H), dtype=np.float32) * 0.02,
         rng.standard_normal((E, H, I), dtype=np.float32) * 0.02]
    m = MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=a.method, max_tokens=a.tokens,
            fast_activations=a.fast_activations)
    gate, up, down, scales, zeros = checkpoint_arrays(a.method, *w)   # the floats back for methods that quantize at load
    m.load(gate, up, down, scales=scales, zeros=zeros)
    x = rng.standard_normal((a.tokens, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(a.tokens)]).astype(np.int64)
    weights = np.full((a.tokens, K), 1.0 / K, np.float32)
    for _ in range(2):
        m(x, ids, weights)
    t0 = time.perf_counter()
    for _ in range(a.repeats):
        m(x, ids, weights)
    dt = (time.perf_counter() - t0) / a.repeats
    macs = a.tokens * K * 3 * H * I
    print(f"{a.method} {m.backend} {m.kernel_id_for(a.tokens)} tokens={a.tokens} threads={a.threads}: "
          f"{dt * 1e3:.2f} ms, {macs / dt / 1e9:.1f} GMAC/s")


if __name__ == "__main__":
    main()
