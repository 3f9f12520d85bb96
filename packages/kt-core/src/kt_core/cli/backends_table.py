"""`kt backends`: the selection table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..backends import explain
from ..backends.discovery import discover


def rows() -> dict:
    from ..errors import KTError

    try:
        return {"variants": explain(), "error": None}
    except KTError as exc:  # e.g. KT_BACKENDS naming something missing: still show what exists
        found = [{"entry_point": d.entry_point, "error": d.error} for d in discover()]
        return {"variants": [], "error": str(exc), "discovered": found}


def render(data: dict, console: Console) -> None:
    if data["error"]:
        console.print(f"[red]{data['error']}[/red]")
        for d in data.get("discovered", []):
            console.print(f"  {d['entry_point']}" + (f": {d['error']}" if d["error"] else ""))
        return
    table = Table(title="kt backends (best first)")
    for col in ("backend", "variant", "tier", "score", "methods", "chosen for", "why"):
        table.add_column(col)
    for r in data["variants"]:
        style = "green" if r["chosen_for"] else ("" if r["runnable"] else "dim")
        methods = [f"{m} ({', '.join(r['ggml_types'])})" if m == "LLAMAFILE" and r.get("ggml_types") else m
                   for m in r["methods"]]
        table.add_row(r["backend"], r["variant"], r["tier"], str(r["score"]), ", ".join(methods),
                      ", ".join(r["chosen_for"]) or "-", r["reason"], style=style)
    console.print(table)
