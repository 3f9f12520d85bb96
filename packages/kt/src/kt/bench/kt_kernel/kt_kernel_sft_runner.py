"""Time one MoE layer's LoRA training step in kt-kernel 0.7.2 — the baseline side of
benchmarks/sft_kt_kernel.py.

Run by the kt-kernel venv's python (benchmarks/setup_kt_kernel.sh), one process per call because
kt-kernel's CPUInfer pool is per process:

    .bench/kt-kernel-venv/bin/python .../kt_kernel_sft_runner.py --data IN.pt --method AMXBF16_SFT \
        --threads 2 --warmup 1 --repeats 3 --out OUT.pt

IN.pt (written by the driver): bf16 gate [E, I, H], up, down [E, H, I]; the six bf16 LoRA factors
(kt-kernel's layout: A [E, r, in], B [E, out, r]); rank, alpha; hidden bf16 [T, H], ids int64 [T, k],
routing weights f32 [T, k], the upstream gradient bf16 [T, H]; for AMXFP8_SFT also "fp8": per
projection the E4M3 codes uint8 [E, rows, cols] and f32 128 x 128 block scales, which it loads as
kt-kernel's load_block_fp8_weights does (per-expert pointers); for MXFP4_SFT "mxfp4": per projection
E2M1 codes uint8 [E, rows, cols / 2] and bf16 UE8M0 scales [E, rows, cols / 32], as
load_mxfp4_weights stages them, and "swiglu_limit". This drives kt_kernel_ext as
kt-kernel's SFT wrapper does (sft/amx.py): MOESFTConfig with the weight and LoRA pointers, the
method's SFT class, load_weights, then per step forward_sft(save_for_backward=True) and backward
into caller-owned buffers — without the wrapper's staging copies (its constructor pins memory,
which a CPU-only torch cannot). AMXINT8/AMXINT4 SFT quantize the bf16 weights at load.

OUT.pt: per-step times (forward, backward, seconds) and the first step's output, input gradient,
routing-weight gradient and the six LoRA gradients, for the driver to compare with kt's.
"""

from __future__ import annotations

import argparse
import time

import torch

CLASSES = {"AMXBF16_SFT": "AMXBF16_SFT_MOE", "AMXINT8_SFT": "AMXInt8_SFT_MOE", "AMXINT4_SFT": "AMXInt4_SFT_MOE",
           "AMXFP8_SFT": "AMXFP8_SFT_MOE", "MXFP4_SFT": "MXFP4_SFT_MOE"}
LORA = ("gate_lora_a", "gate_lora_b", "up_lora_a", "up_lora_b", "down_lora_a", "down_lora_b")
M_STEP = 32   # kt-kernel's AMX kernels take max_len in multiples of their M step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--method", choices=sorted(CLASSES), required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import kt_kernel  # picks the CPU variant's extension

    kt_kernel_ext = kt_kernel.kt_kernel_ext

    d = torch.load(a.data)
    gate, up, down = (d[n].contiguous() for n in ("gate", "up", "down"))
    E, I, H = gate.shape
    x, ids, w, dy = d["hidden"].contiguous(), d["ids"].contiguous(), d["weights"].contiguous(), d["dy"].contiguous()
    T, K = ids.shape
    lora = {n: d[n].contiguous() for n in LORA}
    grads = {n: torch.zeros_like(v) for n, v in lora.items()}

    wc = kt_kernel_ext.WorkerPoolConfig()
    wc.subpool_count, wc.subpool_numa_map, wc.subpool_thread_count = 1, [0], [a.threads]
    cpu = kt_kernel_ext.CPUInfer(wc)
    p2l = torch.arange(E, dtype=torch.int64)
    cfg = kt_kernel_ext.moe.MOESFTConfig(E, K, H, I)
    cfg.max_len = -(-T // M_STEP) * M_STEP
    cfg.max_cache_depth, cfg.layer_idx = 1, 0
    cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout = int(d["rank"]), float(d["alpha"]), 0.0
    cfg.full_weight_grad = False
    cfg.physical_to_logical_map = p2l.data_ptr()
    if a.method in ("AMXFP8_SFT", "MXFP4_SFT"):   # per-expert codes and scales, one NUMA node's list each
        fp8 = a.method == "AMXFP8_SFT"
        quantized = {n: (codes.contiguous(), scales.contiguous()) for n, (codes, scales) in d["fp8" if fp8 else "mxfp4"].items()}
        for n, (codes, scales) in quantized.items():
            setattr(cfg, f"{n}_projs", [[codes[e].data_ptr() for e in range(E)]])
            setattr(cfg, f"{n}_scales", [[scales[e].data_ptr() for e in range(E)]])
        if fp8:
            cfg.quant_config.bits, cfg.quant_config.group_size, cfg.quant_config.zero_point = 8, 128, False
            cfg.share_backward_bb = True   # its FP8 class requires the shared backward buffer pool
        else:   # E2M1 codes and bf16 UE8M0 scales, as its load_mxfp4_weights stages them
            cfg.quant_config.bits, cfg.quant_config.group_size, cfg.quant_config.zero_point = 4, 32, False
            cfg.swiglu_limit = float(d["swiglu_limit"])
    else:
        cfg.gate_proj, cfg.up_proj, cfg.down_proj = gate.data_ptr(), up.data_ptr(), down.data_ptr()
    for n in LORA:
        setattr(cfg, n, lora[n].data_ptr())
    cfg.pool = cpu.backend_
    moe = getattr(kt_kernel_ext.moe, CLASSES[a.method])(cfg)
    cpu.submit(moe.load_weights_task())
    cpu.sync()

    qlen = torch.tensor([T], dtype=torch.int32)
    out = torch.empty(T, H, dtype=torch.bfloat16)
    grad_x = torch.empty(T, H, dtype=torch.bfloat16)
    grad_w = torch.empty(T, K, dtype=torch.float32)
    times, first = [], None
    for step in range(a.warmup + a.repeats):
        t0 = time.perf_counter()
        cpu.submit(moe.forward_sft_task(qlen.data_ptr(), K, ids.data_ptr(), w.data_ptr(), x.data_ptr(),
                                        out.data_ptr(), True))
        cpu.sync()
        t1 = time.perf_counter()
        cpu.submit(moe.backward_task(dy.data_ptr(), grad_x.data_ptr(), *(grads[n].data_ptr() for n in LORA),
                                     grad_w.data_ptr(), 0, 0, 0))
        cpu.sync()
        t2 = time.perf_counter()
        if step == 0:
            first = {"out": out.clone(), "grad_x": grad_x.clone(), "grad_w": grad_w.clone(),
                     **{"grad_" + n: g.clone() for n, g in grads.items()}}
        if step >= a.warmup:
            times.append((t1 - t0, t2 - t1))
    torch.save({"times": times, "first": first, "variant": kt_kernel.__cpu_variant__}, a.out)


if __name__ == "__main__":
    main()
