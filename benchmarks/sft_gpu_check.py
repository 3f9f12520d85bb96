"""Training with the model on a GPU and the routed experts on kt (issue #24), on a lent GPU machine.

    python benchmarks/sft_gpu_check.py

kt.training.LoRAExperts takes hidden states, routing and upstream gradients on the GPU, computes on
the CPU and hands the output and the input gradients back on the GPU. Checked here without
transformers (which a lent machine may lack): (1) every gradient (hidden states, routing weights,
LoRA factors) against torch float64 autograd computed on the GPU over the same weights; (2) a small
model — embedding and head on the GPU, a kt expert layer between — trained with AdamW for 30 steps:
the loss must fall. Prints one line per check and exits non-zero on a failure.
"""

from __future__ import annotations

import sys
import time

import torch

import kt_core
from kt.training import LoRAExperts


def reference(x, ids, w, gate, up, down, lora, scaling):
    out = torch.zeros_like(x)
    for e in range(gate.shape[0]):
        token, pick = torch.where(ids == e)
        if not token.numel():
            continue
        xe = x[token]
        gu = torch.cat([xe @ gate[e].t(), xe @ up[e].t()], dim=1)
        gu = gu + scaling * (xe @ lora["gate_up_A"][e].t() @ lora["gate_up_B"][e].t())
        i = gate.shape[1]
        h = torch.nn.functional.silu(gu[:, :i]) * gu[:, i:]
        y = h @ down[e].t() + scaling * (h @ lora["down_A"][e].t() @ lora["down_B"][e].t())
        out = out.index_add(0, token, y * w[token, pick, None])
    return out


def gradient_check(dev) -> bool:
    E, K, H, I, T = 16, 4, 256, 128, 64
    gen = torch.Generator().manual_seed(0)
    gate, up = (torch.randn(E, I, H, generator=gen) * H**-0.5 for _ in range(2))
    down = torch.randn(E, H, I, generator=gen) * I**-0.5
    moe = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="FP32", trainable=True)
    moe.load(gate, up, down)
    layer = LoRAExperts(moe, rank=8, alpha=16)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.2, generator=gen)
    x = torch.randn(T, H, generator=gen).to(dev).requires_grad_()
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)]).to(dev)
    w = torch.rand(T, K, generator=gen).to(dev).requires_grad_()
    g = torch.randn(T, H, generator=gen).to(dev)
    out = layer(x, ids, w)
    assert out.device == x.device, out.device
    out.backward(g)
    ref = {n: p.detach().double().to(dev).requires_grad_() for n, p in layer.named_parameters()}
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = reference(x64, ids, w64, gate.double().to(dev), up.double().to(dev), down.double().to(dev), ref, layer.scaling)
    want.backward(g.double())
    worst = 0.0
    pairs = [("output", out, want), ("d hidden", x.grad, x64.grad), ("d weights", w.grad, w64.grad)]
    pairs += [(f"d {n}", p.grad, ref[n].grad) for n, p in layer.named_parameters()]
    for name, a, b in pairs:
        err = float((a.detach().double().to(dev) - b.detach()).abs().max() / b.detach().abs().max())
        worst = max(worst, err)
        print(f"  {name:12s} {err:.2e} (grad on {a.device})")
    ok = worst < 1e-5 and x.grad.device == x.device
    print(f"gradient check, hidden states on {dev}: worst {worst:.2e} -> {'ok' if ok else 'FAILED'}")
    return ok


def training_check(dev, resident: int = 0) -> bool:
    """A short training run; with `resident` > 0 the first experts are GPU-resident (torch on dev with
    their adapter rows), kt computes the others."""
    E, K, H, I, V = 16, 4, 128, 64, 64
    torch.manual_seed(1)
    mask = [e < resident for e in range(E)]
    moe = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="BF16", trainable=True,
                      gpu_experts_mask=mask)
    gate, up, down = torch.randn(E, I, H) * H**-0.5, torch.randn(E, I, H) * H**-0.5, torch.randn(E, H, I) * I**-0.5
    moe.load(gate, up, down)
    experts = LoRAExperts(moe, rank=8, alpha=16, resident_gate_up=torch.cat([gate, up], dim=1)[:resident].to(dev),
                          resident_down=down[:resident].to(dev))
    embed, router, head = (torch.nn.Embedding(V, H).to(dev), torch.nn.Linear(H, E).to(dev), torch.nn.Linear(H, V).to(dev))
    params = list(experts.parameters()) + list(embed.parameters()) + list(router.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=3e-3)
    data = torch.randint(0, V, (8, 33), device=dev)
    losses = []
    start = time.perf_counter()
    for _ in range(30):
        x = embed(data[:, :-1]).reshape(-1, H)
        probs = torch.softmax(router(x), dim=-1)
        w, ids = probs.topk(K, dim=-1)
        h = x + experts(x, ids, w)
        loss = torch.nn.functional.cross_entropy(head(h), data[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    ok = losses[-1] < losses[0] - 0.5
    print(f"training, embedding/router/head on {dev}, {resident} experts resident there, the rest on kt "
          f"({moe.backend}): loss {losses[0]:.3f} -> "
          f"{losses[-1]:.3f} in 30 steps, {time.perf_counter() - start:.1f} s -> {'ok' if ok else 'FAILED'}")
    return ok


def main() -> int:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        print("no CUDA device: the checks run with everything on the CPU")
    results = [gradient_check(dev), training_check(dev), training_check(dev, resident=4)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
