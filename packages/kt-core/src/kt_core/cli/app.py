"""`kt version`, `kt doctor`, `kt backends`, `kt demo`."""

from __future__ import annotations

import json
import platform

import typer
from rich.console import Console

from .. import __version__

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="kt: run the routed experts of Mixture-of-Experts models on the CPU.")
console = Console()


@app.command()
def version(as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """Versions of kt-core, its plugin ABI, Python, torch and the installed backends."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    from .. import abi_version
    from ..backends import discover

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    backends = {}
    for d in discover():
        name = d.entry_point.split(" =")[0]
        dist = d.entry_point.rsplit("(", 1)[-1].rstrip(")") if "(" in d.entry_point else None
        try:
            backends[name] = dist_version(dist) if dist else None
        except PackageNotFoundError:
            backends[name] = None
    info = {"kt_core": __version__, "plugin_abi": "{}.{}".format(*abi_version()), "python": platform.python_version(),
            "torch": torch_version, "backends": backends}
    if as_json:
        print(json.dumps(info, indent=2))
        return
    console.print(f"kt-core {info['kt_core']} (plugin ABI {info['plugin_abi']}), Python {info['python']}, "
                  f"torch {torch_version or 'not installed'}")
    for name, v in backends.items():
        console.print(f"  backend {name} {v or ''}")


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """What this host offers kt, and the settings kt recommends for it."""
    from .doctor import collect, render

    report = collect()
    if as_json:
        print(json.dumps(report, indent=2, default=str))
    else:
        render(report, console)


@app.command()
def backends(as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """Every discovered backend and variant, its score, and why it won or lost."""
    from .backends_table import render, rows

    data = rows()
    if as_json:
        print(json.dumps(data, indent=2, default=str))
    else:
        render(data, console)


@app.command()
def demo(
    method: str = typer.Option("BF16", help="weight format"),
    hidden: int = typer.Option(2048, help="hidden size (Qwen3-30B-A3B: 2048)"),
    intermediate: int = typer.Option(768, help="expert intermediate size (Qwen3-30B-A3B: 768)"),
    experts: int = typer.Option(32, help="routed experts in the layer (Qwen3-30B-A3B has 128)"),
    top_k: int = typer.Option(8, help="experts per token"),
    tokens: list[int] = typer.Option([1, 16], help="token counts to run"),
    seed: int = typer.Option(0),
) -> None:
    """Run one MoE layer on the CPU with random weights, check it against a float64 NumPy MoE,
    and time it: kt's main job on an embedded default shape."""
    from .demo import run

    run(console, method=method, hidden=hidden, intermediate=intermediate, experts=experts, top_k=top_k,
        tokens=tokens, seed=seed)


def main() -> None:
    app()
