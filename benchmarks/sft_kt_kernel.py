"""kt-kernel's SFT API on kt vs kt-kernel 0.7.2 itself: one MoE layer's LoRA training step, same run.

    python benchmarks/sft_kt_kernel.py [--shape qwen3-30b-a3b] [--tokens 512 2048] [--rank 16]
        [--methods AMXBF16_SFT AMXINT8_SFT] [--threads 2] [--warmup 1] [--repeats 3] [--passes 3]
        [--kt-kernel-venv .bench/kt-kernel-venv] [--json OUT]

Both sides run the same step on the same inputs — bf16 expert weights, bf16 hidden states, routing
(top-k without replacement, softmax weights, fixed seed), the six bf16 LoRA factors (B nonzero, so
every gradient path carries data) and the upstream gradient — forward(save_for_backward=True) then
backward into caller-owned LoRA gradient buffers. AMXFP8_SFT's sides both load the same block-FP8
quantization of those weights (E4M3 codes, f32 128 x 128 block scales; kt through
load_block_fp8_weights), MXFP4_SFT's the same MXFP4 quantization (E2M1 codes, UE8M0 scales per 32;
kt through load_mxfp4_weights) and compute DeepSeek-V4's clamped SiLU at `--swiglu-limit`:
  - kt: `KTMoEWrapper(mode="sft", method=...)` (kt_core.sft) in this process, on the host's best
    backend with transposed tiles;
  - kt-kernel: its SFT class for the method driven through kt_kernel_ext in its own venv
    (kt/bench/kt_kernel/kt_kernel_sft_runner.py; benchmarks/setup_kt_kernel.sh makes the venv), one
    process per pass with `--threads` workers (its task queue adds a polling thread).
Passes alternate between the sides; each pass times `--repeats` steps after `--warmup`; the figure
per side is the median over every timed step, with the spread ((max - min) / median). The two
sides' first-step outputs and gradients are held to float64 autograd of the same step on the bf16
weights (max |side - ref| / max |ref| per tensor; unquantized weights, so the integer methods' errors
include their format's; bf16 outputs make ~2e-3 the floor). The host's ISA (`kt doctor`) is printed
with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import kt_core
from kt_core import KTMoEWrapper

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "packages/kt/src/kt/bench/kt_kernel/kt_kernel_sft_runner.py"
SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768), "tiny": (16, 4, 256, 256)}   # experts, top_k, hidden, intermediate
LORA = ("gate_lora_a", "gate_lora_b", "up_lora_a", "up_lora_b", "down_lora_a", "down_lora_b")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_inputs(shape, tokens: int, rank: int, seed: int = 0) -> dict:
    E, K, H, I = shape
    g = torch.Generator().manual_seed(seed)
    d = {"gate": (torch.randn(E, I, H, generator=g) / H**0.5).bfloat16(),
         "up": (torch.randn(E, I, H, generator=g) / H**0.5).bfloat16(),
         "down": (torch.randn(E, H, I, generator=g) / I**0.5).bfloat16(), "rank": rank, "alpha": 2.0 * rank}
    for name, shp in zip(LORA, ((E, rank, H), (E, I, rank), (E, rank, H), (E, I, rank), (E, rank, I), (E, H, rank))):
        d[name] = (torch.randn(shp, generator=g) / shp[2] ** 0.5 * 0.5).bfloat16()
    scores = torch.rand(tokens, E, generator=g)
    d["ids"] = scores.argsort(dim=1, descending=True)[:, :K].contiguous()
    d["weights"] = torch.softmax(torch.randn(tokens, K, generator=g), dim=1).contiguous()
    d["hidden"] = torch.randn(tokens, H, generator=g).bfloat16()
    d["dy"] = (torch.randn(tokens, H, generator=g) * 0.01).bfloat16()
    return d


def block_fp8(d: dict) -> dict:
    """The bf16 weights as DeepSeek-V3-style block FP8: per projection (E4M3 codes uint8 [E, rows, cols],
    f32 scales [E, rows / 128, cols / 128]) — what both sides of AMXFP8_SFT load."""
    from kt_core.testing.quantize import quantize_fp8_block

    out = {}
    for n in ("gate", "up", "down"):
        codes, scales = quantize_fp8_block(d[n].float().numpy())
        out[n] = (torch.from_numpy(codes), torch.from_numpy(scales.astype("float32")))
    return out


def mxfp4(d: dict) -> dict:
    """The bf16 weights as MXFP4 (E2M1 codes uint8 [E, rows, cols / 2], the UE8M0 scales as bf16 powers
    of two [E, rows, cols / 32]) — what both sides of MXFP4_SFT load."""
    from kt_core.sft import ue8m0_to_bf16
    from kt_core.testing.quantize import quantize_mxfp4

    out = {}
    for n in ("gate", "up", "down"):
        codes, scales = quantize_mxfp4(d[n].float().numpy())
        out[n] = (torch.from_numpy(codes), ue8m0_to_bf16(torch.from_numpy(scales)))
    return out


class KtSide:
    def __init__(self, d: dict, method: str, threads: int):
        E, I, H = d["gate"].shape
        T, K = d["ids"].shape
        self.d = d
        extra = ({"swiglu_limit": d["swiglu_limit"], "group_size": 32, "zero_point": False}
                 if method == "MXFP4_SFT" else {})
        self.w = KTMoEWrapper(layer_idx=0, num_experts=E, num_experts_per_tok=K, hidden_size=H,
                              moe_intermediate_size=I, cpuinfer_threads=threads, threadpool_count=1,
                              weight_path=None, chunked_prefill_size=T, method=method, mode="sft",
                              lora_rank=d["rank"], lora_alpha=d["alpha"], **extra)
        if method == "MXFP4_SFT":
            data = {}
            for n, (codes, scales) in d["mxfp4"].items():
                data[n], data[n + "_scale"] = list(codes), list(scales)
            self.w.load_mxfp4_weights(data, torch.arange(E))
        elif method == "AMXFP8_SFT":
            from types import SimpleNamespace

            fp8 = {f"{n}_{part}": list(t) for n, pair in d["fp8"].items()
                   for part, t in zip(("proj", "scale"), (pair[0].view(torch.float8_e4m3fn), pair[1]))}
            self.w.load_block_fp8_weights(SimpleNamespace(block_size=(128, 128), **fp8), torch.arange(E))
        else:
            self.w.load_weights_from_tensors(d["gate"], d["up"], d["down"], torch.arange(E))
        self.grads = {n: torch.zeros_like(d[n]) for n in LORA}
        self.w.init_lora_weights(*(d[n] for n in LORA), *self.grads.values())

    def step(self):
        d = self.d
        t0 = time.perf_counter()
        out = self.w.forward(d["hidden"], d["ids"], d["weights"], save_for_backward=True)
        t1 = time.perf_counter()
        grad_x, grad_w = self.w.backward(d["dy"])
        t2 = time.perf_counter()
        return (t1 - t0, t2 - t1), {"out": out, "grad_x": grad_x, "grad_w": grad_w,
                                    **{"grad_" + n: g.clone() for n, g in self.grads.items()}}


def float64_reference(d: dict, limit: float = 0.0) -> dict:
    """Output and gradients of the step in float64 autograd on the bf16 weights (unquantized: for the
    integer methods the error includes the format's), rows grouped by expert; `limit`: the clamped
    SiLU, SiLU(min(g, limit)) * clamp(u, -limit, limit)."""
    X = d["hidden"].double().requires_grad_()
    W = d["weights"].double().requires_grad_()
    P = {n: d[n].double().requires_grad_() for n in LORA}
    s = d["alpha"] / d["rank"]
    gate, up, down = (d[n].double() for n in ("gate", "up", "down"))
    ids = d["ids"]
    out = torch.zeros_like(X)
    for e in range(gate.shape[0]):
        t, j = (ids == e).nonzero(as_tuple=True)
        if not len(t):
            continue
        x = X[t]
        g = x @ gate[e].T + s * (x @ P["gate_lora_a"][e].T) @ P["gate_lora_b"][e].T
        u = x @ up[e].T + s * (x @ P["up_lora_a"][e].T) @ P["up_lora_b"][e].T
        if limit:
            g, u = g.clamp(max=limit), u.clamp(-limit, limit)
        h = torch.nn.functional.silu(g) * u
        y = h @ down[e].T + s * (h @ P["down_lora_a"][e].T) @ P["down_lora_b"][e].T
        out = out.index_add(0, t, W[t, j][:, None] * y)
    out.backward(d["dy"].double())
    return {"out": out.detach(), "grad_x": X.grad, "grad_w": W.grad, **{"grad_" + n: P[n].grad for n in LORA}}


def run_kt_kernel(venv: Path, data: Path, method: str, threads: int, warmup: int, repeats: int, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [str(venv / "bin" / "python"), str(RUNNER), "--data", str(data), "--method", method,
           "--threads", str(threads), "--warmup", str(warmup), "--repeats", str(repeats), "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"kt-kernel runner failed (exit {r.returncode}):\n" + (r.stdout + r.stderr)[-3000:])
    return torch.load(out)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def summary(times: list[float]) -> dict:
    med = statistics.median(times)
    return {"median_s": med, "spread": (max(times) - min(times)) / med, "n": len(times)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    p.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--methods", nargs="+", default=["AMXBF16_SFT", "AMXINT8_SFT"])
    p.add_argument("--swiglu-limit", type=float, default=10.0, help="MXFP4_SFT's clamped SiLU limit")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--kt-kernel-venv", type=Path, default=ROOT / ".bench/kt-kernel-venv")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    if not (a.kt_kernel_venv / "bin" / "python").is_file():
        p.error(f"--kt-kernel-venv {a.kt_kernel_venv}: no bin/python; run benchmarks/setup_kt_kernel.sh")
    kt_core.pool.configure(a.threads, 0)
    host = kt_core.host()
    host_line = f"{host.brand}, ISA level {host.isa_level} (kt doctor)"
    log(f"host: {host_line}; shape {a.shape} {SHAPES[a.shape]}, rank {a.rank}, threads {a.threads}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tokens in a.tokens:
            d = make_inputs(SHAPES[a.shape], tokens, a.rank)
            if "AMXFP8_SFT" in a.methods:
                d["fp8"] = block_fp8(d)
            if "MXFP4_SFT" in a.methods:
                d["mxfp4"], d["swiglu_limit"] = mxfp4(d), a.swiglu_limit
            data = Path(tmp) / "in.pt"
            torch.save(d, data)
            refs = {}
            for method in a.methods:
                limit = a.swiglu_limit if method == "MXFP4_SFT" else 0.0
                if limit not in refs:
                    log(f"{tokens} tokens: float64 reference" + (f" (clamped SiLU at {limit})" if limit else "") + " ...")
                    refs[limit] = float64_reference(d, limit)
                ref = refs[limit]
                kt = KtSide(d, method, a.threads)
                kt_times, ref_times, variant, diffs = [], [], None, None
                for pass_ in range(a.passes):
                    res = run_kt_kernel(a.kt_kernel_venv, data, method, a.threads, a.warmup, a.repeats,
                                        Path(tmp) / "out.pt")
                    ref_times += res["times"]
                    variant = res["variant"]
                    for step in range(a.warmup + a.repeats):
                        t, first = kt.step()
                        if step >= a.warmup:
                            kt_times.append(t)
                        if pass_ == 0 and step == 0:
                            diffs = {n: rel(first[n], res["first"][n]) for n in first}
                            errs = {side: {n: rel(v[n], ref[n]) for n in ref}
                                    for side, v in (("kt", first), ("kt_kernel", res["first"]))}
                total_kt = summary([f + b for f, b in kt_times])
                total_ref = summary([f + b for f, b in ref_times])
                row = {"tokens": tokens, "method": method, "kt_backend": kt.w.backend,
                       "kt_kernel_variant": variant, "kt": total_kt, "kt_kernel": total_ref,
                       "kt_fwd_s": statistics.median(f for f, _ in kt_times),
                       "kt_bwd_s": statistics.median(b for _, b in kt_times),
                       "kt_kernel_fwd_s": statistics.median(f for f, _ in ref_times),
                       "kt_kernel_bwd_s": statistics.median(b for _, b in ref_times),
                       "ratio": total_ref["median_s"] / total_kt["median_s"], "max_rel_diff": diffs,
                       "error_vs_float64": errs}
                rows.append(row)
                log(f"{tokens:5d} tokens {method:12s} kt {total_kt['median_s'] * 1e3:8.1f} ms "
                    f"(fwd {row['kt_fwd_s'] * 1e3:.1f} / bwd {row['kt_bwd_s'] * 1e3:.1f}, spread "
                    f"{total_kt['spread']:.0%})  kt-kernel {total_ref['median_s'] * 1e3:8.1f} ms (fwd "
                    f"{row['kt_kernel_fwd_s'] * 1e3:.1f} / bwd {row['kt_kernel_bwd_s'] * 1e3:.1f}, spread "
                    f"{total_ref['spread']:.0%})  kt-kernel/kt {row['ratio']:.2f}  max diff "
                    f"{max(diffs.values()):.1e} ({max(diffs, key=diffs.get)})")
                for side, e in errs.items():
                    log(f"      error vs float64, {side:9s}: " + " ".join(f"{n} {v:.1e}" for n, v in e.items()))
                del kt
    print("| tokens | method | kt (ms) | kt-kernel (ms) | kt-kernel / kt | error vs float64, kt / kt-kernel "
          "(worst tensor each) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ek, er = r["error_vs_float64"]["kt"], r["error_vs_float64"]["kt_kernel"]
        wk, wr = max(ek, key=ek.get), max(er, key=er.get)
        print(f"| {r['tokens']} | {r['method']} | {r['kt']['median_s'] * 1e3:.1f} | "
              f"{r['kt_kernel']['median_s'] * 1e3:.1f} | {r['ratio']:.2f} | {ek[wk]:.1e} ({wk}) / {er[wr]:.1e} ({wr}) |")
    if a.json:
        a.json.write_text(json.dumps({"host": host_line, "shape": a.shape, "rank": a.rank, "threads": a.threads,
                                      "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
