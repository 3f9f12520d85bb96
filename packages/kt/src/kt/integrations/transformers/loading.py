"""load_model: a transformers MoE model with everything loaded but its routed experts.

The routed experts are nearly all of a big MoE's bytes (DeepSeek-V3: 654 of 671 B parameters), and
kt reads them from the checkpoint itself (patch_model's weight_path). Loading them into torch
first would need the whole model in memory (transformers 5 dequantizes an FP8 checkpoint to bf16 on
a CPU: twice its size) only to free it again. Here transformers loads the rest — its key renames,
dtypes, tied weights and quantization handling unchanged — while the family's experts modules are
built without parameters: each keeps meta tensors of its parameters' shapes as plain attributes,
so transformers finds no place for the checkpoint's expert tensors and never reads them.
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch
from torch import nn

from kt_core.errors import KTError

from ...models import Family
from .expert_modules import holds_expert_modules, unload_expert_modules

# Marks an experts module built by load_model: patch_model then reads its weights from weight_path.
UNLOADED = "_kt_experts_unloaded"
_CLASS_PATCH = threading.Lock()   # the experts classes are patched process-wide while a model loads
_ABSENT = object()


def experts_unloaded(module: nn.Module) -> bool:
    return bool(getattr(module, UNLOADED, False))


def _auto_class(config):
    """AutoModelForCausalLM, or — for a multimodal model with no causal-LM class (Qwen3-VL-MoE,
    Kimi-K2.5) — AutoModelForImageTextToText, or AutoModelForMultimodalLM (Qwen3-Omni, which also
    speaks); a model's own code says which it provides (auto_map)."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto import modeling_auto

    auto_map = getattr(config, "auto_map", None) or {}
    if "AutoModelForCausalLM" in auto_map or config.model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    if config.model_type in getattr(modeling_auto, "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES", {}) and \
            config.model_type not in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return transformers.AutoModelForMultimodalLM
    return AutoModelForImageTextToText


def _classes(config, fam: Family, trust_remote_code: bool) -> tuple[type, set[type], set[type]]:
    """The model's class, its experts modules' classes and — for blocks holding one module per expert
    (remote-code DeepSeek / Kimi-K2, expert_modules.py) — those blocks' classes, found on a skeleton
    built on the meta device (no memory)."""
    with torch.device("meta"):
        skeleton = _auto_class(config).from_config(config, trust_remote_code=trust_remote_code)
    attr = fam.transformers_experts.attr
    blocks = [m for _, m in skeleton.named_modules()
              if type(m).__name__ in fam.transformers_blocks and hasattr(m, attr)]
    if not blocks:
        raise KTError(f"this {config.model_type} model has no MoE layers: none of its modules is a "
                      f"{' or '.join(fam.transformers_blocks)}, so kt has no experts to run")
    per_expert = {type(m) for m in blocks if holds_expert_modules(m, attr)}
    fused = {type(getattr(m, attr)) for m in blocks if not holds_expert_modules(m, attr)}
    return type(skeleton), fused, per_expert


def _to_meta(module: nn.Module) -> None:
    """The module's own parameters become meta tensors of their shapes, as plain attributes."""
    for name, p in list(module._parameters.items()):
        del module._parameters[name]
        object.__setattr__(module, name, None if p is None else torch.empty(p.shape, dtype=p.dtype, device="meta"))


@contextlib.contextmanager
def _built_without_parameters(model_class: type, classes: set[type], blocks: set[type], attr: str):
    """While active, instances of `classes` (experts modules) hold meta tensors of their parameters'
    shapes (plain attributes: neither parameters nor buffers), so do the expert modules of `blocks`
    (MoE blocks holding one module per expert), and `model_class` does not report the checkpoint's
    expert keys, which now have nowhere to go, as unexpected."""
    originals = {cls: cls.__init__ for cls in classes | blocks}
    ignored = model_class.__dict__.get("_keys_to_ignore_on_load_unexpected", _ABSENT)

    def unloaded_init(original, cls):
        def __init__(self, *args, **kwargs):
            with torch.device("meta"):
                original(self, *args, **kwargs)
            if cls in blocks:
                setattr(unload_expert_modules(self, attr, _to_meta), UNLOADED, True)
            else:
                _to_meta(self)
                setattr(self, UNLOADED, True)
        return __init__

    with _CLASS_PATCH:
        for cls, original in originals.items():
            cls.__init__ = unloaded_init(original, cls)
        model_class._keys_to_ignore_on_load_unexpected = {
            *(getattr(model_class, "_keys_to_ignore_on_load_unexpected", None) or ()), r"(^|\.)experts\."}
        try:
            yield
        finally:
            for cls, original in originals.items():
                cls.__init__ = original
            if ignored is _ABSENT:
                del model_class._keys_to_ignore_on_load_unexpected
            else:
                model_class._keys_to_ignore_on_load_unexpected = ignored


def load_model(folder: str | os.PathLike, *, dtype="auto", **from_pretrained_kwargs) -> nn.Module:
    """`AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, ...)` of an MoE family kt
    supports (AutoModelForImageTextToText for multimodal models without a causal-LM class), without
    its routed experts: their modules hold meta tensors of the experts' shapes and none of their
    bytes is read. Patch the model with `patch_model(model, weight_path=folder,
    method=...)` (or another weight_path: a `kt convert` folder, a GGUF file) before running it;
    GPU-resident experts (num_gpu_experts) are then read from a BF16 or FP8 checkpoint."""
    from transformers import AutoConfig

    from .patch import _family

    remote = bool(from_pretrained_kwargs.get("trust_remote_code", False))
    config = AutoConfig.from_pretrained(folder, trust_remote_code=remote)
    fam = _family(getattr(config, "model_type", None) or "")
    with _built_without_parameters(*_classes(config, fam, remote), fam.transformers_experts.attr):
        return _auto_class(config).from_pretrained(folder, dtype=dtype, **from_pretrained_kwargs)

