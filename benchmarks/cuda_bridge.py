"""A hybrid MoE layer step on a GPU, with and without kt-cuda's stream bridge, in one run.

Per step: the GPU runs `gpu_work` (a stand-in for attention and the GPU experts: a few
matmuls) and kt runs the CPU experts of the same tokens. Without the bridge the CPU forward
is copied and run synchronously (the GPU idles while the CPU works); with it, submit/sync
are stream operations and the GPU work overlaps the CPU experts. Prints ms per step and the
ratio (synchronous / bridge, above 1 = the bridge is faster), and `kt doctor`'s CPU line.

    python benchmarks/cuda_bridge.py [--tokens 1 8 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import kt_core
from kt_core import KTMoEWrapper, device_bridge

E, K, H, I = 64, 8, 2048, 768   # a Qwen3-30B-A3B layer cut to 64 experts


def make_layer(layer_idx):
    g = torch.Generator().manual_seed(layer_idx)
    w = [(torch.randn(E, *s, generator=g) / s[1] ** 0.5).bfloat16() for s in ((I, H), (I, H), (H, I))]
    kt = KTMoEWrapper(layer_idx=layer_idx, num_experts=E, num_experts_per_tok=K, hidden_size=H, moe_intermediate_size=I,
                      chunked_prefill_size=512, method="BF16")
    kt.load_weights_from_tensors(*w)
    return kt


def step(kt, x, ids, w, stream, a, sync_path):
    if sync_path:
        out = kt.forward(x.cpu(), ids.cpu().long(), w.cpu()).to(x.device)
        with torch.cuda.stream(stream):
            for _ in range(4):
                a = a @ a
        return out + 0
    kt.submit_forward(x, ids, w, stream.cuda_stream)
    other = torch.cuda.current_stream()
    for _ in range(4):
        a = a @ a
    out = kt.sync_forward(x, stream.cuda_stream)
    other.wait_stream(stream)
    return out + 0


def timed(fn, repeats=20):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--json")
    args = ap.parse_args()
    if device_bridge.provider("cuda") is None:
        raise SystemExit("kt-cuda is not usable here: " + "; ".join(r[3] for r in device_bridge.report()))
    h = kt_core.host()
    print(f"CPU: {h.brand} ({h.isa_level}, {h.physical_cores} cores); GPU: {torch.cuda.get_device_name()}")
    kt = make_layer(0)
    a = torch.randn(1024, 1024, device="cuda") / 32
    stream = torch.cuda.Stream()
    rows = []
    for tokens in args.tokens:
        x = torch.randn(tokens, H, device="cuda").bfloat16()
        ids = torch.stack([torch.randperm(E)[:K] for _ in range(tokens)]).cuda()
        w = torch.softmax(torch.randn(tokens, K, device="cuda"), dim=-1)
        sync_ms = timed(lambda x=x, ids=ids, w=w: step(kt, x, ids, w, stream, a, True))
        bridge_ms = timed(lambda x=x, ids=ids, w=w: step(kt, x, ids, w, stream, a, False))
        rows.append({"tokens": tokens, "synchronous_ms": sync_ms, "bridge_ms": bridge_ms, "ratio": sync_ms / bridge_ms})
        print(f"{tokens:5d} tokens: synchronous {sync_ms:8.3f} ms, bridge {bridge_ms:8.3f} ms, ratio {sync_ms / bridge_ms:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": h.brand, "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
