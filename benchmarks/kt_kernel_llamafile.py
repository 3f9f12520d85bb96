"""kt-kernel 0.7.2's LLAMAFILE MoE on the same ggml blocks kt runs; run by gguf_layer.py with the
kt-kernel venv's python (benchmarks/setup_kt_kernel.sh), one process per ggml type.

    .bench/kt-kernel-venv/bin/python benchmarks/kt_kernel_llamafile.py --data DIR --type Q4_K ...

Does what kt_kernel.utils.llamafile.LlamafileMoEWrapper.load_weights does (its MOEConfig:
m_block 32, group_min_len 10, bf16 hidden type, contiguous [E, N, row bytes] weights), on a
one-subpool CPUInfer with --threads workers, as KTMoEWrapper(threadpool_count=1) builds it.
Inputs: DIR/{gate,up,down}.npy (uint8 blocks) and DIR/inputs_{T}.npz (hidden f32, ids, weights
per call), written by gguf_layer.py. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--type", required=True)
    ap.add_argument("--tokens", type=int, nargs="+", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    import kt_kernel_ext
    from kt_kernel_ext.kvcache import ggml_type
    from kt_kernel_ext.moe import MOE, MOEConfig

    import kt_kernel  # noqa: F401  (picks the CPU variant and registers it as module kt_kernel_ext)

    data = Path(args.data)
    gate, up, down = (torch.from_numpy(np.load(data / f"{p}.npy")) for p in ("gate", "up", "down"))
    meta = json.loads((data / "shape.json").read_text())
    E, K, H, I = meta["experts"], meta["top_k"], meta["hidden"], meta["intermediate"]
    wc = kt_kernel_ext.WorkerPoolConfig()
    wc.subpool_count = 1
    wc.subpool_numa_map = [0]
    wc.subpool_thread_count = [args.threads]
    cpu = kt_kernel_ext.CPUInfer(wc)
    mask = torch.zeros(E, dtype=torch.bool)
    cfg = MOEConfig(E, K, H, I, mask.data_ptr())
    cfg.layer_idx = 0
    cfg.pool = cpu.backend_
    cfg.m_block = 32
    cfg.group_min_len = 10
    cfg.max_len = cfg.group_max_len = max(256, max(args.tokens))
    cfg.gate_proj, cfg.up_proj, cfg.down_proj = gate.data_ptr(), up.data_ptr(), down.data_ptr()
    kind = getattr(ggml_type, args.type)
    cfg.gate_type = cfg.up_type = cfg.down_type = kind
    cfg.hidden_type = ggml_type.BF16
    moe = MOE(cfg)
    p2l = torch.arange(E, dtype=torch.int32)   # as the wrapper passes it
    cpu.submit(moe.load_weights_task(p2l.data_ptr()))
    cpu.sync()
    rows = []
    for T in args.tokens:
        inputs = np.load(data / f"inputs_{T}.npz")
        x = torch.from_numpy(inputs["hidden"]).to(torch.bfloat16)
        out = torch.empty((T, H), dtype=torch.bfloat16)
        bsz = torch.tensor([T], dtype=torch.int32)
        times, first = [], None
        for r in range(inputs["ids"].shape[0]):
            ids = torch.from_numpy(np.ascontiguousarray(inputs["ids"][r]))
            wts = torch.from_numpy(np.ascontiguousarray(inputs["weights"][r]))
            task = moe.forward_task(bsz.data_ptr(), K, ids.data_ptr(), wts.data_ptr(), x.data_ptr(), out.data_ptr(), False)
            t0 = time.perf_counter()
            cpu.submit(task)
            cpu.sync()
            dt = time.perf_counter() - t0
            if r >= args.warmup:
                times.append(dt)
            if first is None:
                first = out.float().numpy().copy()
        np.save(data / f"kt_kernel_out_{T}.npy", first)
        med = float(np.median(times))
        rows.append({"tokens": T, "median_ms": med * 1e3, "spread": float((max(times) - min(times)) / med)})
        print(f"kt-kernel LLAMAFILE {args.type} T={T}: {med * 1e3:.3f} ms", file=sys.stderr)
    print(json.dumps({"class": "MOE (llamafile)", "rows": rows}))


if __name__ == "__main__":
    main()
