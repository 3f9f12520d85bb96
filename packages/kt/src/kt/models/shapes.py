"""MoE layer shapes for `kt bench`: the presets of kt.models (known models' config
excerpts, read through the family registry) or any model folder's config.json."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import ModelSpec, read_config, spec_from_config
from .presets import PRESET_CONFIGS, preset


@dataclass(frozen=True)
class MoEShape:
    name: str
    hidden: int
    intermediate: int     # per routed expert (moe_intermediate_size)
    experts: int          # routed experts per layer
    top_k: int
    moe_layers: int       # layers whose MLP is an MoE block

    @classmethod
    def of(cls, name: str, spec: ModelSpec) -> MoEShape:
        return cls(name, spec.hidden, spec.intermediate, spec.num_experts, spec.top_k, len(spec.moe_layers))


SHAPES = {name: MoEShape.of(name, preset(name)) for name in PRESET_CONFIGS}


def shape_for(model: str) -> MoEShape:
    """A preset name, or a model folder holding a config.json."""
    if model in SHAPES:
        return SHAPES[model]
    if (Path(model) / "config.json").is_file():
        return MoEShape.of(Path(model).name, spec_from_config(read_config(model)))
    raise KeyError(model)
