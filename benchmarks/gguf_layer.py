"""LLAMAFILE (GGUF blocks) against kt's own INT4/INT8 on one MoE layer, measured in one run.

    python benchmarks/gguf_layer.py [--hidden 2048 --intermediate 768 --experts 128 --top-k 8]
        [--tokens 1 256] [--threads N] [--repeats 10] [--passes 3] [--json OUT]
        [--kt-kernel-venv .bench/kt-kernel-venv] [--llama-cpp .bench/llama.cpp]

With --kt-kernel-venv, kt-kernel 0.7.2's LLAMAFILE runs on the same blocks and the same calls
right after kt's (benchmarks/kt_kernel_llamafile.py in that venv; the data go through
.bench/gguf_layer_data), and each row gets its time and the relative difference of the two
outputs on the first call.

With --llama-cpp BUILD (made by benchmarks/setup_llama_cpp.sh), llama.cpp's own MoE graph
(benchmarks/llama_cpp_moe.cpp: mul_mat_id on the same blocks, in llama.cpp's repacked CPU layouts
where it uses them, with the same thread count) runs the same calls right after kt's; each row gets
its time, llama.cpp / kt (above 1: kt faster; with --passes N each side is measured N times,
alternating, and its figure is the median of its pass medians), and both sides' error on the first call's first
tokens against float64 over the blocks' dequantized weights (gguf-py's dequantizer). "LLAMAFILE BF16"
is a GGUF BF16 file's experts through kt's LLAMAFILE method (BF16 kernels, llama.cpp's bf16
activations by default); "BF16" is kt's BF16 method given the same values as floats (exact f32
activations by default); both against llama.cpp's BF16 tensors of the same bf16 values.

Default shape: Qwen3-30B-A3B's MoE layer. Per method (LLAMAFILE Q4_K and Q8_0 — gate, up and
down all of that type, random blocks — and INT4 (group 128) / INT8 quantized from random
floats), on whatever backend kt selects: warm-up calls, then timed calls, each with a fresh
top-k routing (no repeated experts in cache for decode); median and spread. GB/s counts the
packed bytes of the distinct experts a call touches; the read bandwidth of this host
(kt_core's native probe, 1 GiB) is measured at the start and the end of the run.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import kt_core
from kt_core import _native, pool
from kt_core.formats.ggml import mxfp4_codes
from kt_core.testing.ggml_blocks import dequantize, random_blocks

METHODS = {"LLAMAFILE Q4_K": ("LLAMAFILE", ("Q4_K",) * 3), "LLAMAFILE Q8_0": ("LLAMAFILE", ("Q8_0",) * 3),
           "LLAMAFILE Q4_K_M": ("LLAMAFILE", ("Q4_K", "Q4_K", "Q6_K")),
           **{f"LLAMAFILE {t}": ("LLAMAFILE", (t,) * 3)
              for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ1_S", "IQ1_M",
                        "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")},
           "LLAMAFILE BF16": ("LLAMAFILE", ("BF16",) * 3), "BF16": ("BF16", ("BF16",) * 3),
           "LLAMAFILE MXFP4": ("LLAMAFILE", ("MXFP4",) * 3),
           "INT4": ("INT4", None), "INT8": ("INT8", None)}
CHECK_TOKENS = 4   # tokens of the first call checked against float64 (their experts are dequantized)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bandwidth() -> float:
    return float(np.median(_native.bench_read_bandwidth(1 << 30, 5)))


def make_layer(name: str, args, rng):
    """The layer, loaded; and for LLAMAFILE its blocks [E, N, row bytes] (kt-kernel gets the same)."""
    method, types = METHODS[name]
    H, I, E = args.hidden, args.intermediate, args.experts
    layer = kt_core.MoE(num_experts=E, top_k=args.top_k, hidden_size=H, intermediate_size=I, method=method,
                        max_tokens=max(args.tokens), weight_types=types if method == "LLAMAFILE" else None,
                        group_size=128 if method == "INT4" else 0, fast_activations=args.fast_activations)
    shapes = ((E, I, H), (E, I, H), (E, H, I))
    if types == ("BF16",) * 3:   # bf16 bits: a GGUF BF16 file's rows, or kt's BF16 method given their floats
        bits = tuple((rng.standard_normal(s, dtype=np.float32) * 0.02).view(np.uint32) >> 16 for s in shapes)
        bits = tuple(b.astype(np.uint16) for b in bits)
        if method == "LLAMAFILE":
            layer.load(*bits)
            return layer, bits
        for e0 in range(0, E, 16):
            layer.load_experts({e: tuple(bf16_to_f32(b[e]) for b in bits) for e in range(e0, min(E, e0 + 16))})
        return layer, bits
    if types == ("MXFP4",) * 3:   # GPT-OSS's files: kt reorders the blocks into method MXFP4's codes, as kt.gguf does
        blocks = tuple(random_blocks(rng, t, s) for t, s in zip(types, shapes))

        def expert(e):
            (gc, gs), (uc, us), (dc, ds) = (mxfp4_codes(b[e]) for b in blocks)
            return gc, uc, dc, (gs, us, ds)

        for e0 in range(0, E, 16):
            layer.load_experts({e: expert(e) for e in range(e0, min(E, e0 + 16))})
        return layer, blocks
    if types:
        blocks = tuple(random_blocks(rng, t, s) for t, s in zip(types, shapes))
        layer.load(*blocks)
        return layer, blocks
    for e0 in range(0, E, 16):   # in batches: the floats of every expert would not fit at once
        layer.load_experts({e: tuple((rng.standard_normal(s) * 0.02).astype(np.float32) for s in ((I, H), (I, H), (H, I)))
                            for e in range(e0, min(E, e0 + 16))})
    return layer, None


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def dequantized(blocks, types, e: int) -> tuple:
    """Expert e's (gate, up, down) in float64, as the blocks mean them."""
    if types[0] == "BF16":
        return tuple(bf16_to_f32(b[e]).astype(np.float64) for b in blocks)
    return tuple(dequantize(b[e], t).astype(np.float64) for b, t in zip(blocks, types))


def reference(blocks, types, call) -> np.ndarray:
    """float64 output of the first CHECK_TOKENS tokens of `call`, dequantizing only their experts."""
    x, ids, w = (a[:CHECK_TOKENS] for a in call)
    out = np.zeros((x.shape[0], x.shape[1]))
    for e in np.unique(ids):
        g, u, d = dequantized(blocks, types, int(e))
        for t, j in zip(*np.nonzero(ids == e)):
            a, b = g @ x[t], u @ x[t]
            out[t] += w[t, j] * (d @ (a / (1 + np.exp(-a)) * b))
    return out


def make_calls(args, tokens: int, rng) -> list[tuple]:
    """warmup + repeats calls (hidden, ids, weights), each with a fresh top-k routing."""
    H, E, K = args.hidden, args.experts, args.top_k
    return [(rng.standard_normal((tokens, H)).astype(np.float32),
             np.stack([rng.permutation(E)[:K] for _ in range(tokens)]).astype(np.int64),
             rng.random((tokens, K)).astype(np.float32)) for _ in range(args.warmup + args.repeats)]


def measure(layer, args, calls: list[tuple]) -> tuple[dict, np.ndarray]:
    tokens = calls[0][0].shape[0]
    times, first = [], None
    for i, (x, ids, w) in enumerate(calls):
        t0 = time.perf_counter()
        out = layer(x, ids, w)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
        if first is None:
            first = np.asarray(out, np.float64).copy()
    med = float(np.median(times))
    touched = np.mean([len(np.unique(ids)) for _, ids, _ in calls[args.warmup:]])
    gb = touched * layer.expert_bytes / 1e9
    macs = 3 * tokens * args.top_k * args.hidden * args.intermediate
    return {"tokens": tokens, "median_ms": med * 1e3, "spread": float((max(times) - min(times)) / med),
            "GB_per_s": gb / med, "GMAC_per_s": macs / med / 1e9}, first


def kt_kernel_rows(args, type_name: str, blocks, calls: dict) -> dict:
    """{tokens: (kt-kernel row, its first output)} for LLAMAFILE `type_name` on `blocks` and `calls`."""
    data = Path(args.kt_kernel_data)
    data.mkdir(parents=True, exist_ok=True)
    for proj, b in zip(("gate", "up", "down"), blocks):
        np.save(data / f"{proj}.npy", b)
    (data / "shape.json").write_text(json.dumps({"experts": args.experts, "top_k": args.top_k, "hidden": args.hidden,
                                                 "intermediate": args.intermediate}))
    for tokens, c in calls.items():
        np.savez(data / f"inputs_{tokens}.npz", hidden=np.stack([x for x, _, _ in c]),
                 ids=np.stack([i for _, i, _ in c]), weights=np.stack([w for _, _, w in c]))
    python = str(Path(args.kt_kernel_venv) / "bin" / "python")
    cmd = [python, str(Path(__file__).with_name("kt_kernel_llamafile.py")), "--data", str(data), "--type", type_name,
           "--tokens", *map(str, calls), "--threads", str(pool.info().num_threads), "--warmup", str(args.warmup)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"kt-kernel runner failed: {done.stderr[-2000:]}")
    # kt-kernel prints its own chatter to stdout too; the runner's result is the one JSON line.
    rows = json.loads(next(line for line in done.stdout.splitlines() if line.startswith('{"class"')))["rows"]
    return {r["tokens"]: (r, np.load(data / f"kt_kernel_out_{r['tokens']}.npy")) for r in rows}


def llama_cpp_rows(args, types, blocks, calls: dict, write: bool = True) -> dict:
    """{tokens: (llama.cpp row, its first output)} of benchmarks/llama_cpp_moe.cpp on `blocks` and `calls`
    (write=False: the files of the previous call are still there)."""
    exe = Path(args.llama_cpp) / "llama_cpp_moe"
    if not exe.is_file():
        raise SystemExit(f"--llama-cpp {args.llama_cpp}: no {exe}; build it with benchmarks/setup_llama_cpp.sh")
    data = Path(args.kt_kernel_data).with_name("gguf_layer_llama_cpp")
    data.mkdir(parents=True, exist_ok=True)
    for proj, b in zip(("gate", "up", "down"), blocks if write else ()):
        np.ascontiguousarray(b).tofile(data / f"{proj}.bin")
    for tokens, c in calls.items() if write else ():
        with open(data / f"calls_{tokens}.bin", "wb") as f:
            for part, dtype in ((0, np.float32), (1, np.int32), (2, np.float32)):
                np.stack([call[part] for call in c]).astype(dtype).tofile(f)
    cmd = [str(exe), str(data), str(args.hidden), str(args.intermediate), str(args.experts), str(args.top_k),
           str(pool.info().num_threads), str(args.warmup), *types, *map(str, calls)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp runner failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    log(f"  llama.cpp weights: {result['placement']}")
    return {r["tokens"]: (r, np.fromfile(data / f"llama_cpp_out_{r['tokens']}.bin", np.float32).reshape(r["tokens"], -1))
            for r in result["rows"]}


def rel(actual, expected) -> float:
    return float(np.abs(np.asarray(actual, np.float64) - expected).max() / np.sqrt(np.mean(expected ** 2)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 256])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--passes", type=int, default=1,
                    help="measure each method this many times, alternating kt and llama.cpp; medians of the passes")
    ap.add_argument("--json")
    precision = ap.add_mutually_exclusive_group()
    precision.add_argument("--fast-activations", dest="fast_activations", action="store_const", const=True,
                           help="kt's integer kernels take one int8 activation pass on every type")
    precision.add_argument("--precise-activations", dest="fast_activations", action="store_const", const=False,
                           help="two int8 activation passes on every type (default: one, llama.cpp's activation "
                                "blocks: Q8_K, or Q8_0 for the 32-element types)")
    ap.add_argument("--kt-kernel-venv")
    ap.add_argument("--llama-cpp", help="build folder of benchmarks/setup_llama_cpp.sh: adds llama.cpp's columns")
    ap.add_argument("--kt-kernel-data", default=str(Path(__file__).resolve().parent.parent / ".bench" / "gguf_layer_data"))
    args = ap.parse_args()
    pool.configure(args.threads, 0)
    rng = np.random.default_rng(0)
    result = {"host": platform.node(), "threads": pool.info().num_threads, "shape": vars(args), "rows": []}
    calls = {t: make_calls(args, t, rng) for t in args.tokens}   # the same calls for every method and side
    bw = [bandwidth()]
    for name in args.methods:
        log(f"loading {name}")
        layer, blocks = make_layer(name, args, rng)
        types = METHODS[name][1]
        peer = blocks is not None and args.llama_cpp
        outs, kt_passes, lc_passes, lc_out = {}, {t: [] for t in args.tokens}, {t: [] for t in args.tokens}, {}
        # Passes alternate the two sides (kt, llama.cpp, kt, ...), so a slow minute of a noisy host
        # falls on both; each side's figure is the median of its pass medians.
        for p in range(args.passes):
            for tokens in args.tokens:
                row, first = measure(layer, args, calls[tokens])
                outs.setdefault(tokens, first)
                kt_passes[tokens].append(row)
                log(f"{name:15s} T={tokens:4d}  {row['median_ms']:8.3f} ms  {row['GB_per_s']:6.2f} GB/s  "
                    f"{row['GMAC_per_s']:7.1f} GMAC/s  spread {row['spread']:.2f}"
                    + (f"  (pass {p + 1})" if args.passes > 1 else ""))
            if peer:
                log(f"llama.cpp {name}" + (f" (pass {p + 1})" if args.passes > 1 else ""))
                for tokens, (theirs, out) in llama_cpp_rows(args, types, blocks, calls, write=p == 0).items():
                    lc_passes[tokens].append(theirs["median_ms"])
                    lc_out.setdefault(tokens, out)
        for tokens in args.tokens:
            runs = kt_passes[tokens]
            row = {"method": name, "backend": layer.backend, "kernel_id": layer.kernel_id,
                   "kt_activation_planes": 1 if layer.fast_activations else 2,
                   "expert_MiB": layer.expert_bytes / 2**20, **runs[0]}
            med = float(np.median([r["median_ms"] for r in runs]))
            row.update(median_ms=med, GB_per_s=runs[0]["GB_per_s"] * runs[0]["median_ms"] / med,
                       GMAC_per_s=runs[0]["GMAC_per_s"] * runs[0]["median_ms"] / med,
                       spread=float(max(r["spread"] for r in runs)), pass_ms=[r["median_ms"] for r in runs])
            if peer and lc_passes[tokens]:
                truth = reference(blocks, types, calls[tokens][0])
                theirs = float(np.median(lc_passes[tokens]))
                row.update(llama_cpp_ms=theirs, llama_cpp_over_kt=theirs / med, llama_cpp_pass_ms=lc_passes[tokens],
                           kt_error=rel(outs[tokens][:CHECK_TOKENS], truth),
                           llama_cpp_error=rel(lc_out[tokens][:CHECK_TOKENS], truth))
                log(f"  T={tokens}: llama.cpp {theirs:.3f} ms, llama.cpp / kt {row['llama_cpp_over_kt']:.2f}; error vs "
                    f"float64: kt {row['kt_error']:.2e}, llama.cpp {row['llama_cpp_error']:.2e}")
            result["rows"].append(row)
        del layer
        if blocks is not None and args.kt_kernel_venv and METHODS[name][0] == "LLAMAFILE":
            log(f"kt-kernel {name}")
            kk = kt_kernel_rows(args, METHODS[name][1][0], blocks, calls)
            for row in result["rows"]:
                if row["method"] == name and row["tokens"] in kk:
                    theirs, out = kk[row["tokens"]]
                    row["kt_kernel_ms"] = theirs["median_ms"]
                    row["speedup_vs_kt_kernel"] = theirs["median_ms"] / row["median_ms"]
                    ours = outs[row["tokens"]]
                    row["kt_kernel_rel_diff"] = float(np.abs(out - ours).max() / np.sqrt(np.mean(ours ** 2)))
                    log(f"  T={row['tokens']}: kt-kernel {theirs['median_ms']:.3f} ms, kt {row['speedup_vs_kt_kernel']:.2f}x, "
                        f"outputs differ by {row['kt_kernel_rel_diff']:.2e} of the RMS")
    bw.append(bandwidth())
    result["read_bandwidth_GB_per_s"] = bw
    log(f"read bandwidth {bw[0]:.2f} / {bw[1]:.2f} GB/s (start / end)")
    for row in result["rows"]:
        row["bandwidth_share"] = row["GB_per_s"] / float(np.median(bw))
    if args.llama_cpp:   # the table docs/performance.md keeps
        log(f"| format | tokens | {result['threads']} thread(s): llama.cpp / kt ms / ratio | kt's spread | "
            "kt's activation planes | error: kt / llama.cpp |")
        log("|---|---|---|---|---|---|")
        for row in result["rows"]:
            if "llama_cpp_ms" in row:
                log(f"| {row['method'].removeprefix('LLAMAFILE ')} | {row['tokens']} | {row['llama_cpp_ms']:.2f} / "
                    f"{row['median_ms']:.2f} / {row['llama_cpp_over_kt']:.2f} | {row['spread'] * 100:.0f} % | "
                    f"{row['kt_activation_planes']} | {row['kt_error']:.1e} / {row['llama_cpp_error']:.1e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result["rows"], indent=1))


if __name__ == "__main__":
    main()
