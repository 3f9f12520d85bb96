"""Run by kt-kernel 0.7.2's venv (benchmarks/setup_kt_kernel.sh): quantize one MoE layer with
AMXINT8 / AMXINT4, let kt-kernel save it as its wrapper does (`_layer_0/_numa_N/*.kt` under OUT),
and run kt-kernel's own forward on given inputs, so kt can be checked against both.

    python kt_kernel_dump.py --weights W.npz --inputs X.npz --method AMXINT4 --slices 2 --out DIR

W.npz: gate/up [E, I, H], down [E, H, I] float32 (rounded to bf16 here, as kt-kernel takes them);
X.npz: hidden [T, H] float32, ids [T, k] int64, weights [T, k] float32. Writes DIR/output.npy.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--method", choices=("AMXINT8", "AMXINT4"), required=True)
    ap.add_argument("--slices", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    # kt_kernel picks the CPU variant and registers it as module kt_kernel_ext: take it from there,
    # so no import sorting can put kt_kernel_ext first.
    from kt_kernel import kt_kernel_ext
    from kt_kernel.utils import amx as kt_amx

    MOEConfig = kt_kernel_ext.moe.MOEConfig

    torch.set_num_threads(1)
    w = np.load(args.weights)
    x = np.load(args.inputs)
    E, I, H = w["gate"].shape
    k = x["ids"].shape[1]
    wc = kt_kernel_ext.WorkerPoolConfig()
    wc.subpool_count = args.slices                 # one subpool per NUMA slice, all on node 0
    wc.subpool_numa_map = [0] * args.slices
    wc.subpool_thread_count = [1] * args.slices
    cpu = kt_kernel_ext.CPUInfer(wc)
    mask = torch.zeros(E, dtype=torch.bool)
    cfg = MOEConfig(E, k, H, I, mask.data_ptr())
    cfg.layer_idx = 0
    cfg.pool = cpu.backend_
    cfg.max_len = 256
    tensors = [torch.from_numpy(np.ascontiguousarray(w[p])).to(torch.bfloat16).contiguous() for p in ("gate", "up", "down")]
    cfg.gate_proj, cfg.up_proj, cfg.down_proj = (t.data_ptr() for t in tensors)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg.save, cfg.load, cfg.path = True, False, str(out_dir.resolve())
    moe = (kt_amx.AMXInt8_MOE if args.method == "AMXINT8" else kt_amx.AMXInt4_MOE)(cfg)
    p2l = torch.arange(E, dtype=torch.int64)
    cpu.submit(moe.load_weights_task(p2l.data_ptr()))
    cpu.sync()

    T = x["hidden"].shape[0]
    hidden = torch.from_numpy(x["hidden"]).to(torch.bfloat16).contiguous()
    ids = torch.from_numpy(np.ascontiguousarray(x["ids"]))
    wts = torch.from_numpy(np.ascontiguousarray(x["weights"]))
    out = torch.zeros((T, H), dtype=torch.bfloat16)
    bsz = torch.tensor([T], dtype=torch.int32)
    cpu.submit(moe.forward_task(bsz.data_ptr(), k, ids.data_ptr(), wts.data_ptr(), hidden.data_ptr(), out.data_ptr(),
                                False))
    cpu.sync()
    np.save(out_dir / "output.npy", out.float().numpy())


if __name__ == "__main__":
    main()
