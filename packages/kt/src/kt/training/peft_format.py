"""Expert adapters in PEFT's format: what `peft` writes for LoRA on a transformers 5 experts module.

PEFT puts LoRA on a fused 3-D expert parameter with `target_parameters` (lora.ParamWrapper): for
`mlp.experts.gate_up_proj` [E, 2I, H] one `lora_A` Linear(H, r*E) and one `lora_B` Linear(r*E, 2I),
and the same for `down_proj`, with delta W_e = scaling * B_e A_e where A_e is rows e*r .. e*r+r-1 of
lora_A.weight and B_e[:, j] is column j*E + e of lora_B.weight (PEFT's reshapes: A to [E, r, in],
B to [out, r, E]). When both parameters of a module are targeted the second wraps the first, so
the first's tensors sit one `base_layer.` deeper. Keys carry PeftModel's `base_model.model.` prefix.
GPT-OSS's gate_up_proj [E, H, 2I] holds gate and up as even / odd outputs, so its PEFT B rows are
in that order; kt's B is [gate | up] and is reordered on the way out and in. PEFT reads a parameter
as [E, out, in] unless its module says `is_transposed` (GPT-OSS's does): on Llama 4's [E, in, out]
its A is kt's B transposed and its B kt's A transposed (the same delta, in the parameter's orientation).

    save_adapter(model, "out/")          # adapter_config.json + adapter_model.safetensors
    load_adapter(model, "out/")          # into the LoRAExperts of a kt-patched model

`peft.PeftModel.from_pretrained(the same model unpatched, "out/")` loads what save_adapter wrote.
Experts held as one Linear module per expert (DeepSeek's / Kimi-K2's remote code) get PEFT's ordinary
per-module LoRA instead: peft_expert_modules.py.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from kt_core.errors import KTError

from ..integrations.transformers.expert_layout import deinterleave, interleave
from . import peft_expert_modules
from .lora_experts import LoRAExperts

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PREFIX = "base_model.model."
# kt's adapter -> the transformers experts parameter PEFT targets
PARAMETER = {"gate_up": "gate_up_proj", "down": "down_proj"}
_LAYER = re.compile(r"(?:^|\.)layers\.\d+\.")


def _experts(model: nn.Module | Mapping[str, LoRAExperts]) -> dict[str, LoRAExperts]:
    """{module path in the model: LoRAExperts} of a patched model (or such a mapping as given)."""
    if isinstance(model, Mapping):
        found = dict(model)
    else:
        found = {name: m for name, m in model.named_modules() if isinstance(m, LoRAExperts)}
    if not found:
        raise KTError("this model has no kt LoRA experts: patch it with patch_model(model, mode='train') first")
    return found


def _wrapper_paths(targets: tuple[str, ...]) -> dict[str, str]:
    """Where each adapter's lora_A / lora_B live below the experts module (PEFT's nesting)."""
    return {t: "base_layer." * (len(targets) - 1 - i) for i, t in enumerate(targets)}


def _check_uniform(layers: dict[str, LoRAExperts]) -> LoRAExperts:
    first = next(iter(layers.values()))
    if not first.rank:
        raise KTError("these kt experts have no adapters (lora_rank=0: their weights train themselves); save the "
                      "fine-tuned model with model.save_pretrained() instead of an adapter")
    for name, m in layers.items():
        if (m.rank, m.alpha, m.targets) != (first.rank, first.alpha, first.targets):
            raise KTError(f"{name}'s adapter (rank {m.rank}, alpha {m.alpha:g}, {m.targets}) differs from the first's "
                          f"(rank {first.rank}, alpha {first.alpha:g}, {first.targets}); PEFT's config holds one")
    return first


def _to_peft(m: LoRAExperts, t: str, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kt's (A [E, r, in], B [E, out, r]) of adapter `t` as PEFT holds them for the model's parameter."""
    if t == "gate_up" and m.interleaved_gate_up:
        b = interleave(b)
    return (b.transpose(1, 2), a.transpose(1, 2)) if m.peft_in_out_swapped else (a, b)


def _from_peft(m: LoRAExperts, t: str, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of _to_peft."""
    if m.peft_in_out_swapped:
        a, b = b.transpose(1, 2), a.transpose(1, 2)
    return a, deinterleave(b) if t == "gate_up" and m.interleaved_gate_up else b


def _peft_adapters(m: LoRAExperts) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{PEFT target ("gate_up", "down"): (A [E, r', in], B [E, out, r'])} of one layer, all at one rank r'.
    Separate gate and up adapters become one fused gate_up adapter of rank 2r (A's stacked, B
    block-diagonal: the same delta), and down is padded with zero rows / columns to that rank (the
    same delta again), since PEFT's config has one rank; the writer scales alpha with the rank to
    keep alpha / rank."""
    out = {}
    fused = m.gate_up_adapter()
    if fused is not None:
        out["gate_up"] = _to_peft(m, "gate_up", *(t.detach() for t in fused))
    if "down" in m.targets:
        out["down"] = _to_peft(m, "down", m.down_A.detach(), m.down_B.detach())
    rank = max(a.shape[1] for a, _ in out.values())
    for t, (a, b) in out.items():
        pad = rank - a.shape[1]
        if pad:
            out[t] = (torch.cat([a, a.new_zeros(a.shape[0], pad, a.shape[2])], dim=1),
                      torch.cat([b, b.new_zeros(b.shape[0], b.shape[1], pad)], dim=2))
    return out


def adapter_state_dict(model: nn.Module | Mapping[str, LoRAExperts]) -> tuple[dict[str, torch.Tensor], dict]:
    """(PEFT's tensors, PEFT's config) of the model's kt expert adapters."""
    layers = _experts(model)
    first = _check_uniform(layers)
    if first.expert_modules:
        return peft_expert_modules.state_dict(layers, first)
    tensors = {}
    rank = first.rank
    for name, m in layers.items():
        adapters = _peft_adapters(m)
        nest = _wrapper_paths(tuple(adapters))
        for t, (a, b) in adapters.items():
            E, rank, fan_in = a.shape
            base = f"{PREFIX}{name}.{nest[t]}"
            tensors[f"{base}lora_A.weight"] = a.reshape(E * rank, fan_in).contiguous()
            tensors[f"{base}lora_B.weight"] = b.permute(1, 2, 0).reshape(b.shape[1], rank * E).contiguous()
    module = next(iter(layers))
    m = _LAYER.search(module)
    inside = module[m.end():] if m else module   # e.g. "mlp.experts": PEFT matches target_parameters by suffix
    peft_targets = list(_peft_adapters(first))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": first.alpha * rank / first.rank,
        "target_modules": [], "target_parameters": [f"{inside}.{PARAMETER[t]}" for t in peft_targets],
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
        "init_lora_weights": True, "inference_mode": True, "modules_to_save": None, "base_model_name_or_path": None,
    }
    return tensors, config


def save_adapter(model: nn.Module | Mapping[str, LoRAExperts], directory: str | os.PathLike,
                 base_model_name_or_path: str | None = None) -> Path:
    """Write the model's kt expert adapters as a PEFT adapter folder (written aside, then renamed in)."""
    from safetensors.torch import save_file

    tensors, config = adapter_state_dict(model)
    config["base_model_name_or_path"] = base_model_name_or_path
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for fname, write in ((WEIGHTS_NAME, lambda p: save_file(tensors, str(p), metadata={"format": "pt"})),
                         (CONFIG_NAME, lambda p: p.write_text(json.dumps(config, indent=2) + "\n"))):
        tmp = out / f".{fname}.tmp"
        write(tmp)
        os.replace(tmp, out / fname)
    return out


def _config(directory: str | os.PathLike) -> tuple[Path, dict]:
    cfg_path = Path(directory) / CONFIG_NAME
    if not cfg_path.is_file():
        raise KTError(f"{directory} is not a PEFT adapter folder: {CONFIG_NAME} is missing")
    return cfg_path, json.loads(cfg_path.read_text())


def _per_module(config: dict) -> bool:
    """Whether an adapter is PEFT's per-module LoRA (target_modules), not on fused expert parameters."""
    return not config.get("target_parameters")


def adapter_settings(directory: str | os.PathLike) -> tuple[int, float, tuple[str, ...]]:
    """(rank, alpha, kt targets) of a PEFT adapter folder's expert LoRA."""
    cfg_path, config = _config(directory)
    if _per_module(config):
        from safetensors import safe_open

        weights = Path(directory) / WEIGHTS_NAME
        if not weights.is_file():
            raise KTError(f"{directory} is not a PEFT adapter folder: {WEIGHTS_NAME} is missing")
        with safe_open(str(weights), "pt") as f:
            targets = peft_expert_modules.targets_of(f.keys())
        if not targets:
            raise KTError(f"{cfg_path}: no LoRA on the experts — neither target_parameters on their fused "
                          f"{' or '.join(PARAMETER.values())} nor per-expert gate_proj / up_proj / down_proj modules "
                          f"(target_modules: {config.get('target_modules')})")
    else:
        names = {p.rsplit(".", 1)[-1] for p in config.get("target_parameters") or ()}
        targets = tuple(t for t, p in PARAMETER.items() if p in names)
        if not targets:
            raise KTError(f"{cfg_path}: no LoRA on the experts' {' or '.join(PARAMETER.values())} (target_parameters: "
                          f"{config.get('target_parameters')})")
    return int(config.get("r", 0)), float(config.get("lora_alpha", 0)), targets


def load_adapter_tensors(directory: str | os.PathLike, module_path: str,
                         tensors: dict[str, torch.Tensor] | None = None,
                         settings: tuple[int, float, tuple[str, ...]] | None = None,
                         ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{experts parameter name: (A [E, r, in], B [E, out, r])} of the experts module at `module_path`
    in a PEFT adapter folder ({} when the adapter has none for it); `tensors`: the folder's file, read;
    `settings`: its adapter_settings, read (a caller going through every module reads them once)."""
    from safetensors.torch import load_file

    rank, _, targets = settings or adapter_settings(directory)
    if tensors is None:
        tensors = load_file(str(Path(directory) / WEIGHTS_NAME))
    nest = _wrapper_paths(targets)
    found = {}
    for t in targets:
        base = f"{PREFIX}{module_path}.{nest[t]}"
        a, b = tensors.get(f"{base}lora_A.weight"), tensors.get(f"{base}lora_B.weight")
        if a is None or b is None:
            continue
        experts = a.shape[0] // rank
        found[PARAMETER[t]] = (a.reshape(experts, rank, a.shape[1]), b.reshape(b.shape[0], rank, experts).permute(2, 0, 1))
    return found


def merge_expert_adapter(model: nn.Module, directory: str | os.PathLike) -> int:
    """Add a PEFT adapter folder's expert deltas into an unpatched model's expert parameters
    (W_e += alpha / rank * B_e A_e, in the parameter's own orientation and dtype); how many it merged."""
    from safetensors.torch import load_file

    settings = adapter_settings(directory)
    rank, alpha, _ = settings
    tensors = load_file(str(Path(directory) / WEIGHTS_NAME))
    if _per_module(_config(directory)[1]):
        return peft_expert_modules.merge(model, tensors, alpha / rank)
    merged = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            for param_name, (a, b) in load_adapter_tensors(directory, name, tensors, settings).items():
                w = getattr(module, param_name)
                delta = torch.bmm(b, a) * (alpha / rank)   # [E, out, in]
                if getattr(module, "is_transposed", False):   # GPT-OSS keeps [E, in, out]
                    delta = delta.transpose(1, 2)
                w.add_(delta.to(w.dtype))
                merged += 1
    return merged


def load_adapter(model: nn.Module | Mapping[str, LoRAExperts], directory: str | os.PathLike) -> None:
    """Set the model's kt expert adapters from a PEFT adapter folder (one save_adapter or peft wrote)."""
    from safetensors.torch import load_file

    folder = Path(directory)
    cfg_path, weights_path = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    for p in (cfg_path, weights_path):
        if not p.is_file():
            raise KTError(f"{folder} is not a PEFT adapter folder: {p.name} is missing")
    config = json.loads(cfg_path.read_text())
    layers = _experts(model)
    first = _check_uniform(layers)
    if not first.expert_modules and first.targets != tuple(t for t in ("gate_up", "down") if t in first.targets):
        raise KTError(f"{folder}: a PEFT adapter holds one fused gate_up adapter; these experts were patched with "
                      f"separate ones (target={first.targets}): patch with target=('gate_up', 'down') to load it")
    if config.get("peft_type") != "LORA":
        raise KTError(f"{cfg_path}: expected a LoRA adapter, found peft_type {config.get('peft_type')!r}")
    if config.get("r") != first.rank or float(config.get("lora_alpha", 0)) != first.alpha:
        raise KTError(f"{cfg_path}: rank {config.get('r')} / alpha {config.get('lora_alpha')}; the patched experts "
                      f"have rank {first.rank} / alpha {first.alpha:g} (patch with the adapter's)")
    if config.get("use_rslora") or config.get("use_dora") or config.get("lora_bias"):
        raise KTError(f"{cfg_path}: rsLoRA, DoRA and LoRA biases are not supported on kt's experts")
    if first.expert_modules != _per_module(config):
        raise KTError(f"{cfg_path}: an adapter on {'per-expert modules' if _per_module(config) else 'fused expert parameters'}"
                      f"; this model holds its experts {'as one module each' if first.expert_modules else 'fused'} — "
                      "it was written for another implementation of the model")
    if first.expert_modules:
        tensors = load_file(str(weights_path))
        _refuse_extra(tensors, peft_expert_modules.load(layers, tensors, folder), weights_path)
        return
    # PEFT saves target_parameters as a set (any order); its wrappers nest in the experts module's
    # parameter order, gate_up_proj (defined first in transformers 5) innermost.
    params = sorted(p.rsplit(".", 1)[-1] for p in config.get("target_parameters") or ())
    want = sorted(PARAMETER[t] for t in first.targets)
    if params != want:
        raise KTError(f"{cfg_path}: expected a LoRA adapter with target_parameters on {', '.join(want)} (as kt's "
                      f"experts were patched: target={first.targets}); found target_parameters "
                      f"{config.get('target_parameters')}")
    tensors = load_file(str(weights_path))
    used = set()
    with torch.no_grad():
        for name, m in layers.items():
            nest = _wrapper_paths(m.targets)
            for t in m.targets:
                a, b = getattr(m, f"{t}_A"), getattr(m, f"{t}_B")
                peft_a, peft_b = _to_peft(m, t, a, b)
                (E, r, fan_in), fan_out = peft_a.shape, peft_b.shape[1]
                base = f"{PREFIX}{name}.{nest[t]}"
                ka, kb = f"{base}lora_A.weight", f"{base}lora_B.weight"
                for key, shape in ((ka, (E * r, fan_in)), (kb, (fan_out, r * E))):
                    if key not in tensors:
                        raise KTError(f"{weights_path} has no {key}")
                    if tuple(tensors[key].shape) != shape:
                        raise KTError(f"{weights_path}: {key} is {list(tensors[key].shape)}, expected {list(shape)}")
                new_a, new_b = _from_peft(m, t, tensors[ka].reshape(E, r, fan_in),
                                          tensors[kb].reshape(fan_out, r, E).permute(2, 0, 1))
                a.copy_(new_a)
                b.copy_(new_b)
                used.update((ka, kb))
    _refuse_extra(tensors, used, weights_path)


def _refuse_extra(tensors: dict, used: set, weights_path: Path) -> None:
    extra = sorted(set(tensors) - used)
    if extra:
        raise KTError(f"{weights_path} holds tensors kt's experts do not take (LoRA on other modules is PEFT's to "
                      f"load): {', '.join(extra[:4])}{' ...' if len(extra) > 4 else ''}")
