"""Render benchmarks/moe_layer.py JSON results as the Markdown tables of docs/performance.md.

    python benchmarks/report.py results/moe_layer_qwen3.json [more.json ...]
"""

from __future__ import annotations

import json
import sys


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(result: dict) -> str:
    bw = result["bandwidth"]
    out = []
    args = result["args"]
    fast = ""
    if args.get("kt_fast_activations"):
        fast = " (kt: fast_activations: one int8 activation pass, or bf16 activations for BF16/FP8)"
    for shape in result["shapes"]:
        s = shape["shape"]
        out.append(f"**{s['name']}** (hidden {s['hidden']}, intermediate {s['intermediate']}, {s['experts']} experts, "
                   f"top-{s['top_k']}){fast}; read bandwidth "
                   + ", ".join(f"{n} thread(s) {b['gbps']:.1f} GB/s"
                               for n, b in sorted(bw.items())) + "\n")
        out.append("| method | tokens | threads | kt ms | kt % of bandwidth | kt % of adjacent probes | torch bf16 ms "
                   "| kt × torch | kt-kernel ms | kt × kt-kernel | err kt | err kt-kernel |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in shape["rows"]:
            kt, tc, kk = r.get("kt") or {}, r.get("torch") or {}, r.get("kt_kernel") or {}
            k_ms, t_ms, kk_ms = kt.get("median_ms"), tc.get("median_ms"), kk.get("median_ms")
            pct = kt.get("pct_bandwidth") if r["tokens"] <= 32 else None
            adj = kt.get("pct_adjacent_bandwidth")
            out.append(f"| {r['method']} | {r['tokens']} | {r['threads']} | {fmt(k_ms, '.2f')} | "
                       f"{fmt(pct, '.0f')}{'%' if pct is not None else ''} | "
                       f"{fmt(adj, '.0f')}{'%' if adj is not None else ''} | {fmt(t_ms, '.2f')} | "
                       f"{fmt(t_ms / k_ms if k_ms and t_ms else None, '.2f')} | {fmt(kk_ms, '.2f')} | "
                       f"{fmt(kk_ms / k_ms if k_ms and kk_ms else None, '.2f')} | {fmt(kt.get('rel_error'), '.1e')} | "
                       f"{fmt(kk.get('rel_error'), '.1e')} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(table(json.load(open(path))))
