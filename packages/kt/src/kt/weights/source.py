"""kt's weight source for kt-core's KTMoEWrapper(weight_path=...) (entry point group
`kt.weight_sources`, kt_core/weight_source.py): model folders, kt converted folders, GGUF files."""

from __future__ import annotations

from pathlib import Path

from kt_core.errors import KTError

from ..gguf import open_gguf
from ..gguf.reader import arch_expert_activation, arch_expert_biases
from ..models import read_config, spec_from_config
from .checkpoint import Checkpoint
from .converted import MANIFEST, read_manifest
from .kt_kernel_folder import KtKernelFolder
from .loader import checkpoint_swiglu, open_weights
from .loader import load_layer as _load_layer
from .native_mxfp4 import native_mxfp4_experts  # noqa: F401  (the weight source's MXFP4_SFT reader)


def layer_settings(path, layer_idx: int, method: str) -> dict:
    if method == "LLAMAFILE":   # the file fixes the ggml types and, by its architecture, the experts' activation
        model = open_gguf(path)
        limit, alpha, _, gate = arch_expert_activation(model)
        return {"weight_types": model.layer_experts(layer_idx).types, "gate_activation": gate, "swiglu_limit": limit,
                "swiglu_alpha": alpha, "expert_bias": arch_expert_biases(model)}
    if (Path(path) / MANIFEST).is_file():
        manifest = read_manifest(Path(path))
        return {"group_size": int(manifest.get("group_size", 0)), "zero_point": bool(manifest.get("zero_point")),
                **_expert_activation(Path(path), layer_idx)}   # the source's config.json, kept in the folder
    if method == "INT4":
        source = open_weights(path)
        if isinstance(source, KtKernelFolder):   # kt-kernel's AMXINT4 groups follow its NUMA slices
            return {"group_size": source.geometry(layer_idx)[3]}
    if method == "GPTQ_INT4":   # the layer's groups are the checkpoint's
        return {"group_size": Checkpoint(path).spec.quantization.group_size}
    return _expert_activation(Path(path), layer_idx)


def _expert_activation(folder: Path, layer: int) -> dict:
    """A model folder of a family whose experts clamp their activation (GPT-OSS's SwiGLU with biases,
    DeepSeek-V4's SiLU) or gate through GELU-tanh (Gemma 4): the layer must be made for it (the
    config's limit and alpha, expert_bias, the gate activation), which kt-kernel's callers may not
    say. Only config.json is read; a folder kt cannot read as a model says nothing here (kt-kernel
    passes weight_path even to layers it loads from tensors)."""
    try:
        config = read_config(folder)
        spec = spec_from_config(config)
    except KTError:
        return {}
    swiglu = checkpoint_swiglu(spec, config, layer)
    if swiglu is None:
        return {}
    return {"expert_bias": spec.family.expert_biases, "swiglu_limit": swiglu[0], "swiglu_alpha": swiglu[1],
            "swiglu_limit_after_act": swiglu[2], "gate_activation": swiglu[3]}


def load_layer(moe, path, layer_idx: int, physical_to_logical_map=None, quantize_at_load: bool = False) -> None:
    _load_layer(moe, path, layer_idx, physical_to_logical_map, quantize_at_load=quantize_at_load)


def write_expert_for_gpu(path, layer_idx: int, expert: int, method: str, intermediate: int, tp: int, w13_weight,
                         w13_scale, w2_weight, w2_scale) -> None:
    """KTMoEWrapper.submit_write_weight_scale_to_buffer's work (gpu_buffers.py)."""
    from .gpu_buffers import write_expert
    write_expert(path, layer_idx, expert, method, intermediate, tp, w13_weight, w13_scale, w2_weight, w2_scale)
