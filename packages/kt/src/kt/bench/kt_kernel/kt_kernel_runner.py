"""Time one MoE layer in kt-kernel 0.7.2 (KTransformers) — the baseline side of moe_layer.py.

Run by the kt-kernel venv's python (benchmarks/setup_kt_kernel.sh), one process per (method,
threads) because kt-kernel's CPUInfer pool is per process:

    .bench/kt-kernel-venv/bin/python .../kt_core/bench/kt_kernel/kt_kernel_runner.py --data DIR --method AMXINT8 \
        --threads 1 --tokens 1 32 --warmup 3 --repeats 10 --json OUT.json

DIR is a data directory written by moe_layer.py (see moe_data.py): the same bf16 weights, checkpoint
bytes, hidden states and routings kt reads. This drives kt_kernel_ext directly, as KTMoEWrapper
does internally (/work/shared/KT_KERNEL_0.7.2.md, "Low-level"): WorkerPoolConfig/CPUInfer, MOEConfig,
the backend class the wrapper would pick for the method, load_weights_task, forward_task + sync.
The wrapper itself cannot be constructed with a CPU-only torch (it pins memory), and its forward
adds copies through a staging buffer that are not part of the kernel.

Differences from the wrapper, on purpose:
  - AMXINT8/AMXINT4 quantize online from bf16 with MOEConfig.save=False (the wrapper sets save=True
    and writes every quantized expert to weight_path; forward is the same either way).
  - MOEConfig.max_len (the wrapper's chunked_prefill_size) is the largest token count rounded up to
    a multiple of 256: AMXINT8/AMXINT4 refuse one that is not a multiple of their M_STEP (32).
  - RAWINT4/FP8/BF16 take per-expert pointers into the memory-mapped arrays instead of tensors read
    from safetensors (the wrapper's loaders hand the same bytes: RAWINT4 int32 words are viewed as
    uint8, FP8 bytes and fp32 block scales as stored).
Output: JSON with, per token count, per-call latency statistics and the relative error of the first
rows of the first call's output against the float64 reference (moe_data.moe_reference).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_data  # noqa: E402

METHODS = ("BF16", "AMXINT8", "AMXINT4", "RAWINT4", "FP8", "MXFP4", "NVFP4", "MXFP8")
MAX_LEN_STEP = 256
FORMAT = {"BF16": "BF16", "AMXINT8": "INT8", "AMXINT4": "INT4", "RAWINT4": "RAWINT4", "FP8": "FP8", "MXFP4": "MXFP4",
          "NVFP4": "NVFP4", "MXFP8": "MXFP8"}


def make_pool(threads: int):
    """One subpool on NUMA node 0 with `threads` workers, as KTMoEWrapper(cpuinfer_threads=threads,
    threadpool_count=1) builds it. kt-kernel adds its own task-queue thread, which busy-polls."""
    import kt_kernel_ext

    import kt_kernel  # noqa: F401  (picks the CPU variant and registers it as module kt_kernel_ext)

    wc = kt_kernel_ext.WorkerPoolConfig()
    wc.subpool_count = 1
    wc.subpool_numa_map = [0]
    wc.subpool_thread_count = [threads]
    return kt_kernel_ext.CPUInfer(wc)


def build(method: str, cpu, shape: moe_data.Shape, data: Path, max_len: int, keep: list, scratch: str):
    """Construct and load the kt-kernel backend object; returns (moe, class name)."""
    from kt_kernel_ext.moe import MOEConfig

    from kt_kernel.utils import amx as kt_amx

    E = shape.experts
    mask = torch.zeros(E, dtype=torch.bool)
    keep.append(mask)
    cfg = MOEConfig(E, shape.top_k, shape.hidden, shape.intermediate, mask.data_ptr())
    cfg.layer_idx = 0
    cfg.pool = cpu.backend_
    # chunked_prefill_size in the wrapper. The AMXINT8/AMXINT4 classes refuse a max_len that is not a
    # multiple of their M_STEP (32 here: "BufferAImpl: max_m and k must be multiple of M_STEP and K_STEP"),
    # so round up; it only sizes buffers.
    cfg.max_len = -(-max_len // MAX_LEN_STEP) * MAX_LEN_STEP

    def per_expert(arrays: dict) -> list[list[int]]:
        out = []
        for p in moe_data.PROJS:
            t = torch.from_numpy(arrays[p])
            keep.append(t)
            out.append([[t[e].data_ptr() for e in range(E)]])
        return out

    if method in ("AMXINT8", "AMXINT4"):
        w = moe_data.load_bf16(data)
        tensors = [moe_data.as_bf16_tensor(w[p]) for p in moe_data.PROJS]
        keep.extend(tensors)
        cfg.gate_proj, cfg.up_proj, cfg.down_proj = (t.data_ptr() for t in tensors)
        cfg.save = False  # the wrapper saves the quantized experts to disk as well; not needed here
        cfg.load = False
        cfg.path = scratch
        cls = kt_amx.AMXInt8_MOE if method == "AMXINT8" else kt_amx.AMXInt4_MOE
    elif method == "BF16":
        cfg.gate_projs, cfg.up_projs, cfg.down_projs = per_expert(moe_data.load_bf16(data))
        zeros = [[0] * E]
        cfg.gate_scales, cfg.up_scales, cfg.down_scales = zeros, zeros, zeros
        cls = kt_amx.AMXBF16_MOE or kt_amx.AVX2BF16_MOE
    elif method == "RAWINT4":
        packed, scale = moe_data.load_rawint4(data)
        cfg.gate_projs, cfg.up_projs, cfg.down_projs = per_expert(packed)
        cfg.gate_scales, cfg.up_scales, cfg.down_scales = per_expert(scale)
        cfg.quant_config.bits = 4
        cfg.quant_config.group_size = moe_data.RAWINT4_GROUP
        cfg.quant_config.zero_point = False
        cls = kt_amx._select_rawint4_backend(moe_data.RAWINT4_GROUP)  # the wrapper's own choice
    elif method == "FP8":
        codes, scale = moe_data.load_fp8(data)
        cfg.gate_projs, cfg.up_projs, cfg.down_projs = per_expert(codes)
        cfg.gate_scales, cfg.up_scales, cfg.down_scales = per_expert(scale)
        cfg.quant_config.bits = 8
        cfg.quant_config.group_size = moe_data.FP8_BLOCK
        cfg.quant_config.zero_point = False
        cls = kt_amx.AMXFP8_MOE or kt_amx.AVX2FP8_MOE
    elif method == "MXFP4":
        blocks, scales = moe_data.load_mxfp4(data)
        cfg.gate_projs, cfg.up_projs, cfg.down_projs = per_expert(blocks)
        # The wrapper's loader hands the E8M0 scales over as bf16 (utils/amx.py asserts bf16).
        bf16 = {p: moe_data.e8m0_as_bf16_bits(scales[p]) for p in moe_data.PROJS}
        cfg.gate_scales, cfg.up_scales, cfg.down_scales = per_expert(bf16)
        cfg.quant_config.bits = 4
        cfg.quant_config.group_size = moe_data.MXFP4_BLOCK
        cfg.quant_config.zero_point = False
        cls = kt_amx._select_mxfp4_backend()  # the wrapper's own choice
    elif method == "NVFP4":
        blocks, scales, glob = moe_data.load_nvfp4(data)
        cfg.gate_projs, cfg.up_projs, cfg.down_projs = per_expert(blocks)
        # The wrapper's loader folds e4m3(scale) * weight_scale_2 into one bf16 scale per 16 k.
        bf16 = {p: np.stack([moe_data.nvfp4_as_bf16_scales(scales[p][e], glob[p][e]) for e in range(E)])
                for p in moe_data.PROJS}
        cfg.gate_scales, cfg.up_scales, cfg.down_scales = per_expert(bf16)
        cfg.quant_config.bits = 4
        cfg.quant_config.group_size = moe_data.NVFP4_BLOCK
        cfg.quant_config.zero_point = False
        cls = kt_amx.AVX2MXFP4_MOE   # the wrapper insists on it: only that kernel has the group-16 path
    elif method == "MXFP8":
        codes, scales = moe_data.load_mxfp8(data)
        cfg.gate_projs, cfg.up_projs, cfg.down_projs = per_expert(codes)
        cfg.gate_scales, cfg.up_scales, cfg.down_scales = per_expert(scales)   # uint8 E8M0, as the wrapper passes
        cfg.quant_config.bits = 8
        cfg.quant_config.group_size = moe_data.MXFP8_BLOCK
        cfg.quant_config.zero_point = False
        cls = kt_amx._select_mxfp8_backend()  # the wrapper's own choice
    else:
        raise ValueError(f"unknown method {method}; expected one of {', '.join(METHODS)}")
    if cls is None:
        raise RuntimeError(f"kt-kernel has no backend class for {method} in this build")
    moe = cls(cfg)
    keep.append(cfg)
    p2l = torch.arange(E, dtype=torch.int64)
    keep.append(p2l)
    cpu.submit(moe.load_weights_task(p2l.data_ptr()))
    cpu.sync()
    return moe, cls.__name__


def time_tokens(moe, cpu, shape: moe_data.Shape, data: Path, T: int, args, result: dict) -> dict:
    hidden_bits, ids_all, w_all = moe_data.load_inputs(data, T)
    if ids_all.shape[0] < args.warmup + args.repeats:
        print(f"note: inputs_{T}.npz holds {ids_all.shape[0]} routings, so at most {ids_all.shape[0] - args.warmup} "
              "timed calls (moe_layer.py writes warmup + repeats of them)", file=sys.stderr)
    x = moe_data.as_bf16_tensor(np.ascontiguousarray(hidden_bits)).clone()
    out = torch.empty((T, shape.hidden), dtype=torch.bfloat16)
    bsz = torch.tensor([T], dtype=torch.int32)
    ids = [torch.from_numpy(np.ascontiguousarray(ids_all[r])) for r in range(ids_all.shape[0])]
    wts = [torch.from_numpy(np.ascontiguousarray(w_all[r])) for r in range(w_all.shape[0])]
    checked = []

    def call(r: int) -> float:
        task = moe.forward_task(bsz.data_ptr(), shape.top_k, ids[r].data_ptr(), wts[r].data_ptr(),
                                x.data_ptr(), out.data_ptr(), False)
        t = time.perf_counter()
        cpu.submit(task)
        cpu.sync()
        return time.perf_counter() - t

    if args.quiet_wait > 0:
        moe_data.wait_quiet(args.quiet_wait)
    with moe_data.ForeignLoad() as load:
        row = {"tokens": T, **moe_data.run_protocol(call, ids_all, result["bytes_per_expert"], args.warmup,
                                                    args.repeats, args.budget_s,
                                                    lambda: checked.append(out.float().numpy().copy()))}
    row["foreign_cpu"] = load.fraction
    if args.check_tokens:
        ref = moe_data.reference_output(data, FORMAT[args.method], T, args.check_tokens)
        row["rel_error"] = moe_data.relative_error(checked[0][: len(ref)], ref)
        row["checked_tokens"] = len(ref)
    print(f"kt-kernel {args.method} ({result['class']}) T={T} threads={args.threads}: {row['median_ms']:.3f} ms "
          f"(spread {row['spread']:.0%}, {row['calls']} calls), {row['gbps_median']:.1f} GB/s"
          + (f", rel. error {row['rel_error']:.2e}" if "rel_error" in row else ""), file=sys.stderr)
    return row


def run(args) -> dict:
    import kt_kernel

    torch.set_num_threads(1)  # torch only stages data here; keep its threads off the cores
    data = Path(args.data)
    shape = moe_data.load_shape(data)
    cpu = make_pool(args.threads)
    keep: list = []
    result = {
        "kt_kernel_version": getattr(kt_kernel, "__version__", "?"),
        "cpu_variant": getattr(kt_kernel, "__cpu_variant__", "?"),
        "int8_kernel": getattr(kt_kernel, "__int8_kernel__", None),
        "method": args.method, "threads": args.threads, "shape": shape.name,
    }
    with tempfile.TemporaryDirectory(prefix="kt-kernel-scratch-") as scratch:
        t0 = time.perf_counter()
        moe, cls_name = build(args.method, cpu, shape, data, max(args.tokens), keep, scratch)
        result["class"] = cls_name
        result["load_s"] = time.perf_counter() - t0
        fmt = FORMAT[args.method]
        result["bytes_per_expert"] = moe_data.format_bytes_per_expert(shape, fmt)
        result["rows"] = [time_tokens(moe, cpu, shape, data, T, args, result) for T in args.tokens]
    result["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # incl. mapped weights
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="data directory written by moe_layer.py")
    parser.add_argument("--method", required=True, choices=METHODS)
    parser.add_argument("--threads", type=int, required=True, help="cpuinfer_threads (workers of the one subpool)")
    parser.add_argument("--tokens", type=int, nargs="+", required=True)
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (the first one is the one checked)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=60.0, help="cap on timed seconds per token count")
    parser.add_argument("--check-tokens", type=int, default=32, help="rows checked against float64 (0: no check)")
    parser.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                        help="before each token count wait up to S s for other processes to quiet down")
    parser.add_argument("--json", required=True, help="write the result here")
    args = parser.parse_args()
    if args.warmup < 1 or args.repeats < 1:
        parser.error("--warmup and --repeats must be at least 1")
    result = run(args)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
