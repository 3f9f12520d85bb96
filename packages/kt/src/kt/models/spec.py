"""A model's MoE geometry and checkpoint quantization, resolved from its config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kt_core.errors import KTError

from .registry import Family, family_for


@dataclass(frozen=True)
class Quantization:
    """How the checkpoint stores expert weights: `method` is the kt method that reads them
    without conversion (BF16 for plain float checkpoints)."""
    method: str                   # BF16, FP8, RAWINT4, GPTQ_INT4, NVFP4, MXFP8, MXFP4
    group_size: int = 0           # RAWINT4, GPTQ_INT4, NVFP4, MXFP8: elements per scale group
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
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise KTError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):   # fuzzing: a JSON list or number used to raise AttributeError later
        raise KTError(f"{path} should hold a JSON object of model settings; found a {type(cfg).__name__}")
    return cfg


def _first(cfg: dict, keys: tuple[str, ...], what: str, model_type: str):
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    raise KTError(f"config.json of this {model_type} model has none of {', '.join(keys)} ({what})")


# No real model comes near these; a corrupted config.json can hold any integer, and the
# MoE-layer rule below walks every layer (fuzzing: 10**18 layers hung the reader).
MAX_LAYERS = 1 << 16


def one_per_layer(value):
    """A setting some configs give once per layer (HunYuan's moe_topk): its value when every layer's
    is the same; the list as it is otherwise (refused by the caller's check)."""
    if isinstance(value, list | tuple) and value and all(v == value[0] for v in value):
        return value[0]
    return value


def _positive(value, key: str) -> int:
    value = one_per_layer(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KTError(f"config.json {key} must be a positive integer, got {value!r}")
    return value


def _int_setting(text: dict, key: str | None, default):
    """An optional integer layer-rule setting (first_k_dense_replace, ...); KTError when it is not one."""
    if not key or text.get(key) is None:
        return default
    value = text[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise KTError(f"config.json {key} must be an integer, got {value!r}")
    return value


def _quantization(cfg: dict) -> Quantization:
    q = cfg.get("quantization_config")
    if not q:
        return Quantization("BF16")
    if not isinstance(q, dict):
        raise KTError(f"config.json quantization_config should be a JSON object, found {q!r}")
    kind = q.get("quant_method")
    if kind == "fp8" and q.get("scale_fmt") == "ue8m0" and list(q.get("weight_block_size") or ()) == [1, 32]:
        return Quantization("MXFP8", group_size=32)   # E4M3 with an E8M0 exponent per 32 k (OCP MX)
    if kind == "mxfp8":
        return Quantization("MXFP8", group_size=32)
    if kind == "mxfp4":   # GPT-OSS: experts as *_blocks / *_scales, E8M0 per 32
        return Quantization("MXFP4", group_size=32)
    if kind == "modelopt":
        algo = q.get("quant_algo") or (q.get("quantization") or {}).get("quant_algo")
        group = q.get("group_size") or (q.get("quantization") or {}).get("group_size") or 16
        if algo != "NVFP4" or group != 16:
            raise KTError(f"ModelOpt checkpoint with quant_algo {algo!r}, group_size {group!r}; kt reads NVFP4 "
                          "(E2M1 weights, E4M3 scales per 16, a per-tensor global scale)")
        return Quantization("NVFP4", group_size=16)
    if kind == "fp8":
        block = q.get("weight_block_size") or (128, 128)
        if not isinstance(block, list | tuple) or tuple(block) != (128, 128):
            raise KTError(f"FP8 checkpoint with weight_block_size {list(block)}; kt reads 128x128 blocks")
        return Quantization("FP8", block=(128, 128))
    if kind == "compressed-tensors":
        groups = q.get("config_groups") or {}
        groups = [g.get("weights") for g in groups.values() if isinstance(g, dict)] if isinstance(groups, dict) else []
        w = groups[0] if groups and isinstance(groups[0], dict) else {}
        if (w.get("num_bits"), w.get("type"), w.get("symmetric"), q.get("format")) == (4, "int", True, "pack-quantized"):
            group = w.get("group_size") or 32
            if isinstance(group, bool) or not isinstance(group, int) or group <= 0:
                raise KTError(f"compressed-tensors group_size must be a positive integer, got {group!r}")
            return Quantization("RAWINT4", group_size=group)
        raise KTError(f"compressed-tensors checkpoint with weights {w} (format {q.get('format')!r}); kt reads "
                      "symmetric 4-bit int pack-quantized (Kimi-K2's RAWINT4)")
    if kind == "gptq":
        settings = (q.get("bits"), q.get("sym"), bool(q.get("desc_act", False)))
        if settings != (4, True, False):
            raise KTError(f"GPTQ checkpoint with bits={settings[0]}, sym={settings[1]}, desc_act={settings[2]}; kt "
                          "reads symmetric 4-bit GPTQ without act-order (bits=4, sym=true, desc_act=false)")
        group = q.get("group_size")
        if group not in (32, 64, 128):
            raise KTError(f"GPTQ group_size {group!r}: kt's INT4 kernels take groups of 32, 64 or 128")
        return Quantization("GPTQ_INT4", group_size=group)
    raise KTError(f"checkpoint quantization {kind!r} is not one kt reads; supported: none (bf16/fp16/fp32), "
                  "fp8 (128x128 blocks, or MXFP8: [1, 32] blocks with ue8m0 scales), mxfp8, compressed-tensors int4, "
                  "gptq (4-bit, symmetric), modelopt NVFP4, mxfp4 (GPT-OSS)")


def spec_from_config(cfg: dict) -> ModelSpec:
    model_type = cfg.get("model_type")
    if not model_type:
        raise KTError("config.json has no model_type; kt cannot tell which model family it is")
    if not isinstance(model_type, str):
        raise KTError(f"config.json model_type should be a string, found {model_type!r}")
    fam = family_for(model_type)
    text = fam.text_config(cfg)
    if not isinstance(text, dict):
        raise KTError(f"config.json {fam.text_config_key} should be a JSON object, found {type(text).__name__}")
    if fam.moe_switch_key and text.get(fam.moe_switch_key) is not True:
        raise KTError(f"this {model_type} config has no MoE layers ({fam.moe_switch_key} is "
                      f"{text.get(fam.moe_switch_key)!r}: a dense model)")
    get = lambda keys, what: _first(text, keys, what, model_type)  # noqa: E731
    hidden = _positive(get(fam.hidden_key, "hidden size"), fam.hidden_key[0])
    intermediate = _positive(get(fam.intermediate_key, "expert intermediate size"), fam.intermediate_key[0])
    experts = _positive(get(fam.experts_key, "routed experts per layer"), fam.experts_key[0])
    top_k = _positive(get(fam.top_k_key, "experts per token"), fam.top_k_key[0])
    layers = _positive(get(fam.layers_key, "layer count"), fam.layers_key[0])
    if top_k > experts:
        raise KTError(f"config.json asks for {top_k} experts per token of {experts}")
    if layers > MAX_LAYERS:
        raise KTError(f"config.json {fam.layers_key[0]} = {layers}: more layers than any model has "
                      f"(kt reads up to {MAX_LAYERS}); the file is corrupted")
    dense_prefix = _int_setting(text, fam.dense_prefix_key, fam.dense_prefix_default)
    step = _int_setting(text, fam.sparse_step_key, 1) or 1
    offset = _int_setting(text, fam.sparse_offset_key, step - 1) % step
    freq = _int_setting(text, fam.layer_freq_key, 1) or 1
    dense = text.get(fam.dense_layers_key, fam.dense_layers_default) or () if fam.dense_layers_key else ()
    if not isinstance(dense, list | tuple) or not all(isinstance(x, int) for x in dense):
        raise KTError(f"config.json {fam.dense_layers_key} should list layer numbers, found {dense!r}")
    dense = set(dense)
    last = _int_setting(text, fam.last_sparse_key, -1)
    last = layers - 1 if last < 0 else last
    moe_layers = tuple(L for L in range(layers) if L >= dense_prefix and L <= last and L % step == offset
                       and L % freq == 0 and L not in dense)
    kinds = text.get(fam.layer_types_key) if fam.layer_types_key else None
    if kinds is not None:   # every layer's kind, listed: it decides
        if (not isinstance(kinds, list) or len(kinds) != layers
                or not all(k in ("sparse", "dense") for k in kinds)):
            raise KTError(f"config.json {fam.layer_types_key} should list \"sparse\" or \"dense\" for each of the "
                          f"{layers} layers, found {kinds!r}")
        moe_layers = tuple(L for L, k in enumerate(kinds) if k == "sparse")
    listed = text.get(fam.sparse_layers_key) if fam.sparse_layers_key else None
    if isinstance(listed, str):   # Step-3.7's hub configs: "3,4,5,..."
        try:
            listed = [int(x) for x in listed.split(",") if x.strip()]
        except ValueError:
            pass   # refused below, as found
    if listed is not None and kinds is None:   # the MoE layers, listed: they decide
        if (not isinstance(listed, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < layers
                                                    for x in listed)):
            raise KTError(f"config.json {fam.sparse_layers_key} should list layer numbers below {layers}, "
                          f"found {listed!r}")
        moe_layers = tuple(sorted(set(listed)))
    if not moe_layers:
        raise KTError(f"this {model_type} config has no MoE layers ({layers} layers, first_k_dense={dense_prefix}, "
                      f"step={step}, dense layers={sorted(dense)})")
    return ModelSpec(fam, model_type, hidden, intermediate, experts, top_k, layers, moe_layers,
                     _quantization(cfg))
