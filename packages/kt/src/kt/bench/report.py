"""Render `kt bench` results: a Rich table and a PNG (latency and roofline position)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def render(result: dict, console: Console) -> None:
    s = result["shape"]
    bw = ", ".join(f"{n} thread(s) {b['median_gbps']:.1f} GB/s" for n, b in result["bandwidth"].items())
    console.print(f"[bold]{s['name']}[/bold]: hidden {s['hidden']}, intermediate {s['intermediate']}, "
                  f"{s['experts']} experts, top-{s['top_k']}; read bandwidth {bw}")
    if result["config"].get("fast_activations"):
        console.print("kt: fast_activations (one int8 activation pass; bf16 activations for BF16 and FP8)")
    for n, b in result["bandwidth"].items():
        groups = b.get("per_group", [])
        if len(groups) > 1:
            console.print(f"{n} thread(s), per NUMA group, all at once: " + ", ".join(
                f"group {g['group']} (node {g['numa_node']}, {g['threads']} thr) {g['median_gbps']:.1f} GB/s" for g in groups))
    for n, roof in result["compute_roof"].items():
        console.print(f"compute roof (hardware, measured), {n} thread(s): "
                      + ", ".join(f"{k} {v:.1f} GMAC/s" for k, v in roof.items()))
    for key, peak in result["peak"].items():
        console.print(f"kt's kernel peak {key} (cache-resident expert): {peak['gmacs']:.1f} GMAC/s")
    table = Table()
    compared = "kt_kernel" in result
    for col in ("method", "threads", "tokens", "latency ms", "±", "tokens/s", "GB/s", "GMAC/s", "roofline",
                *(("kt-kernel ms", "kt ×") if compared else ())):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        what = "of bandwidth" if r["bound"] == "memory" else f"of {r['roof_kind']}"
        extra = (f"{r['kt_kernel_ms']:.2f}", f"{r['speedup_vs_kt_kernel']:.2f}") if "kt_kernel_ms" in r else ("-", "-")
        table.add_row(r["method"], str(r["threads"]), str(r["tokens"]), f"{r['median_ms']:.2f}", f"{r['spread']:.0%}",
                      f"{r['tokens_per_s']:.1f}", f"{r['gbps']:.1f}", f"{r['gmacs']:.1f}",
                      f"{r['roofline_fraction']:.0%} {what}", *(extra if compared else ()))
    console.print(table)
    for skip in result["skipped"]:
        console.print(f"[yellow]skipped {skip['method']}: {skip['reason']}[/yellow]")
    for skip in result.get("kt_kernel", {}).get("skipped", []):
        console.print(f"[yellow]kt-kernel: no figure for {skip}[/yellow]")
    est = result["estimate"]
    for method, tps in est["decode_tokens_per_s"].items():
        console.print(f"whole-model decode estimate, {method}: [bold]{tps:.1f} tokens/s[/bold] ({est['assumption']})")


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, roof) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = {}
    for r in result["rows"]:
        series.setdefault((r["method"], r["threads"]), []).append(r)
    for (method, threads), rows in sorted(series.items()):
        rows.sort(key=lambda r: r["tokens"])
        label = f"{method}, {threads} thr"
        lat.plot([r["tokens"] for r in rows], [r["median_ms"] for r in rows], marker="o", label=label)
        roof.plot([r["tokens"] for r in rows], [100 * r["roofline_fraction"] for r in rows], marker="o", label=label)
    s = result["shape"]
    for ax in (lat, roof):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per call")
        ax.grid(True, which="both", alpha=0.3)
    lat.set_yscale("log")
    lat.set_ylabel("latency (ms)")
    lat.set_title(f"{s['name']}: one MoE layer")
    roof.set_ylabel("% of the host's limit")
    roof.set_title("roofline position: the nearer limit, bandwidth or the hardware's compute roof")
    roof.set_ylim(0, 110)
    lat.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict, command: str) -> str:
    """The result as a Markdown section for docs/performance.md: command, machine, limits, rows."""
    s, m = result["shape"], result["machine"]
    out = [f"`{command}` — {m['cpu']} ({m['isa_level']}, {m['physical_cores']} cores, {m['numa_nodes']} NUMA node(s)); "
           f"{s['name']}: hidden {s['hidden']}, intermediate {s['intermediate']}, {s['experts']} experts, top-{s['top_k']}.",
           ""]
    for n, b in result["bandwidth"].items():
        groups = "; per NUMA group: " + ", ".join(f"{g['median_gbps']:.1f}" for g in b.get("per_group", [])) + " GB/s" \
            if len(b.get("per_group", [])) > 1 else ""
        out.append(f"- read bandwidth, {n} thread(s): {b['median_gbps']:.1f} GB/s (median){groups}")
    for n, roof in result["compute_roof"].items():
        out.append(f"- compute roof (hardware), {n} thread(s): " + ", ".join(f"{k} {v:.1f} GMAC/s" for k, v in roof.items()))
    for key, peak in result["peak"].items():
        out.append(f"- kt's kernel peak {key}: {peak['gmacs']:.1f} GMAC/s")
    compared = "kt_kernel" in result
    out += ["", "| method | threads | tokens | ms | spread | tokens/s | GB/s | GMAC/s | roofline |"
            + (" kt-kernel ms | kt × kt-kernel |" if compared else ""),
            "|---|---:|---:|---:|---:|---:|---:|---:|---|" + ("---:|---:|" if compared else "")]
    for r in result["rows"]:
        what = "bandwidth" if r["bound"] == "memory" else r["roof_kind"]
        row = (f"| {r['method']} | {r['threads']} | {r['tokens']} | {r['median_ms']:.2f} | {r['spread']:.0%} | "
               f"{r['tokens_per_s']:.1f} | {r['gbps']:.1f} | {r['gmacs']:.1f} | {r['roofline_fraction']:.0%} of {what} |")
        if compared:
            row += (f" {r['kt_kernel_ms']:.2f} | {r['speedup_vs_kt_kernel']:.2f} |" if "kt_kernel_ms" in r else " - | - |")
        out.append(row)
    est = result["estimate"]
    out += ["", "Whole-model decode estimate (" + est["assumption"] + "): "
            + ", ".join(f"{k} {v:.1f} tokens/s" for k, v in est["decode_tokens_per_s"].items()) + "."]
    out += [f"Skipped {s['method']}: {s['reason']}." for s in result["skipped"]]
    return "\n".join(out)
