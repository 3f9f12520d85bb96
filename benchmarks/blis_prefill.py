"""kt-backend-blis vs kt-backend-avx on long prefill, same weights, same run (issue #23).

    python benchmarks/blis_prefill.py [--tokens 1024 4096 8192] [--methods BF16 INT8 INT4] [--variant x86-64-v3] [--torch]

A Qwen3-30B-A3B MoE layer (hidden 2048, intermediate 768, 128 experts, top-8; rows per expert =
tokens / 16), random routing; both backends read the same packed bytes (avx packs, blis borrows).
`--variant` forces both to one target (KT_CPU_VARIANT), e.g. x86-64-v3 to see an AVX2-only host's
avx kernels on an AVX-512 machine (BLIS chooses its own kernels either way: `blis_arch` says which).
Also printed: BLIS sgemm alone, one thread, on one expert's gate+up product at the same rows,
times the thread count — the rate the BLIS side could reach with no widening or routing at all.
`--torch` adds plain torch as a third side (bf16 weights and activations, one expert at a time:
moe_layer.py's torch_moe, on the same weights rounded to bf16, same routing, same thread count); with
`--variant x86-64-v3` its oneDNN is capped at AVX2 too (ONEDNN_MAX_CPU_ISA=AVX2, unless already set).
Ratios, not absolute times, are what this noisy 2-core host can state.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--methods", nargs="+", default=["BF16", "INT8", "INT4"])
    p.add_argument("--variant", default=None, help="force both backends to this target (KT_CPU_VARIANT)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--torch", action="store_true", help="time plain torch bf16 too")
    args = p.parse_args()
    if args.variant:
        os.environ["KT_CPU_VARIANT"] = args.variant
        if args.variant == "x86-64-v3":
            os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
    os.environ["KT_BLIS_MIN_ROWS"] = "0"     # the BLIS side runs every batch itself
    import kt_core
    from kt_backend_blis import _native as blis
    from kt_core.testing.quantize import checkpoint_inputs

    H, I, E, K = 2048, 768, 128, 8
    threads = kt_core.pool.info().num_threads
    h = kt_core.host()
    print(f"host: {h.brand}, {h.isa_level} (kt doctor), {threads} threads; BLIS {blis.blis_version()} "
          f"'{blis.blis_arch()}' kernels; forced variant: {args.variant or '-'}")
    rng = np.random.default_rng(0)
    g, u, d = (rng.standard_normal(s, dtype=np.float32) * 0.02 for s in ((E, I, H), (E, I, H), (E, H, I)))
    torch_side = None
    if args.torch:
        import torch
        from moe_layer import torch_moe

        torch.set_num_threads(threads)
        tw = [torch.from_numpy(a).bfloat16() for a in (g, u, d)]

        def torch_side(x, ids, w):
            return torch_moe(torch.from_numpy(x).bfloat16(), *tw, torch.from_numpy(ids), torch.from_numpy(w))

        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
              f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '-')}")
    print(f"{'method':7s} {'tokens':>6s} {'rows/e':>6s} {'avx ms':>9s} {'blis ms':>9s} {'blis/avx':>8s} "
          f"{'blis GF/s':>9s} {'sgemm GF/s':>10s} {'% of it':>7s}"
          + (f" {'torch ms':>9s} {'torch/avx':>9s}" if args.torch else "") + "  avx kernel")
    for method in args.methods:
        parts = checkpoint_inputs(method, g, u, d, group_size=128 if method == "INT4" else 0)
        layers = {}
        for b in ("avx", "blis"):
            m = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method, backend=b,
                            max_tokens=max(args.tokens), group_size=128 if method == "INT4" else 0)
            m.load(*parts[:3], scales=parts[3])
            layers[b] = m
        for T in args.tokens:
            x = rng.standard_normal((T, H), dtype=np.float32)
            ids = np.argsort(rng.random((T, E)), axis=1)[:, :K].astype(np.int64)
            w = np.full((T, K), 1 / K, np.float32)
            ms = {}
            sides = dict(layers)
            if torch_side is not None:
                sides["torch"] = torch_side
            for b, m in sides.items():
                m(x, ids, w)
                best = 1e30
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    m(x, ids, w)
                    best = min(best, time.perf_counter() - t)
                ms[b] = best * 1e3
            flops = T * K * 3 * H * I * 2
            rows = T * K // E
            sgemm = 2 * rows * 2 * I * H / blis.sgemm_seconds(rows, 2 * I, H, 3) * threads * 1e-9
            rate = flops / ms["blis"] * 1e-6
            print(f"{method:7s} {T:6d} {rows:6d} {ms['avx']:9.1f} {ms['blis']:9.1f} {ms['avx'] / ms['blis']:8.2f} "
                  f"{rate:9.1f} {sgemm:10.1f} {100 * rate / sgemm:6.0f}%"
                  + (f" {ms['torch']:9.1f} {ms['torch'] / ms['avx']:9.2f}" if torch_side else "")
                  + f"  {layers['avx'].kernel_id}")
            sys.stdout.flush()
        del layers
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
