"""patch_model: a loaded transformers MoE model's routed experts, moved onto kt in place."""

from __future__ import annotations

import atexit
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from kt_core.backends.selection import canonical_method
from kt_core.errors import KTError
from kt_core.moe import MoE

from ...gguf.reader import GGUFModel
from ...models import ACTIVATIONS, FAMILIES, ExpertNames, Family
from ...models.spec import one_per_layer
from ...weights import Checkpoint, ConvertedFolder, KtKernelFolder, load_layer, open_weights
from ...weights.experts import checkpoint_biases, float_experts
from ...weights.loader import serves_resident_experts
from .deferral import Handoff
from .expert_layout import ExpertLayout
from .expert_modules import expert_module_weights, holds_expert_modules, run_moe_infer_on
from .experts import KTExperts, resident_biases, resident_weights
from .loading import experts_unloaded
from .placement import gpu_expert_masks
from .scaled_input import run_scaled_input_on
from .stats import ExpertStats, load_counts

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


@dataclass
class KTPatch:
    """What patch_model did: the kt experts module of each MoE layer (by decoder layer index),
    the GPU-resident masks, the statistics being recorded, the bytes of torch expert weights freed
    and the kt backends the layers run on."""
    family: Family
    model_type: str
    method: str
    layers: dict[int, KTExperts]
    gpu_masks: dict[int, tuple[bool, ...]]
    stats: ExpertStats | None = None
    freed_bytes: int = 0
    backends: tuple[str, ...] = ()

    def save_stats(self, path: str | os.PathLike | None = None) -> Path:
        """Write the expert activation counts recorded so far (to record_stats's path by default)."""
        if self.stats is None:
            raise KTError("this model was patched without record_stats; there are no expert statistics to save")
        return self.stats.save(path)


def supported_model_types() -> list[str]:
    return sorted(t for f in FAMILIES if f.transformers_blocks for t in f.model_types)


def _family(model_type: str) -> Family:
    for fam in FAMILIES:
        if model_type in fam.model_types and fam.transformers_blocks:
            return fam
    raise KTError(f"model_type {model_type!r} is not an MoE family kt's transformers integration supports; "
                  f"supported: {', '.join(supported_model_types())}")


def open_expert_source(weight_path, group_size: int, zero_point: bool, first_layer: int):
    """(source, group_size, zero_point): `weight_path` opened once (a converted folder's manifest and
    source hash, a checkpoint's shard index, a GGUF file, a kt-kernel folder; None without one) and
    the INT4 group settings it implies where the caller left them unset."""
    if weight_path is None:
        return None, group_size, zero_point
    source = open_weights(weight_path)
    if isinstance(source, ConvertedFolder):
        group_size, zero_point = group_size or source.group_size, zero_point or source.zero_point
    elif isinstance(source, Checkpoint) and source.spec.quantization.method == "GPTQ_INT4":
        group_size = group_size or source.spec.quantization.group_size   # GPTQ's groups are the checkpoint's
    elif isinstance(source, KtKernelFolder):   # AMXINT4's groups follow the folder's NUMA slices
        group_size = group_size or source.geometry(first_layer)[3]
    return source, group_size, zero_point


def source_weight_types(source, layer: int, method: str) -> tuple[str, str, str] | None:
    """A GGUF source fixes each layer's ggml types (LLAMAFILE's packed size depends on them)."""
    if isinstance(source, GGUFModel) and canonical_method(method) == "LLAMAFILE":
        return source.layer_experts(layer).types
    return None


def _config_int(cfg, keys: tuple[str, ...], what: str, model_type: str) -> int:
    for key in keys:
        value = one_per_layer(getattr(cfg, key, None))
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise KTError(f"this {model_type} config's {key} ({what}) must be a positive integer, got {value!r}")
            return value
    raise KTError(f"this {model_type} config has none of {', '.join(keys)} ({what})")


def _moe_blocks(model: nn.Module, fam: Family, model_type: str) -> list[tuple[int, nn.Module]]:
    """(decoder layer index, block) of every MoE block, in layer order (a block class that is the
    decoder layer itself, Gemma 4's, counts where it holds experts)."""
    found = []
    for name, module in model.named_modules():
        if type(module).__name__ in fam.transformers_blocks and hasattr(module, fam.transformers_experts.attr):
            m = _LAYER_INDEX.search(name)
            found.append((int(m.group(1)) if m else len(found), module))
    if not found:
        raise KTError(f"this {model_type} model has no MoE layers: none of its modules is a "
                      f"{' or '.join(fam.transformers_blocks)} (every layer is a dense MLP), so kt has nothing to run")
    return sorted(found, key=lambda item: item[0])


def _swiglu(fam: Family, cfg, model_type: str) -> Callable[[int], tuple[float, float, bool, str]]:
    """Layer -> (swiglu_limit, swiglu_alpha, swiglu_limit_after_act, gate_activation) of its experts'
    activation: GPT-OSS's / MiniMax-M3's clamped SwiGLU (their own, whatever hidden_act says),
    DeepSeek-V4's clamped SiLU, Step-3.5's per-layer limit after SiLU, Gemma 4's GELU-tanh (its
    hidden_activation), or (0, 0, False, "silu") for SiLU; any other hidden_act is refused."""
    setting = lambda key, default: getattr(cfg, key, default)  # noqa: E731
    act = getattr(cfg, "hidden_act", "silu")
    if fam.activation not in ("swiglu-oai", "gelu-tanh") and act not in ("silu", "swish"):
        raise KTError(f"this {model_type} model's experts use hidden_act={act!r}; kt's kernels compute "
                      f"{ACTIVATIONS[fam.activation]}")
    fam.swiglu(setting, 0)   # a malformed setting is refused before anything is patched
    return lambda layer: fam.swiglu(setting, layer)


@dataclass
class _Experts:
    """One block's routed experts as kt loads them: their geometry (E, I, H), whether they are meta
    (a model loaded without its experts), biases (gate [E, I], up [E, I], down [E, H]) or None, the
    parameters patch_model frees, how the module holds them, and `weights()`: gate, up [E, I, H] and
    down [E, H, I] in kt's orientation — views of a fused module's tensors, or a stack of per-expert
    modules' made when called (one layer's copy at a time)."""
    module: nn.Module
    shape: tuple[int, int, int]
    meta: bool
    biases: tuple | None
    params: tuple
    layout: ExpertLayout   # how a fused module holds them (kt's views above come from it)
    weights: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    per_expert_modules: bool = False   # an nn.ModuleList of MLPs (expert_modules.py)


def _fused(experts: nn.Module, layout: ExpertLayout, gate_up: torch.Tensor, down: torch.Tensor, biases, params):
    views = layout.kt_weights(gate_up.detach(), down.detach())
    return _Experts(experts, tuple(views[0].shape), gate_up.is_meta or down.is_meta, biases, params, layout,
                    lambda: views)


def _check_loaded(experts: nn.Module, meta: bool, layer: int, has_source: bool) -> None:
    if meta and not (experts_unloaded(experts) and has_source):
        if experts_unloaded(experts):
            raise KTError(f"layer {layer}: this model was loaded without its experts (kt's load_model); give "
                          "patch_model the weight_path to read them from (the model's folder, a kt convert folder, "
                          "a GGUF file)")
        raise KTError(f"layer {layer}: the expert weights are on the meta device (not loaded); load the model's "
                      "weights before patching it")


def _expert_tensors(block: nn.Module, fam: Family, layer: int, model_type: str, has_source: bool = False) -> _Experts:
    """The routed experts of one block, checked, in kt's orientation (meta for a model loaded
    without its experts, when they will be read from a weight_path: `has_source`)."""
    te = fam.transformers_experts
    experts = getattr(block, te.attr, None)
    if isinstance(experts, KTExperts):
        raise KTError("this model is already patched: its experts run on kt")
    if holds_expert_modules(block, te.attr):   # remote-code DeepSeek / Kimi-K2: one MLP module per expert
        shape, params, meta, stacked = expert_module_weights(experts, fam.per_expert or ExpertNames(), layer)
        _check_loaded(experts, meta, layer, has_source)
        return _Experts(experts, shape, meta, None, params, ExpertLayout(), stacked, per_expert_modules=True)
    gate_up, down = getattr(experts, te.gate_up, None), getattr(experts, te.down, None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
        raise KTError(f"layer {layer}: the {model_type} block's {te.attr!r} module holds no fused {te.gate_up}/{te.down} "
                      "tensors nor a list of per-expert modules; kt reads the transformers 5 expert layout and "
                      "DeepSeek's / Kimi-K2's remote code")
    bias_names = (f"{te.gate_up}_bias", f"{te.down}_bias")
    biases = [n for n, _ in experts.named_parameters() if "bias" in n]
    if biases and (not fam.expert_biases or sorted(biases) != sorted(bias_names)):
        raise KTError(f"layer {layer}: the experts have biases ({', '.join(biases)}); kt reads expert biases in "
                      f"GPT-OSS's layout ({', '.join(bias_names)}) only")
    _check_loaded(experts, gate_up.is_meta or down.is_meta, layer, has_source)
    if te.input_first:   # [E, H, 2I] and [E, I, H], x @ W (GPT-OSS: gate / up interleaved, biases; Llama 4)
        if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[2] % 2:
            raise KTError(f"layer {layer}: expected {te.gate_up} [E, H, 2I] and {te.down} [E, I, H], got "
                          f"{list(gate_up.shape)} and {list(down.shape)}")
        e, h, two_i = gate_up.shape
        if tuple(down.shape) != (e, two_i // 2, h):
            raise KTError(f"layer {layer}: {te.gate_up} {list(gate_up.shape)} and {te.down} {list(down.shape)} "
                          f"disagree; expected {te.down} [{e}, {two_i // 2}, {h}]")
        layout = ExpertLayout(input_first=True, interleaved=te.interleaved)
        if not fam.expert_biases:
            return _fused(experts, layout, gate_up, down, None, (gate_up, down))
        gu_bias, d_bias = (getattr(experts, n) for n in bias_names)
        return _fused(experts, layout, gate_up, down, layout.kt_biases(gu_bias.detach(), d_bias.detach()),
                      (gate_up, down, gu_bias, d_bias))
    if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[1] % 2:
        raise KTError(f"layer {layer}: expected {te.gate_up} [E, 2I, H] and {te.down} [E, H, I], got "
                      f"{list(gate_up.shape)} and {list(down.shape)}")
    e, two_i, h = gate_up.shape
    if tuple(down.shape) != (e, h, two_i // 2):
        raise KTError(f"layer {layer}: {te.gate_up} {list(gate_up.shape)} and {te.down} {list(down.shape)} disagree; "
                      f"expected {te.down} [{e}, {h}, {two_i // 2}]")
    return _fused(experts, ExpertLayout(), gate_up, down, None, (gate_up, down))


def install_experts(block: nn.Module, fam: Family, t: _Experts, module: nn.Module) -> None:
    """kt's experts module in the block's place of `t`'s."""
    if t.per_expert_modules:
        run_moe_infer_on(block, module)
    else:
        setattr(block, fam.transformers_experts.attr, module)
        if fam.transformers_experts.scaled_input:
            run_scaled_input_on(block)


def resident_experts(t: _Experts, mask, source, layer: int, block: nn.Module, weights=None):
    """(gate|up [G, 2I, H], down [G, H, I], biases or None) of a layer's GPU-resident experts: the
    model's own tensors (`weights`: t.weights() when already taken), or for a model loaded without
    its experts the checkpoint's (BF16 or FP8, dequantized), in the dtype and on the device of the
    block's other parameters."""
    if not any(mask) or not t.meta:
        return (*resident_weights(*(weights or t.weights()), mask), resident_biases(t.biases, mask))
    if not serves_resident_experts(source):
        method = source.spec.quantization.method if isinstance(source, Checkpoint) else None
        raise KTError(f"layer {layer}: GPU-resident experts (num_gpu_experts) of a model loaded without its experts "
                      f"are read from a Hugging Face BF16 or FP8 checkpoint; weight_path is "
                      f"{f'a {method} checkpoint' if method else type(source).__name__}: load the model with its "
                      "experts (from_pretrained) to keep some on the GPU")
    like = next((p for p in block.parameters() if not p.is_meta), None)
    dtype, device = (like.dtype, like.device) if like is not None else (torch.bfloat16, torch.device("cpu"))
    experts = [e for e, g in enumerate(mask) if g]
    # Only the resident experts are read; every one of them is then a resident slot.
    gate, up, down = (torch.stack(ws).to(device=device, dtype=dtype)
                      for ws in zip(*(float_experts(source, layer, e) for e in experts)))
    biases = None if t.biases is None else tuple(torch.stack(bs).to(device=device, dtype=dtype)
                                                 for bs in zip(*(checkpoint_biases(source, layer, e) for e in experts)))
    every = (True,) * len(experts)
    return (*resident_weights(gate, up, down, every), resident_biases(biases, every))


def release_expert_tensor(p: torch.Tensor) -> int:
    """Empty a torch expert tensor in place (its memory goes even if something else holds the old
    module); the bytes it held — none for a meta placeholder of a model loaded without its experts."""
    held = 0 if p.is_meta else p.numel() * p.element_size()
    p.data = torch.empty((0,) + tuple(p.shape[1:]), dtype=p.dtype, device=p.device)
    return held


def patch_model(model: nn.Module, *, method: str = "BF16", backend: str | None = None, num_gpu_experts: int = 0,
                placement: str = "uniform", stats_file: str | os.PathLike | None = None, placement_seed: int = 42,
                max_deferred_experts_per_token: int = 0, group_size: int = 0, zero_point: bool = False,
                record_stats: str | os.PathLike | None = None, free_originals: bool = True, max_tokens: int = 4096,
                fast_activations: bool | None = None, weight_path: str | os.PathLike | None = None, mode: str = "inference",
                lora_rank: int | None = None, lora_alpha: float | None = None, target: tuple[str, ...] | None = None,
                recompute: bool = False, freeze_base: bool = True,
                expert_lora_path: str | os.PathLike | None = None, train_experts: bool = False):
    """Run every MoE block's routed experts of a loaded transformers model on kt, in place.

    The router, shared experts, attention and everything else stay torch modules; `generate()`
    works unchanged. Expert weights are taken from the model and packed into `method`'s layout now
    (`group_size`/`zero_point` for INT4, `backend` to force one); with `free_originals` the torch
    copies are released. `num_gpu_experts` experts per layer (on average, chosen by `placement`:
    uniform, frequency (needs `stats_file`), front-loading, random (`placement_seed`)) stay torch
    modules on the model's device, overlapped with kt's CPU work. `max_deferred_experts_per_token`
    of each token's lowest-weight CPU experts are added into the next MoE layer's output instead.
    `record_stats=PATH` counts each expert's activations per layer, saved by `KTPatch.save_stats()`
    and at exit. Forwards above `max_tokens` tokens run on kt in chunks of that size.

    `weight_path`: read kt's experts from there instead of the model's tensors — a `kt convert`
    folder (INT8/INT4; its group size and zero points are used unless given), a folder kt-kernel
    quantized (AMXINT8/AMXINT4), a Hugging Face folder loaded as stored (BF16, FP8, RAWINT4,
    GPTQ_INT4, NVFP4, MXFP8), or a GGUF file / split set with
    method="LLAMAFILE" (each layer's ggml types come from the file). GPU-resident experts still
    come from the model.

    `mode="train"`: the experts get trainable per-expert LoRA instead (kt.training.LoRAExperts: rank
    `lora_rank` (8), `lora_alpha` (16), per `target`: ("gate_up", "down") by default — one adapter on
    the fused gate/up projection as PEFT puts it, or "gate" and "up" apart as kt-kernel's SFT does —
    `recompute` to keep only the inputs between forward and backward); with `freeze_base` the model's
    own parameters stop requiring gradients. Returns a KTTrainPatch (save_adapter / load_adapter in
    PEFT's format). `expert_lora_path=DIR` (either mode): start from that PEFT adapter, whose rank,
    alpha and targets are used — inference with expert LoRA.
    `train_experts=True` (mode="train", method BF16 or FP32): the routed experts' own weights train
    too — full fine-tuning on kt's kernels; `lora_rank` then defaults to 0 (the weights alone), and
    `model.save_pretrained()` writes the result as an ordinary checkpoint.
    With expert LoRA, `num_gpu_experts` (and `placement`) keep experts on the model's device as torch
    computes them, with their rows of the same adapters; `weight_path` gives the frozen experts as
    stored (LoRA over a checkpoint's own FP8 / INT4 / NVFP4 codes, a converted folder, a GGUF file;
    not with train_experts); deferral and record_stats are inference options.
    """
    if mode not in ("inference", "train"):
        raise KTError(f"mode must be 'inference' or 'train', got {mode!r}")
    if train_experts and mode != "train":
        raise KTError("train_experts=True trains the expert weights: it needs mode='train'")
    if mode == "train" or expert_lora_path is not None:
        extras = {"max_deferred_experts_per_token": max_deferred_experts_per_token, "record_stats": record_stats}
        used = [k for k, v in extras.items() if v]
        if used:
            raise KTError(f"{', '.join(used)}: not available with expert LoRA (mode='train' or expert_lora_path); "
                          "kt's experts run in their own layer")
        from ...training.model_patch import patch_for_training
        from ...training.peft_format import adapter_settings

        defaults = (0 if train_experts else 8, 16.0, None)   # target: by how the model holds its experts
        if expert_lora_path is not None:
            defaults = adapter_settings(expert_lora_path)
        lora_rank = defaults[0] if lora_rank is None else lora_rank
        lora_alpha = defaults[1] if lora_alpha is None else lora_alpha
        target = defaults[2] if target is None else target

        patch = patch_for_training(model, method=method, backend=backend, lora_rank=lora_rank, lora_alpha=lora_alpha,
                                   target=target, recompute=recompute, group_size=group_size, zero_point=zero_point,
                                   max_tokens=max_tokens, fast_activations=fast_activations,
                                   freeze_base=freeze_base and mode == "train", adapter=expert_lora_path,
                                   num_gpu_experts=num_gpu_experts, placement=placement, stats_file=stats_file,
                                   placement_seed=placement_seed, train_experts=train_experts, weight_path=weight_path)
        if mode == "inference":
            for p in patch.adapter_parameters():
                p.requires_grad_(False)
        return patch
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if not model_type:
        raise KTError(f"{type(model).__name__} has no config.model_type; patch_model takes a transformers model")
    fam = _family(model_type)
    cfg = fam.text_config(config)
    swiglu = _swiglu(fam, cfg, model_type)
    blocks = _moe_blocks(model, fam, model_type)
    tensors = [_expert_tensors(block, fam, layer, model_type, weight_path is not None) for layer, block in blocks]
    num_experts, intermediate, hidden = tensors[0].shape
    for (layer, _), t in zip(blocks, tensors):
        if t.shape != (num_experts, intermediate, hidden):
            raise KTError(f"layer {layer}'s experts are {list(t.shape)} (E, I, H), layer {blocks[0][0]}'s "
                          f"{[num_experts, intermediate, hidden]}; kt expects one geometry per model")
    biased = tensors[0].biases is not None
    top_k = _config_int(cfg, fam.top_k_key, "experts per token", model_type)
    if top_k > num_experts:
        raise KTError(f"this {model_type} config routes {top_k} experts per token of {num_experts}")
    defer = max_deferred_experts_per_token
    if isinstance(defer, bool) or not isinstance(defer, int) or not 0 <= defer < top_k:
        raise KTError(f"max_deferred_experts_per_token must be an integer in [0, {top_k - 1}] (at least one of the "
                      f"{top_k} experts of each token stays in its own layer), got {defer!r}")

    layer_ids = [layer for layer, _ in blocks]
    counts = load_counts(stats_file, num_experts=num_experts, model_type=model_type) if stats_file is not None else None
    masks = gpu_expert_masks(placement, layers=layer_ids, num_experts=num_experts, num_gpu_experts=num_gpu_experts,
                             counts=counts, seed=placement_seed)
    stats = None
    if record_stats is not None:
        stats = ExpertStats(model_type=model_type, num_experts=num_experts, top_k=top_k, layers=layer_ids,
                            path=record_stats)
        atexit.register(stats.save_if_unsaved)
    handoff = Handoff() if defer else None
    source, group_size, zero_point = open_expert_source(weight_path, group_size, zero_point, layer_ids[0])

    patched: dict[int, KTExperts] = {}
    freed = 0
    with torch.no_grad():
        for order, ((layer, block), t) in enumerate(zip(blocks, tensors)):
            mask = masks[layer]
            # A per-expert block's stack is made here, one layer at a time (weight_path: not needed).
            moe, weights = None, t.weights() if source is None else None
            if not all(mask):
                limit, alpha, after, act = swiglu(layer)
                moe = MoE(num_experts=num_experts, top_k=top_k, hidden_size=hidden, intermediate_size=intermediate,
                          method=method, gpu_experts_mask=mask, max_tokens=max_tokens, backend=backend,
                          group_size=group_size, zero_point=zero_point, fast_activations=fast_activations,
                          weight_types=source_weight_types(source, layer, method),
                          swiglu_limit=limit, swiglu_alpha=alpha, expert_bias=biased, swiglu_limit_after_act=after,
                          gate_activation=act)
                if source is not None:   # experts not loaded into torch are quantized as they are read
                    load_layer(moe, source, layer, quantize_at_load=t.meta)
                else:
                    moe.load(*weights, biases=t.biases)
            resident_gate_up, resident_down, resident_bias = resident_experts(t, mask, source, layer, block, weights)
            del weights
            last = order == len(blocks) - 1
            module = KTExperts(layer=layer, order=order, num_experts=num_experts, moe=moe, gpu_mask=mask,
                               resident_gate_up=resident_gate_up, resident_down=resident_down,
                               defer=0 if last else defer, handoff=handoff, stats=stats,
                               original=None if free_originals else t.module,
                               resident_bias=resident_bias, swiglu=swiglu(layer))
            if free_originals:
                freed += sum(release_expert_tensor(p) for p in t.params)
            install_experts(block, fam, t, module)
            patched[layer] = module
    backends = tuple(sorted({m.moe.backend for m in patched.values() if m.moe is not None}))
    return KTPatch(family=fam, model_type=model_type, method=canonical_method(method),
                   layers=patched, gpu_masks=masks, stats=stats, freed_bytes=freed, backends=backends)
