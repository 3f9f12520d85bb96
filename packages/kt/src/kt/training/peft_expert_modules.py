"""Expert adapters in PEFT's format for models whose experts are one MLP module per expert (the
modeling code DeepSeek's and Kimi-K2's checkpoints ship; integrations/transformers/expert_modules.py).

PEFT puts an ordinary LoRA on each expert's Linear layers there: for `mlp.experts.{e}.gate_proj`
`lora_A.weight` [r, H] and `lora_B.weight` [I, r] (up_proj the same, down_proj [r, I] and [H, r]),
keys under PeftModel's `base_model.model.` prefix, and `target_modules` in the config — here a
regular expression naming only the routed experts' projections (a bare "gate_proj" would put
adapters on the shared experts and the dense MLPs too). kt's separate gate / up / down adapters are
exactly these per expert; a fused gate_up adapter is written as gate_proj and up_proj sharing A (the
same delta) and is read back only into separate ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch

from kt_core.errors import KTError

from .lora_experts import LoRAExperts

PREFIX = "base_model.model."
PROJ = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
_LAYER = re.compile(r"(?:^|\.)layers\.\d+\.")
_KEY = re.compile(r"\.(\d+)\.(gate_proj|up_proj|down_proj)\.lora_[AB]\.weight$")


def _per_expert(m: LoRAExperts) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{PEFT projection: (A [E, r, in], B [E, out, r])} of one layer."""
    out = {}
    if "gate_up" in m.targets:
        a, b = m.gate_up_A.detach(), m.gate_up_B.detach()
        half = b.shape[1] // 2
        out["gate_proj"], out["up_proj"] = (a, b[:, :half]), (a, b[:, half:])
    for t in ("gate", "up", "down"):
        if t in m.targets:
            out[PROJ[t]] = (getattr(m, f"{t}_A").detach(), getattr(m, f"{t}_B").detach())
    return out


def state_dict(layers: Mapping[str, LoRAExperts], first: LoRAExperts) -> tuple[dict[str, torch.Tensor], dict]:
    """(PEFT's tensors, PEFT's config) of per-module expert adapters."""
    tensors = {}
    for name, m in layers.items():
        for proj, (a, b) in _per_expert(m).items():
            for e in range(a.shape[0]):
                base = f"{PREFIX}{name}.{e}.{proj}"
                # clone: a fused adapter's gate_proj and up_proj share A, and safetensors stores no aliases
                tensors[f"{base}.lora_A.weight"] = a[e].clone()
                tensors[f"{base}.lora_B.weight"] = b[e].clone()
    module = next(iter(layers))
    found = _LAYER.search(module)
    inside = module[found.end():] if found else module   # e.g. "mlp.experts"
    projs = "|".join(_per_expert(first))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": first.rank, "lora_alpha": first.alpha,
        "target_modules": rf".*\.{re.escape(inside)}\.\d+\.({projs})", "target_parameters": None,
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
        "init_lora_weights": True, "inference_mode": True, "modules_to_save": None, "base_model_name_or_path": None,
    }
    return tensors, config


def targets_of(keys) -> tuple[str, ...]:
    """kt's targets ("gate", "up", "down") of the per-expert projections an adapter's keys hold."""
    projs = {m.group(2) for k in keys if (m := _KEY.search(k))}
    return tuple(t for t, p in PROJ.items() if p in projs)


def load(layers: Mapping[str, LoRAExperts], tensors: dict[str, torch.Tensor], folder: Path) -> set[str]:
    """Set each layer's adapters from per-module tensors; the keys used."""
    used = set()
    with torch.no_grad():
        for name, m in layers.items():
            if "gate_up" in m.targets:
                raise KTError(f"{folder}: this adapter holds gate_proj and up_proj adapters of their own; these "
                              "experts were patched with one fused gate_up adapter: patch with "
                              "target=('gate', 'up', 'down') to load it")
            for t in m.targets:
                a, b = getattr(m, f"{t}_A"), getattr(m, f"{t}_B")
                for e in range(a.shape[0]):
                    base = f"{PREFIX}{name}.{e}.{PROJ[t]}"
                    for key, param, shape in ((f"{base}.lora_A.weight", a, a.shape[1:]),
                                              (f"{base}.lora_B.weight", b, b.shape[1:])):
                        if key not in tensors:
                            raise KTError(f"{folder}: the adapter has no {key}")
                        if tuple(tensors[key].shape) != tuple(shape):
                            raise KTError(f"{folder}: {key} is {list(tensors[key].shape)}, expected {list(shape)}")
                        param[e].copy_(tensors[key])
                        used.add(key)
    return used


def merge(model: torch.nn.Module, tensors: dict[str, torch.Tensor], scaling: float) -> int:
    """Add per-module deltas (W += scaling * B A) into an unpatched model's expert Linear layers; how
    many projections (expert x projection) it merged."""
    modules = dict(model.named_modules())
    merged = 0
    with torch.no_grad():
        for key in tensors:
            if not key.endswith(".lora_A.weight"):
                continue
            name = key[len(PREFIX):-len(".lora_A.weight")]
            linear = modules.get(name)
            if linear is None or not isinstance(getattr(linear, "weight", None), torch.Tensor):
                raise KTError(f"the adapter's {key} names {name}, which this model does not have")
            w = linear.weight
            w.add_((tensors[f"{PREFIX}{name}.lora_B.weight"].float() @ tensors[key].float() * scaling).to(w.dtype))
            merged += 1
    return merged
