"""patch_model(model, mode="train"): a transformers MoE model's routed experts as kt LoRAExperts.

Every MoE block's routed experts are packed by kt (frozen, `method`) and get trainable per-expert
LoRA (kt.training.LoRAExperts); the router, shared experts, attention and embeddings stay torch
modules — with `freeze_base` (default) their parameters stop requiring gradients, as PEFT's
get_peft_model does, and they can take PEFT LoRA of their own. The model then trains with the
transformers Trainer or a plain torch loop; `KTTrainPatch.save_adapter` writes the expert adapters
in PEFT's format. With `adapter=` (a PEFT adapter folder) the adapters are loaded instead of
initialised: inference with expert LoRA (SGLang's --kt-expert-lora-path). `num_gpu_experts` per layer
(placed as the inference patch places them) stay torch's on the model's device, with their rows of
the same adapters; kt computes the rest. `weight_path` (as the inference patch reads it) gives kt's
frozen experts as stored — LoRA over a checkpoint's own FP8 / INT4 / NVFP4 codes (QLoRA without
quantizing again), a `kt convert` folder, a kt-kernel folder or a GGUF file (LLAMAFILE).

`train_experts=True` (full fine-tuning of the routed experts, method BF16 or FP32): the model's own
expert parameters (gate_up_proj / down_proj, and GPT-OSS's biases, in whatever layout the model
holds them) are kept instead of freed and train too, on kt's kernels (LoRAExperts re-packs them after
each optimizer step); with `lora_rank=0` they train alone. With `num_gpu_experts` the GPU-resident
experts' weights train on the model's device as parameters of their own (LoRAExperts.resident_weights).
They keep their names, so `model.save_pretrained()` writes the fine-tuned model as an ordinary
checkpoint (the resident experts' rows brought up to date as the state dict is taken). They cost their
own size, their gradients' and the optimizer's state on top of kt's packed copy — a small model's
business, not a 30B one's on one host.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from kt_core.errors import KTError
from kt_core.moe import MoE

from .lora_experts import LoRAExperts, check_trainable_weights, is_adapter
from .peft_format import load_adapter, save_adapter


@dataclass
class KTTrainPatch:
    """What patch_model(mode="train") did: the LoRAExperts of each MoE layer, by decoder layer index
    (`layers`) and by module path in the model (`modules`, the names PEFT's adapter files use)."""
    model_type: str
    method: str
    layers: dict[int, LoRAExperts]
    modules: dict[str, LoRAExperts]
    backends: tuple[str, ...]
    freed_bytes: int = 0
    gpu_masks: dict[int, tuple[bool, ...]] | None = None   # per layer: the GPU-resident experts (torch's)

    def adapter_parameters(self) -> list[nn.Parameter]:
        """The expert LoRA factors (what an optimizer over the experts' adapters takes)."""
        return [p for m in self.layers.values() for n, p in m.named_parameters() if is_adapter(n)]

    def expert_weight_parameters(self) -> list[nn.Parameter]:
        """The routed experts' own weights when they train (train_experts=True; with num_gpu_experts,
        the GPU-resident experts' as their own parameters on the model's device), else []."""
        return [w for m in self.layers.values() for w in (*(m.expert_weights() or ()), *m.resident_weights())]

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The adapters and, with train_experts, the expert weights."""
        return self.adapter_parameters() + self.expert_weight_parameters()

    def save_adapter(self, directory: str | os.PathLike, base_model_name_or_path: str | None = None):
        """Write the expert adapters as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)."""
        return save_adapter(self.modules, directory, base_model_name_or_path)

    def load_adapter(self, directory: str | os.PathLike) -> None:
        """Set the expert adapters from a PEFT adapter folder."""
        load_adapter(self.modules, directory)


def patch_for_training(model: nn.Module, *, method: str, backend: str | None, lora_rank: int, lora_alpha: float,
                       target: Sequence[str] | None, recompute: bool, group_size: int, zero_point: bool, max_tokens: int,
                       fast_activations: bool | None, freeze_base: bool, adapter: str | os.PathLike | None,
                       num_gpu_experts: int = 0, placement: str = "uniform", stats_file: str | os.PathLike | None = None,
                       placement_seed: int = 42, train_experts: bool = False,
                       weight_path: str | os.PathLike | None = None) -> KTTrainPatch:
    # The transformers integration's readers of a model's MoE blocks (families, checks, orientation)
    # and its placement of GPU-resident experts.
    from ..integrations.transformers import patch as inference_patch
    from ..integrations.transformers.expert_modules import holds_expert_modules, train_through_moe_infer
    from ..integrations.transformers.placement import gpu_expert_masks
    from ..integrations.transformers.stats import load_counts
    from ..weights import load_layer

    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if not model_type:
        raise KTError(f"{type(model).__name__} has no config.model_type; patch_model takes a transformers model")
    fam = inference_patch._family(model_type)
    cfg = fam.text_config(config)
    swiglu = inference_patch._swiglu(fam, cfg, model_type)
    blocks = inference_patch._moe_blocks(model, fam, model_type)
    top_k = inference_patch._config_int(cfg, fam.top_k_key, "experts per token", model_type)
    te = fam.transformers_experts
    per_expert = [holds_expert_modules(block, te.attr) for _, block in blocks]
    if target is None:   # PEFT's natural adapters: on the fused projection, or on each expert's Linear layers
        target = ("gate", "up", "down") if any(per_expert) else ("gate_up", "down")
    if train_experts and any(per_expert):
        raise KTError("train_experts: this model holds its experts as one module per expert (remote code); kt "
                      "trains such experts' LoRA adapters, not their weights")
    if train_experts:   # refused before the model is touched (LoRAExperts checks the same per layer)
        try:
            check_trainable_weights(method)
        except KTError as exc:
            raise KTError(f"train_experts: {exc}") from None
        if weight_path is not None:
            raise KTError(f"train_experts: the expert weights that train are the model's own parameters; "
                          f"weight_path ({weight_path}) gives frozen experts as stored, for LoRA over them")
    source, group_size, zero_point = inference_patch.open_expert_source(weight_path, group_size, zero_point,
                                                                        blocks[0][0])
    if freeze_base:
        model.requires_grad_(False)
    paths = {id(m): name for name, m in model.named_modules()}
    layers: dict[int, LoRAExperts] = {}
    modules: dict[str, LoRAExperts] = {}
    freed = 0
    tensors = {layer: inference_patch._expert_tensors(block, fam, layer, model_type, weight_path is not None)
               for layer, block in blocks}
    num_experts = next(iter(tensors.values())).shape[0]
    counts = load_counts(stats_file, num_experts=num_experts, model_type=model_type) if stats_file is not None else None
    masks = gpu_expert_masks(placement, layers=list(tensors), num_experts=num_experts, num_gpu_experts=num_gpu_experts,
                             counts=counts, seed=placement_seed)
    for layer, block in blocks:
        t = tensors[layer]
        num_experts, intermediate, hidden = t.shape
        mask = masks[layer]
        limit, alpha, after, act = swiglu(layer)
        moe = MoE(num_experts=num_experts, top_k=top_k, hidden_size=hidden, intermediate_size=intermediate,
                  method=method, gpu_experts_mask=mask, max_tokens=max_tokens, backend=backend, group_size=group_size,
                  zero_point=zero_point, fast_activations=fast_activations, trainable=True,
                  swiglu_limit=limit, swiglu_alpha=alpha, swiglu_limit_after_act=after, gate_activation=act,
                  expert_bias=t.biases is not None,
                  weight_types=inference_patch.source_weight_types(source, layer, method))
        with torch.no_grad():
            weights = t.weights() if source is None else None
            if source is not None:   # experts not loaded into torch are quantized as they are read
                load_layer(moe, source, layer, quantize_at_load=t.meta)
            else:
                moe.load(*weights, biases=t.biases)
            resident_gate_up, resident_down, resident_bias = inference_patch.resident_experts(t, mask, source, layer,
                                                                                              block, weights)
            del weights
        module = LoRAExperts(moe, rank=lora_rank, alpha=lora_alpha, target=target, recompute=recompute,
                             resident_gate_up=resident_gate_up, resident_down=resident_down, resident_bias=resident_bias,
                             interleaved_gate_up=t.layout.interleaved, input_first=t.layout.input_first,
                             expert_weights=t.params if train_experts else None,
                             weight_names=(te.gate_up, te.down) + ((f"{te.gate_up}_bias", f"{te.down}_bias")
                                                                   if t.biases is not None else ()),
                             expert_modules=t.per_expert_modules,
                             peft_in_out_swapped=t.layout.input_first and not getattr(t.module, "is_transposed", False))
        if train_experts:   # the model's parameters themselves train: kt re-packs them as they change
            for p in t.params:
                p.requires_grad_(True)
        else:
            for p in t.params:   # the torch copies of the frozen experts: kt holds them packed now
                p.requires_grad_(False)
                freed += inference_patch.release_expert_tensor(p)
        inference_patch.install_experts(block, fam, t, module)
        if t.per_expert_modules:
            train_through_moe_infer(block)
        layers[layer] = module
        modules[paths[id(t.module)]] = module
    patch = KTTrainPatch(model_type=model_type, method=layers[blocks[0][0]].moe.method, layers=layers, modules=modules,
                         backends=tuple(sorted({m.moe.backend for m in layers.values()})), freed_bytes=freed,
                         gpu_masks=masks)
    if adapter is not None:
        patch.load_adapter(adapter)
    return patch
