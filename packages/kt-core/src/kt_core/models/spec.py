"""A model's MoE geometry and checkpoint quantization, resolved from its config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import KTError
from .registry import Family, family_for


@dataclass(frozen=True)
class Quantization:
    """How the checkpoint stores expert weights: `method` is the kt method that reads them
    without conversion (BF16 for plain float checkpoints)."""
    method: str                   # BF16, FP8, RAWINT4
    group_size: int = 0           # RAWINT4: elements per scale group
    block: tuple[int, int] = (0, 0)   # FP8: scale block (rows, cols)


@dataclass(frozen=True)
class ModelSpec:
    family: Family
    model_type: str
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int
    num_layers: int
    moe_layers: tuple[int, ...]
    quantization: Quantization

    @property
    def name(self) -> str:
        return self.family.name


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise KTError(f"{model_dir} is not a Hugging Face model folder: no config.json in it")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise KTError(f"{path} is not valid JSON: {exc}") from None


def _first(cfg: dict, keys: tuple[str, ...], what: str, model_type: str):
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    raise KTError(f"config.json of this {model_type} model has none of {', '.join(keys)} ({what})")


def _positive(value, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KTError(f"config.json {key} must be a positive integer, got {value!r}")
    return value


def _quantization(cfg: dict) -> Quantization:
    q = cfg.get("quantization_config")
    if not q:
        return Quantization("BF16")
    kind = q.get("quant_method")
    if kind == "fp8":
        block = tuple(q.get("weight_block_size") or (128, 128))
        if block != (128, 128):
            raise KTError(f"FP8 checkpoint with weight_block_size {list(block)}; kt reads 128x128 blocks")
        return Quantization("FP8", block=(128, 128))
    if kind == "compressed-tensors":
        groups = [g.get("weights", {}) for g in (q.get("config_groups") or {}).values()]
        w = groups[0] if groups else {}
        if (w.get("num_bits"), w.get("type"), w.get("symmetric"), q.get("format")) == (4, "int", True, "pack-quantized"):
            return Quantization("RAWINT4", group_size=int(w.get("group_size") or 32))
        raise KTError(f"compressed-tensors checkpoint with weights {w} (format {q.get('format')!r}); kt reads "
                      "symmetric 4-bit int pack-quantized (Kimi-K2's RAWINT4)")
    raise KTError(f"checkpoint quantization {kind!r} is not one kt reads; supported: none (bf16/fp16/fp32), "
                  "fp8 (128x128 blocks), compressed-tensors int4")


def spec_from_config(cfg: dict) -> ModelSpec:
    model_type = cfg.get("model_type")
    if not model_type:
        raise KTError("config.json has no model_type; kt cannot tell which model family it is")
    fam = family_for(model_type)
    text = cfg.get(fam.text_config_key, cfg) if fam.text_config_key else cfg
    get = lambda keys, what: _first(text, keys, what, model_type)  # noqa: E731
    hidden = _positive(get(fam.hidden_key, "hidden size"), fam.hidden_key[0])
    intermediate = _positive(get(fam.intermediate_key, "expert intermediate size"), fam.intermediate_key[0])
    experts = _positive(get(fam.experts_key, "routed experts per layer"), fam.experts_key[0])
    top_k = _positive(get(fam.top_k_key, "experts per token"), fam.top_k_key[0])
    layers = _positive(get(fam.layers_key, "layer count"), fam.layers_key[0])
    if top_k > experts:
        raise KTError(f"config.json asks for {top_k} experts per token of {experts}")
    dense_prefix = int(text.get(fam.dense_prefix_key) or 0) if fam.dense_prefix_key else 0
    step = int(text.get(fam.sparse_step_key) or 1) if fam.sparse_step_key else 1
    freq = int(text.get(fam.layer_freq_key) or 1) if fam.layer_freq_key else 1
    dense = set(text.get(fam.dense_layers_key) or ()) if fam.dense_layers_key else set()
    moe_layers = tuple(L for L in range(layers)
                       if L >= dense_prefix and (L + 1) % step == 0 and L % freq == 0 and L not in dense)
    if not moe_layers:
        raise KTError(f"this {model_type} config has no MoE layers ({layers} layers, first_k_dense={dense_prefix}, "
                      f"step={step}, dense layers={sorted(dense)})")
    return ModelSpec(fam, model_type, hidden, intermediate, experts, top_k, layers, moe_layers,
                     _quantization(cfg))
