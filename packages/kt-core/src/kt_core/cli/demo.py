"""`kt demo`: one MoE layer on the CPU, checked against float64 NumPy, and timed."""

from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.table import Table

from ..moe import MoE
from ..pool import info
from ..testing.reference import bf16_round, moe_reference, random_moe, random_routing, relative_error


def run(console: Console, *, method: str, hidden: int, intermediate: int, experts: int, top_k: int,
        tokens: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    gate, up, down = random_moe(rng, experts, hidden, intermediate)
    layer = MoE(num_experts=experts, top_k=top_k, hidden_size=hidden, intermediate_size=intermediate,
                method=method, max_tokens=max(tokens))
    p = info()
    console.print(f"MoE layer: {experts} experts, top-{top_k}, hidden {hidden}, intermediate {intermediate}, "
                  f"method {layer.method} on [bold]{layer.backend}[/bold] ({layer.kernel_id}), "
                  f"{p.num_threads} threads")
    t0 = time.perf_counter()
    layer.load(gate, up, down)
    console.print(f"packed {layer.packed_bytes / 2**20:.0f} MiB of expert weights in {time.perf_counter() - t0:.2f} s")
    # The kernel's error is measured against float64 over the weights the format stores.
    stored = [bf16_round(m) for m in (gate, up, down)] if layer.method == "BF16" else [gate, up, down]
    table = Table()
    for col in ("tokens", "latency", "tokens/s", "error vs float64 (max/RMS)"):
        table.add_column(col, justify="right")
    for t in tokens:
        x = rng.standard_normal((t, hidden)).astype(np.float32)
        ids, w = random_routing(rng, t, experts, top_k)
        out = layer(x, ids, w)
        times = []
        for _ in range(3):
            s = time.perf_counter()
            layer(x, ids, w)
            times.append(time.perf_counter() - s)
        err = relative_error(out, moe_reference(x, *stored, ids, w))
        best = min(times)
        table.add_row(str(t), f"{best * 1e3:.2f} ms", f"{t / best:.1f}", f"{err:.2e}")
        if not err < 1e-4:
            raise SystemExit(f"kt demo: output differs from the float64 reference by {err:.2e} (max/RMS)")
    console.print(table)
    console.print("[green]output matches the float64 NumPy MoE[/green]")
