"""Regenerate the measured sections of docs/performance.md from the JSON `nox -s bench` writes.

    python benchmarks/update_docs.py [--results results] [--doc docs/performance.md]

Each generated section sits between `<!-- generated: NAME -->` and `<!-- end generated: NAME -->`
and is replaced whole; text outside them is the hand-written analysis and is left alone. A
section whose JSON is missing keeps its previous content (and the script says so).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import report as moe_layer_report  # noqa: E402  (benchmarks/report.py)

from kt.bench.report import markdown as kt_bench_markdown  # noqa: E402


def overhead(result: dict) -> str:
    return "```json\n" + json.dumps(result, indent=1) + "\n```"


def load_weights(result: dict) -> str:
    out = [f"`{result.get('command', 'python benchmarks/load_weights.py')}`, {result['machine']['threads']} threads.", "",
           "| source | route | scope | cache | s | ready GB/s | vs copy | vs fresh copy | vs disk |",
           "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        out.append(f"| {r['source']} | {r.get('route', '')} | {r['scope']} | {r['cache']} | {r['seconds']:.3f} | "
                   f"{r['ready_gbps']:.2f} | "
                   f"{r['vs_copy']:.2f} | {r['vs_fresh_copy']:.2f} | {r['vs_disk']:.2f} |")
    return "\n".join(out)


SECTIONS = {
    "kt_bench_qwen3": ("kt_bench_qwen3.json", lambda r: kt_bench_markdown(
        r, "kt bench --model qwen3-30b-a3b --method BF16 --method INT8 --method INT4")),
    "moe_layer": ("moe_layer.json", moe_layer_report.table),
    "load_weights": ("load_weights.json", load_weights),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results")
    ap.add_argument("--doc", default="docs/performance.md")
    args = ap.parse_args()
    doc = Path(args.doc).read_text()
    for name, (file, render) in SECTIONS.items():
        path = Path(args.results) / file
        pattern = re.compile(rf"(<!-- generated: {name} -->\n).*?(\n<!-- end generated: {name} -->)", re.S)
        if not pattern.search(doc):
            print(f"{args.doc} has no generated section {name!r}; add the two markers to place it")
            continue
        if not path.is_file():
            print(f"{path} missing: section {name!r} left as it was")
            continue
        body = render(json.loads(path.read_text()))
        doc = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2), doc)
        print(f"section {name!r} regenerated from {path}")
    Path(args.doc).write_text(doc)


if __name__ == "__main__":
    main()
