"""Whole-model LoRA training throughput on kt's tiny preset: kt's experts vs PEFT in torch, same run.

    python benchmarks/sft_tiny.py [--steps 20] [--batch 8] [--length 128] [--method BF16]

The tiny preset (`kt demo`'s: 4 layers, hidden 256, 16 experts of 128, top-4) trains expert LoRA
(rank 8, alpha 16, on gate_up and down) with AdamW on the same random batches twice: with its routed
experts on kt (patch_model(mode="train")), and with PEFT's target_parameters on the same experts in
torch. Prints training tokens per second of each (median step time after two warm-up steps) and
the losses' largest relative difference (both runs start from the same adapters). The preset is
small, so this measures kt's per-layer overhead more than its kernels (benchmarks/sft_layer.py does
those on a Qwen3-30B-A3B-shaped layer).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--method", default="BF16")
    args = ap.parse_args()

    import peft

    from kt.integrations.transformers import patch_model
    from kt.integrations.transformers.preset import load_preset
    from kt.training import adapter_state_dict
    from kt_core.host import host

    torch.manual_seed(0)
    kt_model, _ = load_preset()
    torch_model, _ = load_preset()
    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=[],
                          target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    twin = peft.get_peft_model(torch_model, cfg)
    patch = patch_model(kt_model, method=args.method, mode="train", lora_rank=8, lora_alpha=16)
    tensors, _ = adapter_state_dict(patch.modules)
    peft.set_peft_model_state_dict(twin, {k: v.clone() for k, v in tensors.items()})
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(4, 90, (args.batch, args.length), generator=gen) for _ in range(args.steps)]
    h = host()
    print(f"# host: {h.brand}, ISA level {h.isa_level}; torch threads {torch.get_num_threads()}; tiny preset, "
          f"batch {args.batch} x {args.length} tokens, {args.steps} steps, experts {patch.method} on "
          f"{', '.join(patch.backends)}")
    losses = {}
    for name, model, params in (("kt", kt_model, patch.adapter_parameters()),
                                ("torch+PEFT", twin, [p for p in twin.parameters() if p.requires_grad])):
        model.train()
        opt = torch.optim.AdamW(params, lr=1e-3)
        times, losses[name] = [], []
        for ids in data:
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
            losses[name].append(loss.item())
        step = statistics.median(times[2:])
        print(f"{name:10s} {args.batch * args.length / step:9.0f} tokens/s  ({step * 1e3:.1f} ms/step)  "
              f"loss {losses[name][0]:.4f} -> {losses[name][-1]:.4f}")
    diff = max(abs(a - b) / abs(b) for a, b in zip(losses["kt"], losses["torch+PEFT"]))
    print(f"largest relative loss difference kt vs torch+PEFT: {diff:.1e}")


if __name__ == "__main__":
    main()
