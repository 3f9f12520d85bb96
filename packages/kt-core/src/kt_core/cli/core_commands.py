"""kt-core's own commands, in plain text: `kt version`, `kt doctor`, `kt backends`.

One line per backend variant at any terminal width (long reasons are cut at the edge;
--verbose prints them whole, --json everything). Errors are one line and exit 1."""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version

from ..errors import KTError
from . import CORE_COMMANDS


def _dist_version(name: str) -> str | None:
    try:
        return dist_version(name)
    except PackageNotFoundError:
        return None


def version_info() -> dict:
    """Imports nothing it does not print: torch's version comes from its metadata, not its import."""
    from .. import __version__, abi_version
    from ..backends import discover

    backends = {}
    for d in discover():
        name = d.entry_point.split(" =")[0]
        dist = d.entry_point.rsplit("(", 1)[-1].rstrip(")") if "(" in d.entry_point else None
        backends[name] = _dist_version(dist) if dist else None
    return {"kt_core": __version__, "kt": _dist_version("kt"), "plugin_abi": "{}.{}".format(*abi_version()),
            "python": platform.python_version(), "torch": _dist_version("torch"), "backends": backends}


def render_version(info: dict, verbose: bool) -> None:
    print(f"kt-core {info['kt_core']} (plugin ABI {info['plugin_abi']}), kt {info['kt'] or 'not installed'}, "
          f"Python {info['python']}, torch {info['torch'] or 'not installed'}")
    for name, v in info["backends"].items():
        print(f"  backend {name} {v or ''}".rstrip())


def backend_rows() -> dict:
    from ..backends import explain
    from ..backends.discovery import discover

    try:
        return {"variants": explain(), "error": None}
    except KTError as exc:  # e.g. KT_BACKENDS naming something missing: still show what exists
        found = [{"entry_point": d.entry_point, "error": d.error} for d in discover()]
        return {"variants": [], "error": str(exc), "discovered": found}


def score_text(score) -> str:
    """(tier, rank) of a runnable variant as "tier.rank"; 0 for one that cannot run here."""
    return "{}.{}".format(*score) if score else "0"


def _methods_text(row: dict, verbose: bool) -> str:
    out = []
    for m in row["methods"]:
        types = row.get("ggml_types") or []
        if m == "LLAMAFILE" and types and verbose:
            m += f" ({', '.join(types)})"
        elif m == "LLAMAFILE" and types:
            m += f"({len(types)} types)"
        out.append(m)
    return ",".join(out) or "-"


def _table(rows: list[list[str]], header: list[str], verbose: bool, indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell, each line indented; the last column is cut at the terminal's edge."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    cols = shutil.get_terminal_size((120, 24)).columns
    lines = []
    for r in [header, *rows]:
        line = indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]
        if not verbose and len(line) > cols:
            line = line[:max(cols - 1, 40)] + "…"
        lines.append(line)
    return lines


def backend_lines(variants: list[dict], verbose: bool) -> list[str]:
    """backend/variant, score, the methods it serves ("all" when every one it has), why; with
    --verbose also every method it has, and nothing is cut."""
    rows = []
    for r in variants:
        chosen = r["chosen_for"]
        serves = "all" if chosen and set(chosen) == set(r["methods"]) else ",".join(chosen) or "-"
        why = "chosen: the best runnable variant for these" if chosen else r["reason"]
        rows.append([f"{r['backend']}/{r['variant']}", score_text(r["score"]), serves]
                    + ([_methods_text(r, verbose)] if verbose else []) + [why])
    header = ["backend/variant", "score", "serves"] + (["methods"] if verbose else []) + ["why"]
    return _table(rows, header, verbose)


def render_backends(data: dict, verbose: bool) -> None:
    if data["error"]:
        print(f"kt backends: {data['error']}", file=sys.stderr)
        for d in data.get("discovered", []):
            print(f"  {d['entry_point']}" + (f": {d['error']}" if d["error"] else ""))
        return
    print("kt backends, best first (score = tier.rank, 0 = cannot run here):")
    for line in backend_lines(data["variants"], verbose):
        print(line)


def _gib(n) -> str:
    return "?" if not n else f"{n / 2**30:.1f} GiB"


def pool_text(p: dict) -> str:
    """Slot 0 is the calling thread: it works too, and is not pinned (it is the caller's)."""
    workers = [c for c in p["pinned_cpus"][1:]]
    pinned = [c for c in workers if c >= 0]
    groups = ", ".join(f"node {node}: {threads}" for node, threads in p["groups"])
    text = f"{p['threads']} threads (the calling thread + {len(workers)} workers"
    if workers:
        text += f", pinned to CPUs {pinned}" if len(pinned) == len(workers) else f", {len(pinned)} pinned"
    return text + f"); threads per group: {groups}"


def render_doctor(r: dict, verbose: bool) -> None:
    cpu, cores, mem = r["cpu"], r["cores"], r["memory"]
    print(f"CPU       {cpu['brand']} ({cpu['vendor']}, {cpu['arch']}), ISA level {cpu['isa_level']}"
          + (f" (capped by KT_MAX_ISA={cpu['max_isa']})" if cpu["max_isa"] else ""))
    print(f"features  {' '.join(cpu['features'])}"
          + (f"; SVE vectors of {cpu['sve_vector_bits']} bits" if cpu.get("sve_vector_bits") else ""))
    for note in cpu["notes"]:
        print(f"  note: {note}")
    print(f"cores     {cores['physical']} physical, {cores['logical']} logical; L2 {cores['l2_bytes'] // 1024} KiB, "
          f"L3 {cores['l3_bytes'] // 2**20} MiB ({cores['topology_source']})")
    for n in r["numa"]:
        print(f"NUMA      node {n['node']}: {_gib(n['memory_bytes'])}, cores {n['cores']}")
    print(f"memory    {_gib(mem['total_bytes'])} total, {_gib(mem['available_bytes'])} available; transparent huge "
          f"pages: {mem['transparent_hugepages']}; reserved huge pages: {mem['hugepages_total']}")
    print(f"pool      {pool_text(r['pool'])}")
    if r["backend_error"]:
        print(f"kt doctor: {r['backend_error']}", file=sys.stderr)
    else:
        print("backends  (score = tier.rank, 0 = cannot run here)")
        for line in backend_lines(r["backends"], verbose):
            print(line)
    for b in r["device_bridges"]:
        print(f"device    {b['kind']} bridge ({b['entry_point']}): {'used' if b['usable'] else 'unused'}: {b['why']}")
    rec = r["recommended"]
    print(f"recommended cpuinfer_threads={rec['cpuinfer_threads']}: {rec['cpuinfer_threads_reason']}")
    print(f"recommended threadpool_count={rec['threadpool_count']}: {rec['threadpool_count_reason']}")


def _collect(command: str):
    if command == "version":
        return version_info(), render_version
    if command == "doctor":
        from .doctor import collect

        return collect(), render_doctor
    return backend_rows(), render_backends


def run(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"kt {command}", description=CORE_COMMANDS[command])
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--verbose", "-v", action="store_true", help="long reasons and lists in full")
    args = parser.parse_args(argv)
    try:
        data, render = _collect(command)
    except (KTError, ValueError) as exc:
        print(f"kt {command}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        render(data, args.verbose)
    # A selection error (KT_BACKENDS, KT_CPU_VARIANT naming what cannot run) is a failure, shown with what exists.
    return 1 if data.get("error") or data.get("backend_error") else 0
