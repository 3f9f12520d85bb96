"""Measure one MoE layer per (threads, method, token count), and the host's limits in the same run.

Limits, from the hardware: read bandwidth with the pool's threads (native streaming sum over a
buffer far larger than the caches) and the compute roof, the measured multiply-add peak of the
instructions the method's arithmetic maps to (f32 FMA, bf16 dot, int8 dot; kt_core.probes).
Separately, kt's own kernel peak: the same method on a single small expert whose weights stay
in L2, every token routed to it (what kt's kernels reach when memory is no limit).
Rows: median latency and spread of timed calls after warm-up, tokens/s, GB/s of the distinct
expert bytes a call touches, and the roofline position: the fractions of bandwidth and of the
hardware's compute roof the call reaches, the larger of them naming what bounds it.
"""

from __future__ import annotations

import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kt_core import pool, probes
from kt_core.backends.selection import canonical_method
from kt_core.errors import KTError
from kt_core.host import host
from kt_core.moe import MoE
from kt_core.testing import quantize
from kt_core.testing.reference import random_routing

from ..models.shapes import MoEShape

SCHEMA_VERSION = 2
# The instructions a method's multiply-adds run on, by preference: its compute roof is the
# first this host measures (kt_core.probes.compute_peak_kinds).
ROOF_KINDS = {"FP32": ("f32_fma",), "BF16": ("bf16_dot", "f32_fma"), "FP8": ("bf16_dot", "f32_fma"),
              "FP8_PERCHANNEL": ("bf16_dot", "f32_fma"), "INT8": ("int8_dot",), "INT4": ("int8_dot",),
              "RAWINT4": ("int8_dot",), "MXFP4": ("int8_dot",), "NVFP4": ("int8_dot",),
              "MXFP8": ("bf16_dot", "f32_fma"), "LLAMAFILE": ("int8_dot",)}


class MemoryRefusal(KTError):
    """The layer would not fit in this host's available memory."""


@dataclass
class BenchConfig:
    shape: MoEShape
    methods: list[str]
    tokens: list[int]
    threads: list[int]
    backend: str | None = None
    repeats: int = 5
    warmup: int = 2
    bandwidth_mib: int = 1024
    seed: int = 0
    memory_limit_bytes: int | None = None   # default: MemAvailable
    compare_kt_kernel: str | None = None     # a venv with kt-kernel 0.7.2 (benchmarks/setup_kt_kernel.sh)
    fast_activations: bool = False           # MoE(fast_activations=...): coarser activations, faster prefill
    extra: dict = field(default_factory=dict)


def available_memory() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return host().memory_bytes


def _median_spread(times: list[float]) -> tuple[float, float]:
    med = statistics.median(times)
    return med, (max(times) - min(times)) / med if med else 0.0


def _expert_weights(rng, method: str, hidden: int, intermediate: int):
    """One expert's weights in the form MoE.load_expert takes for `method` (random, trained-like scale)."""
    gate = (rng.standard_normal((intermediate, hidden), dtype=np.float32) / np.float32(np.sqrt(hidden)))
    up = (rng.standard_normal((intermediate, hidden), dtype=np.float32) / np.float32(np.sqrt(hidden)))
    down = (rng.standard_normal((hidden, intermediate), dtype=np.float32) / np.float32(np.sqrt(intermediate)))
    g, u, d, scales, zeros = quantize.checkpoint_arrays(method, gate[None], up[None], down[None])
    first = lambda parts: None if parts is None else tuple(p[0] for p in parts)  # noqa: E731
    return g[0], u[0], d[0], first(scales), first(zeros)


def _time_calls(fn: Callable[[int], None], warmup: int, repeats: int) -> list[float]:
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(warmup + i)
        times.append(time.perf_counter() - t0)
    return times


def measure_bandwidth(mib: int, repeats: int = 5) -> dict:
    """Whole-pool read bandwidth over an interleaved buffer, and per NUMA group with every
    group reading its own node's buffer at once (as the MoE path does)."""
    rates = probes.read_bandwidth(mib, repeats)
    info = pool.info()
    per_group = probes.read_bandwidth_per_group(max(64, mib // len(info.groups)), repeats)
    nodes = [{"group": g, "numa_node": node, "threads": threads,
              "median_gbps": statistics.median(r[g] for r in per_group)}
             for g, (node, threads) in enumerate(info.groups)]
    return {"median_gbps": statistics.median(rates), "best_gbps": max(rates), "buffer_mib": mib, "per_group": nodes}


def measure_peak(method: str, backend: str | None, rng, warmup: int, repeats: int, hidden: int, inter: int,
                 fast_activations: bool = False) -> dict:
    """GMAC/s of the method's kernels on this layer's expert shape when compute is all that
    matters: two experts, 512 tokens each routed to both (512 multiply-adds per weight element
    per call, so streaming the weights costs nothing and the call's fixed costs vanish). The best
    call is the peak (noise only ever slows a call down); the spread says how much the others
    varied."""
    experts, tokens = 2, 512
    layer = MoE(num_experts=experts, top_k=experts, hidden_size=hidden, intermediate_size=inter, method=method,
                max_tokens=tokens, backend=backend, fast_activations=fast_activations)
    for e in range(experts):
        g, u, d, scales, zeros = _expert_weights(rng, method, hidden, inter)
        layer.load_expert(e, g, u, d, scales, zeros)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids = np.tile(np.arange(experts, dtype=np.int64), (tokens, 1))
    w = np.full((tokens, experts), 1.0 / experts, dtype=np.float32)
    times = _time_calls(lambda _: layer(x, ids, w), warmup, repeats)
    _, spread = _median_spread(times)
    return {"gmacs": tokens * experts * 3 * hidden * inter / min(times) / 1e9, "spread": spread}


def run(cfg: BenchConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Run the benchmark; returns the JSON-ready result. Raises MemoryRefusal before allocating
    a layer that would not fit."""
    shape = cfg.shape
    rng = np.random.default_rng(cfg.seed)
    limit = cfg.memory_limit_bytes or available_memory()
    result = {
        "schema_version": SCHEMA_VERSION,
        "machine": {"cpu": host().brand, "isa_level": host().isa_level, "physical_cores": host().physical_cores,
                    "numa_nodes": len(host().numa_nodes), "python": platform.python_version()},
        "shape": asdict(shape),
        "config": {"methods": cfg.methods, "tokens": cfg.tokens, "threads": cfg.threads, "backend": cfg.backend,
                   "repeats": cfg.repeats, "warmup": cfg.warmup, "fast_activations": cfg.fast_activations},
        "bandwidth": {}, "compute_roof": {}, "peak": {}, "layers": {}, "rows": [], "skipped": [],
    }
    say = progress or (lambda _msg: None)
    if cfg.compare_kt_kernel and not (Path(cfg.compare_kt_kernel) / "bin" / "python").is_file():
        raise FileNotFoundError(f"--compare-kt-kernel {cfg.compare_kt_kernel}: no bin/python there; create the venv with "
                                "benchmarks/setup_kt_kernel.sh")
    layers = {}
    for method in cfg.methods:   # size check first: refuse before any large allocation
        try:
            layer = MoE(num_experts=shape.experts, top_k=shape.top_k, hidden_size=shape.hidden,
                        intermediate_size=shape.intermediate, method=method, max_tokens=max(cfg.tokens),
                        backend=cfg.backend, fast_activations=cfg.fast_activations)
        except KTError as exc:
            result["skipped"].append({"method": method, "reason": str(exc)})
            continue
        buffers = 4 * max(cfg.tokens) * shape.top_k * (shape.hidden + shape.intermediate) * 4
        need = shape.experts * layer.expert_bytes + buffers
        if need > 0.9 * limit:
            fit = min(shape.experts - 1, int((0.9 * limit - buffers) // max(1, layer.expert_bytes)))
            advice = f"fewer experts (--experts {fit}), " if fit >= shape.top_k else ""
            raise MemoryRefusal(
                f"{shape.name} with {method} needs about {need / 2**30:.1f} GiB ({shape.experts} experts x "
                f"{layer.expert_bytes / 2**20:.1f} MiB packed, plus buffers); {limit / 2**30:.1f} GiB is available. "
                f"Try {advice}a smaller method (INT4), or a smaller model")
        layers[method] = layer
    # With a kt-kernel comparison both sides read one set of weights and routings (moe_data's
    # files): the same bytes, not merely the same distribution.
    shared_dir = tempfile.TemporaryDirectory(prefix="kt-bench-") if cfg.compare_kt_kernel and layers else None
    shared = Path(shared_dir.name) / "data" if shared_dir else None
    if shared:
        from .kt_kernel import prepare_shared

        say("writing the weights and routings kt and kt-kernel share")
        prepare_shared(shared, shape, list(layers), cfg.tokens, cfg.warmup + cfg.repeats, cfg.seed)
    try:
        _measure(cfg, result, layers, rng, shared, say)
        if cfg.compare_kt_kernel:
            _add_kt_kernel(result, cfg, say, shared)
    finally:
        if shared_dir:
            shared_dir.cleanup()
    result["estimate"] = _model_estimate(result, shape)
    return result


def _inputs(shape: MoEShape, tokens: int, rounds: int, rng, shared: Path | None) -> list[tuple]:
    """(hidden, topk_ids, topk_weights) per call: random, or the shared routings kt-kernel reads."""
    if shared is None:
        return [(rng.standard_normal((tokens, shape.hidden)).astype(np.float32),
                 *random_routing(rng, tokens, shape.experts, shape.top_k)) for _ in range(rounds)]
    from .kt_kernel import moe_data

    hidden, ids, weights = moe_data.load_inputs(shared, tokens)
    x = moe_data.as_bf16_tensor(hidden)
    return [(x, ids[r], weights[r]) for r in range(rounds)]


def _measure(cfg: BenchConfig, result: dict, layers: dict, rng, shared: Path | None, say) -> None:
    shape = cfg.shape
    for threads in cfg.threads:
        pool.configure(num_threads=threads)
        say(f"bandwidth, {threads} thread(s)")
        result["bandwidth"][str(threads)] = measure_bandwidth(cfg.bandwidth_mib)
        say(f"compute roof, {threads} thread(s)")
        roof = result["compute_roof"][str(threads)] = {k: probes.compute_peak(k) for k in probes.compute_peak_kinds()}
        for method, layer in layers.items():
            key = f"{method} N={threads}"
            if method not in result["layers"]:   # load once; later thread counts reuse it
                say(f"loading {method} ({shape.experts} experts)")
                t0 = time.perf_counter()
                if shared:
                    from .kt_kernel import moe_data

                    g, u, d, scales, zeros = moe_data.kt_load_args(shared, method)
                    layer.load(g, u, d, scales=scales, zeros=zeros)
                else:
                    for e in range(shape.experts):
                        g, u, d, scales, zeros = _expert_weights(rng, method, shape.hidden, shape.intermediate)
                        layer.load_expert(e, g, u, d, scales, zeros)
                result["layers"][method] = {"backend": layer.backend, "kernel_id": layer.kernel_id,
                                            "layout_id": layer.layout_id, "expert_bytes": layer.expert_bytes,
                                            "fast_activations": layer.fast_activations,
                                            "load_s": time.perf_counter() - t0}
            say(f"peak compute, {method}, {threads} thread(s)")
            peak = measure_peak(method, cfg.backend, rng, cfg.warmup, cfg.repeats, shape.hidden, shape.intermediate,
                                cfg.fast_activations)
            result["peak"][key] = peak
            bw = result["bandwidth"][str(threads)]["median_gbps"]
            # The hardware's roof for this method's arithmetic; kt's kernel peak where the host
            # measures none of its instructions (a host without AVX2).
            roof_kind = next((k for k in ROOF_KINDS.get(canonical_method(method), ()) if k in roof), "kernel_peak")
            roof_gmacs = roof.get(roof_kind, peak["gmacs"])
            for tokens in cfg.tokens:
                say(f"{method}, {tokens} token(s), {threads} thread(s)")
                inputs = _inputs(shape, tokens, cfg.warmup + cfg.repeats, rng, shared)
                times = _time_calls(lambda i, layer=layer, inputs=inputs: layer(*inputs[i]), cfg.warmup, cfg.repeats)
                med, spread = _median_spread(times)
                distinct = statistics.mean(len(np.unique(ids)) for _, ids, _ in inputs[cfg.warmup:])
                gbps = distinct * layer.expert_bytes / med / 1e9
                macs = tokens * shape.top_k * 3 * shape.hidden * shape.intermediate
                row = {"method": method, "threads": threads, "tokens": tokens, "median_ms": med * 1e3,
                       "spread": spread, "tokens_per_s": tokens / med, "gbps": gbps,
                       "gmacs": macs / med / 1e9, "bandwidth_fraction": gbps / bw,
                       "roof_kind": roof_kind, "compute_fraction": macs / med / 1e9 / roof_gmacs,
                       "kernel_peak_fraction": macs / med / 1e9 / peak["gmacs"]}
                # Bound by whichever limit the call is closer to, read from the two ratios (a token
                # count cannot say it: INT4 at 32 tokens is compute-bound, BF16 is not).
                row["bound"] = "memory" if row["bandwidth_fraction"] >= row["compute_fraction"] else "compute"
                row["roofline_fraction"] = max(row["bandwidth_fraction"], row["compute_fraction"])
                result["rows"].append(row)


def _add_kt_kernel(result: dict, cfg: BenchConfig, say, shared: Path | None) -> None:
    """kt-kernel's latency for the same shape, methods, threads and token counts, measured now
    on the bytes kt ran on, and kt's speedup over it per row."""
    from .kt_kernel import compare

    kk = compare(cfg.compare_kt_kernel, cfg.shape, cfg.methods, cfg.tokens, cfg.threads, cfg.warmup, cfg.repeats, say,
                 data=shared)
    result["kt_kernel"] = {"version": "0.7.2", "skipped": kk["skipped"]}
    for row in result["rows"]:
        ms = kk["rows"].get(f"{row['method']} N={row['threads']} T={row['tokens']}")
        if ms is not None:
            row["kt_kernel_ms"] = ms
            row["speedup_vs_kt_kernel"] = ms / row["median_ms"]


def _model_estimate(result: dict, shape: MoEShape) -> dict:
    """Whole-model decode tokens/s from the 1-token rows, assuming attention and everything else on
    the GPU, all routed experts on this CPU, and layers run one after another."""
    best = {}
    for row in result["rows"]:
        if row["tokens"] == 1:
            ms = best.get(row["method"])
            best[row["method"]] = row["median_ms"] if ms is None else min(ms, row["median_ms"])
    return {"assumption": "attention and dense layers on the GPU (free), all routed experts on this CPU, "
                          f"{shape.moe_layers} MoE layers in sequence",
            "decode_tokens_per_s": {m: 1e3 / (ms * shape.moe_layers) for m, ms in best.items()}}
