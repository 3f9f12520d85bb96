"""MoE layer shapes of the model families kt serves, as their config.json files give them.

One entry per model: routed-expert geometry and how many layers are MoE layers (dense layers,
e.g. DeepSeek's first_k_dense_replace, excluded). `kt bench --model NAME` reads this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoEShape:
    name: str
    hidden: int
    intermediate: int     # per routed expert (moe_intermediate_size)
    experts: int          # routed experts per layer
    top_k: int
    moe_layers: int       # layers whose MLP is an MoE block


SHAPES = {s.name: s for s in (
    MoEShape("qwen3-30b-a3b", hidden=2048, intermediate=768, experts=128, top_k=8, moe_layers=48),
    MoEShape("qwen3-235b-a22b", hidden=4096, intermediate=1536, experts=128, top_k=8, moe_layers=94),
    MoEShape("deepseek-v3", hidden=7168, intermediate=2048, experts=256, top_k=8, moe_layers=58),
    MoEShape("kimi-k2", hidden=7168, intermediate=2048, experts=384, top_k=8, moe_layers=60),
    MoEShape("mixtral-8x7b", hidden=4096, intermediate=14336, experts=8, top_k=2, moe_layers=32),
    MoEShape("olmoe-1b-7b", hidden=2048, intermediate=1024, experts=64, top_k=8, moe_layers=16),
)}
