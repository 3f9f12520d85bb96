"""One MoE layer's LoRA training step (forward + backward): kt vs plain torch, in the same run.

    python benchmarks/sft_layer.py [--shape qwen3-30b-a3b] [--tokens 512 2048] [--ranks 8 16]
        [--methods BF16 INT8 INT4] [--threads 2] [--repeats 5] [--torch-dtypes bfloat16 float32] [--json OUT]

The step: routed experts with frozen base weights and per-expert LoRA on gate_up and down
(kt.training.LoRAExperts: rank r, alpha 2r), out.backward(g) for a fixed upstream gradient g, so
autograd computes the gradients of the hidden states, the routing weights and the LoRA factors.
  - kt: LoRAExperts over kt_core.MoE(method, trainable=True), weights packed by the selected backend
    (recorded with its kernel id);
  - torch: the same LoRA'd experts in plain torch autograd — rows grouped by expert once (argsort,
    as kt does, not transformers' one-hot loop), per expert F.linear with the frozen weights and the
    LoRA matmuls, SiLU gate, weighted index_add — with the weights in bf16 (a bf16 model, bf16
    products: what a transformers + PEFT run on this CPU does) and in f32 (upcast copies), the
    faster of the two being the figure kt is compared with.
Every side sees the same weights (bf16-valued), hidden states (bf16-valued, as a bf16 model's are),
routing (top-k without replacement, softmax weights, fixed seed) and LoRA factors (B nonzero, so
every gradient path carries data). Calls alternate between the sides, repeats times after a warm-up
each, and the median is reported with the spread ((max - min) / median). Also: each side's gradients
against kt BF16's (relative max error),
and the bytes autograd keeps between forward and backward per token (saved-tensor hooks; tensors that
are views of the frozen weights or of parameters cost nothing and are not counted), for kt with and
without recompute=True.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import kt_core
from kt.training import LoRAExperts

SHAPES = {   # experts, top_k, hidden, intermediate
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "tiny": (16, 4, 256, 128),
}


def routing(tokens: int, experts: int, top_k: int, gen: torch.Generator):
    scores = torch.rand(tokens, experts, generator=gen)
    ids = scores.argsort(dim=1, descending=True)[:, :top_k].contiguous()
    weights = torch.softmax(torch.randn(tokens, top_k, generator=gen), dim=1)
    return ids, weights


class TorchLoRAExperts(torch.nn.Module):
    """The same LoRA'd experts in plain torch autograd (frozen weights in `dtype`)."""

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, lora: dict, scaling: float, dtype: torch.dtype):
        super().__init__()
        self.gate_up, self.down, self.dtype = gate_up.to(dtype), down.to(dtype), dtype
        self.lora = torch.nn.ParameterDict({k: torch.nn.Parameter(v.clone()) for k, v in lora.items()})
        self.scaling = scaling

    def forward(self, x, ids, weights):
        E = self.gate_up.shape[0]
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // ids.shape[1]
        splits = torch.bincount(flat, minlength=E).tolist()
        rows = x.index_select(0, token)
        outs = []
        for e, xe in enumerate(rows.split(splits)):
            if not xe.shape[0]:
                outs.append(xe.new_empty((0, x.shape[1])))
                continue
            gu = F.linear(xe.to(self.dtype), self.gate_up[e]).float()
            gu = gu + (xe @ self.lora["gate_up_A"][e].t() @ self.lora["gate_up_B"][e].t()) * self.scaling
            g, u = gu.chunk(2, dim=-1)
            h = F.silu(g) * u
            y = F.linear(h.to(self.dtype), self.down[e]).float()
            outs.append(y + (h @ self.lora["down_A"][e].t() @ self.lora["down_B"][e].t()) * self.scaling)
        y = torch.cat(outs) * weights.reshape(-1).index_select(0, order)[:, None]
        return torch.zeros_like(x).index_add(0, token, y)


def step(module, x, ids, w, upstream):
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    module.zero_grad(set_to_none=True)
    out = module(x, ids, w)
    out.backward(upstream)
    named = {n.removeprefix("lora."): p.grad for n, p in module.named_parameters() if p.requires_grad}
    return [x.grad, w.grad] + [named[k] for k in sorted(named)]


def saved_bytes(module, x, ids, w) -> int:
    """Bytes of the distinct tensors autograd saves, not counting views of weights or parameters.
    A saved tensor counts its own bytes, not its storage's: kt's step saves views of pooled buffers
    that a larger step before may have sized bigger (the pool's spare capacity is reused, not kept
    per token; counting whole storages once reported 201 KiB/token at 512 tokens after a 2048-token
    step for the same 57)."""
    held = {t.untyped_storage().data_ptr() for t in list(module.parameters()) + list(vars(module).values())
            if isinstance(t, torch.Tensor)}
    seen = set()
    total = 0

    def pack(t):
        nonlocal total
        key = (t.data_ptr(), t.nbytes)
        if t.untyped_storage().data_ptr() not in held and key not in seen:
            seen.add(key)
            total += t.nbytes
        return t

    x = x.detach().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x, ids, w)
    return total


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--methods", nargs="+", default=["BF16", "BF16+fast", "INT8", "INT4"],
                    help="kt methods; +fast: fast_activations=True (bf16 activations forward, bf16 gradients in backward)")
    ap.add_argument("--threads", type=int, default=None, help="kt pool and torch threads (default: kt's choice)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--torch-dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"],
                    help="torch sides (under ONEDNN_MAX_CPU_ISA=AVX2 torch's bf16 products take ~40x its f32 ones)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    E, K, H, I = SHAPES[args.shape]
    kt_core.pool.configure(num_threads=args.threads or 0)
    threads = kt_core.pool.info().num_threads
    torch.set_num_threads(threads)
    from kt_core.host import host as detect_host

    host = detect_host()
    print(f"# host: {host.brand}, ISA level {host.isa_level} (kt doctor), threads kt {threads} torch "
          f"{torch.get_num_threads()}; shape {args.shape} E={E} top-{K} H={H} I={I}", flush=True)
    gen = torch.Generator().manual_seed(0)
    gate_up = (torch.randn(E, 2 * I, H, generator=gen) * H**-0.5).bfloat16().float()
    down = (torch.randn(E, H, I, generator=gen) * I**-0.5).bfloat16().float()
    results = []
    for rank in args.ranks:
        lora = {"gate_up_A": torch.randn(E, rank, H, generator=gen) * H**-0.5,
                "gate_up_B": torch.randn(E, 2 * I, rank, generator=gen) * 0.01,
                "down_A": torch.randn(E, rank, I, generator=gen) * I**-0.5,
                "down_B": torch.randn(E, H, rank, generator=gen) * 0.01}
        sides = {}
        for name in args.methods:
            method, fast = name.removesuffix("+fast"), name.endswith("+fast")
            moe = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method,
                              max_tokens=max(args.tokens), trainable=True, fast_activations=fast)
            moe.load(gate_up[:, :I], gate_up[:, I:], down)
            m = LoRAExperts(moe, rank=rank, alpha=2 * rank)
            with torch.no_grad():
                for k, v in lora.items():
                    getattr(m, k).copy_(v)
            sides[f"kt {name}"] = (m, moe.kernel_id)
        for dtype in args.torch_dtypes:
            sides[f"torch {dtype}"] = (TorchLoRAExperts(gate_up, down, lora, 2.0, getattr(torch, dtype)), "torch")
        for tokens in args.tokens:
            x = torch.randn(tokens, H, generator=gen).bfloat16().float()   # a bf16 model's hidden states
            ids, w = routing(tokens, E, K, gen)
            upstream = torch.randn(tokens, H, generator=gen)
            times = {name: [] for name in sides}
            grads = {}
            for name, (m, _) in sides.items():   # warm-up, and the gradients compared below
                grads[name] = step(m, x, ids, w, upstream)
            for _ in range(args.repeats):
                for name, (m, _) in sides.items():
                    t0 = time.perf_counter()
                    step(m, x, ids, w, upstream)
                    times[name].append(time.perf_counter() - t0)
            base = grads.get("kt BF16") or next(iter(grads.values()))
            torch_best = min((statistics.median(v) for n, v in times.items() if n.startswith("torch")))
            for name, (m, kernel) in sides.items():
                med = statistics.median(times[name])
                row = {"rank": rank, "tokens": tokens, "side": name, "kernel": kernel, "ms": med * 1e3,
                       "spread": (max(times[name]) - min(times[name])) / med, "vs_torch_best": torch_best / med,
                       "grad_err_vs_kt_bf16": max(rel(a, b) for a, b in zip(grads[name], base)),
                       "saved_bytes_per_token": saved_bytes(m, x, ids, w) / tokens}
                if name.startswith("kt"):
                    m.recompute = True
                    row["saved_bytes_per_token_recompute"] = saved_bytes(m, x, ids, w) / tokens
                    m.recompute = False
                results.append(row)
                print(f"r={rank:3d} T={tokens:5d} {name:14s} {row['ms']:9.1f} ms (spread {row['spread']:.0%})  "
                      f"x{row['vs_torch_best']:.2f} vs torch's best  grad err {row['grad_err_vs_kt_bf16']:.1e}  "
                      f"saved {row['saved_bytes_per_token'] / 1024:.0f} KiB/token"
                      + (f" (recompute {row['saved_bytes_per_token_recompute'] / 1024:.1f})"
                         if "saved_bytes_per_token_recompute" in row else "") + f"  [{kernel}]", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": args.shape, "threads": threads, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
