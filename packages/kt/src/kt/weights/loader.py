"""Loading one MoE layer's experts into a kt_core.MoE from a model folder or a converted one.

    source = open_weights(path)          # Checkpoint (HF folder) or ConvertedFolder
    load_layer(moe, source, layer=3, physical_to_logical_map=p2l)

Checkpoint formats load as they are stored (BF16 from float checkpoints, FP8, RAWINT4, GPTQ_INT4,
NVFP4, MXFP8);
INT8/INT4 come from a converted folder, or are quantized at load from a float or FP8
checkpoint when asked (`quantize_at_load`, kt-kernel's cpu_save-style path). Experts are
packed in parallel batches, each by a thread of the NUMA node that will serve it.
"""

from __future__ import annotations

from pathlib import Path

from kt_core.errors import KTError, WeightsError

from ..gguf.reader import GGUFModel, expert_reader, is_gguf, open_gguf
from ..models import ACTIVATIONS, read_config, spec_from_config
from .checkpoint import Checkpoint
from .converted import MANIFEST, ConvertedFolder
from .experts import checkpoint_biases, checkpoint_experts, float_experts
from .kt_kernel_folder import KtKernelFolder, is_dump_folder, is_merged
from .packed import load_packed_layer, packed_layer
from .readahead import readahead

# Experts packed per parallel batch: enough to keep every thread busy, few enough that the
# per-expert copies some formats need (fused tensors, FP8 dequantization) stay small.
BATCH = 32
# What each checkpoint format can be loaded as without quantizing.
AS_STORED = {"BF16": ("BF16", "FP32"), "FP8": ("FP8",), "RAWINT4": ("RAWINT4",), "GPTQ_INT4": ("GPTQ_INT4",),
             "NVFP4": ("NVFP4",), "MXFP8": ("MXFP8",), "MXFP4": ("MXFP4",)}


def checkpoint_serves(stored: str, method: str) -> str | None:
    """How a checkpoint whose experts are stored as `stored` gives method `method`'s experts: "as
    stored", "quantized at load" (BF16 or FP8 floats packed as INT8, INT4 or BF16), or None."""
    if method in AS_STORED.get(stored, ()):
        return "as stored"
    if stored in ("BF16", "FP8") and method in ("INT8", "INT4", "BF16"):
        return "quantized at load"
    return None


def open_weights(path: str | Path) -> Checkpoint | ConvertedFolder | GGUFModel | KtKernelFolder:
    path = Path(path)
    if (path / MANIFEST).is_file():
        return ConvertedFolder.open(path)
    if is_gguf(path):
        return open_gguf(path)
    if is_dump_folder(path):
        return KtKernelFolder.open(path)
    ckpt = Checkpoint(path)
    return KtKernelFolder(path, *KtKernelFolder.merged(ckpt)) if is_merged(ckpt) else ckpt


def serves_resident_experts(source) -> bool:
    """Whether dense weights of single experts can be read from `source` (float_experts: a BF16 or FP8
    checkpoint) — what GPU-resident experts of a model loaded without its experts are made from."""
    return isinstance(source, Checkpoint) and source.spec.quantization.method in ("BF16", "FP8")


def expert_source(folder: str | Path, method: str, weight_path: str | Path | None = None,
                  num_gpu_experts: int = 0) -> str | Path | None:
    """Where kt reads the experts of the model in `folder` from if the model is loaded without them
    (kt.integrations.transformers.load_model): `weight_path`, or the folder itself where kt reads its
    checkpoint for `method` (checkpoint_serves) — or None when the model must load whole: its own
    checkpoint is not one kt reads for `method`, or GPU-resident experts (read from a BF16 or FP8
    checkpoint when the model has none) need weights the source does not give."""
    from kt_core.backends.selection import canonical_method

    try:
        if weight_path is not None:
            return weight_path if num_gpu_experts == 0 or serves_resident_experts(open_weights(weight_path)) else None
        ckpt = open_weights(folder)
    except (KTError, OSError, ValueError):   # not a folder kt reads (family, quantization, layout): load it whole
        return None
    if not isinstance(ckpt, Checkpoint) or (num_gpu_experts and not serves_resident_experts(ckpt)):
        return None
    return folder if checkpoint_serves(ckpt.spec.quantization.method, canonical_method(method)) else None


def _check_geometry(moe, hidden: int, intermediate: int, what: str) -> None:
    if (hidden, intermediate) != (moe.hidden_size, moe.intermediate_size):
        raise WeightsError(f"{what} has hidden={hidden}, intermediate={intermediate}; the layer was created with "
                           f"hidden_size={moe.hidden_size}, intermediate_size={moe.intermediate_size}")


def _check_converted(moe, folder: ConvertedFolder) -> None:
    g = folder.geometry
    _check_geometry(moe, g["hidden"], g["intermediate"], f"converted folder {folder.path}")
    wanted = (moe.method, moe.group_size, moe.zero_point)
    stored = (folder.method, folder.group_size, folder.zero_point)
    if wanted != stored:
        what = "experts (packed copies)" if folder.as_stored else "codes"
        raise WeightsError(f"{folder.path} holds {folder.method} {what} (group {folder.group_size}, zero_point "
                           f"{folder.zero_point}); the layer asks for {moe.method} (group {wanted[1]}, zero_point "
                           f"{moe.zero_point}): create it with the folder's settings")


def _converted_reader(folder: ConvertedFolder, layer: int):
    tensors = folder.layer_tensors(layer)
    return folder.geometry["num_experts"], lambda e: folder.expert(tensors, e)


def checkpoint_swiglu(spec, config: dict, layer: int) -> tuple[float, float, bool, str] | None:
    """(swiglu_limit, swiglu_alpha, swiglu_limit_after_act, gate_activation) of layer `layer` of a family
    whose experts clamp their activation (GPT-OSS's SwiGLU, DeepSeek-V4's SiLU, Step-3.5's limit after
    SiLU: the config's values) or gate through GELU-tanh (Gemma 4), None for SiLU experts."""
    fam = spec.family
    if fam.activation == "silu":
        return None
    text = fam.text_config(config)   # multimodal: the language model's
    return fam.swiglu((text if isinstance(text, dict) else config).get, layer)


def _check_activation(moe, spec, config: dict, layer: int) -> None:
    """The layer must compute what the model's experts do (its config's activation and biases):
    WeightsError naming the settings to create it with."""
    swiglu = checkpoint_swiglu(spec, config, layer)
    if swiglu is None:
        return
    biases = spec.family.expert_biases
    if not (moe.expert_bias == biases and moe.swiglu == swiglu):
        with_biases = " with per-expert biases on gate/up and down" if biases else ""
        raise WeightsError(f"{spec.model_type} experts compute {ACTIVATIONS[spec.family.activation]}{with_biases}: "
                           f"create layer {layer} with {'expert_bias=True, ' if biases else ''}"
                           + (f"gate_activation={swiglu[3]!r}" if swiglu[3] != "silu" else
                              f"swiglu_limit={swiglu[0]}, swiglu_alpha={swiglu[1]}")
                           + (", swiglu_limit_after_act=True" if swiglu[2] else ""))


def _checkpoint_reader(moe, ckpt: Checkpoint, layer: int, quantize_at_load: bool):
    spec = ckpt.spec
    _check_geometry(moe, spec.hidden, spec.intermediate, f"{spec.model_type} checkpoint {ckpt.path}")
    if layer not in spec.moe_layers:
        raise WeightsError(f"layer {layer} of this {spec.model_type} model is not an MoE layer; its MoE layers are "
                           f"{spec.moe_layers[0]}..{spec.moe_layers[-1]} ({len(spec.moe_layers)} layers)")
    _check_activation(moe, spec, ckpt.config, layer)
    stored = spec.quantization.method
    serves = checkpoint_serves(stored, moe.method)
    if serves == "as stored":
        if spec.family.expert_biases:   # (..., biases): MoE.load_experts sets them with the weights
            return spec.num_experts, lambda e: (*checkpoint_experts(ckpt, layer, e), checkpoint_biases(ckpt, layer, e))
        return spec.num_experts, lambda e: checkpoint_experts(ckpt, layer, e)
    if serves == "quantized at load":
        if not quantize_at_load:
            raise KTError(f"{ckpt.path} stores {stored} experts; {moe.method} needs a converted folder (`kt convert "
                          f"{ckpt.path} OUT --method {moe.method}`) or quantization at load (cpu_save=True / "
                          "quantize_at_load=True)")
        return spec.num_experts, lambda e: (*float_experts(ckpt, layer, e), None, None)
    raise WeightsError(f"{ckpt.path} stores {stored} experts, which load as {' or '.join(AS_STORED[stored])}, "
                       f"not {moe.method}")


def _kt_kernel_reader(moe, folder: KtKernelFolder, layer: int):
    hidden, intermediate, method, group = folder.geometry(layer)
    _check_geometry(moe, hidden, intermediate, f"kt-kernel folder {folder.path}")
    if (moe.method, moe.group_size if method == "INT4" else 0) != (method, group):
        asked = f"{moe.method} (group {moe.group_size})" if moe.method == "INT4" else moe.method
        raise WeightsError(f"{folder.path} holds kt-kernel AMX{method} experts, kt's {method}"
                           f"{f' with group {group}' if group else ''}; the layer asks for {asked}: create it with "
                           f"method {method}{f' and group_size={group}' if group else ''}")
    return folder.reader(layer)


def load_layer(moe, source: Checkpoint | ConvertedFolder | GGUFModel | KtKernelFolder | str | Path, layer: int,
               physical_to_logical_map=None, *, quantize_at_load: bool = False) -> str:
    """Load model layer `layer`'s routed experts into `moe` (a kt_core.MoE). Physical slot p
    gets logical expert physical_to_logical_map[p]; GPU-resident slots are skipped. Returns
    how: "mapped" or "copied" (a converted folder's packed copy in this layer's layout, served
    as stored: weights/packed.py) or "packed at load" (packed from codes or checkpoint tensors)."""
    if isinstance(source, (str, Path)):
        source = open_weights(source)
    if isinstance(source, ConvertedFolder):
        _check_converted(moe, source)
        if (source.path / "config.json").is_file():   # its source's, kept by kt convert: the experts' activation
            config = read_config(source.path)
            _check_activation(moe, spec_from_config(config), config, layer)
        packed = packed_layer(source, moe.layout_id, moe.expert_bytes, layer)
        if packed is not None:
            return load_packed_layer(moe, packed, moe.physical_to_logical(physical_to_logical_map,
                                                                          source.geometry["num_experts"]))
        if source.as_stored:
            ckpt = source.source_checkpoint(f"none of layer {layer} in this host's layout {moe.layout_id}")
            logical, read = _checkpoint_reader(moe, ckpt, layer, quantize_at_load)
        else:
            logical, read = _converted_reader(source, layer)
    elif isinstance(source, GGUFModel):
        logical, read = expert_reader(moe, source, layer)
    elif isinstance(source, KtKernelFolder):
        logical, read = _kt_kernel_reader(moe, source, layer)
    else:
        logical, read = _checkpoint_reader(moe, source, layer, quantize_at_load)
    p2l = moe.physical_to_logical(physical_to_logical_map, logical)
    slots = moe.cpu_slots()
    batches = [slots[i:i + BATCH] for i in range(0, len(slots), BATCH)]
    upcoming = {p: read(p2l[p]) for p in batches[0]} if batches else {}
    readahead(upcoming)
    for b in range(len(batches)):
        current = upcoming
        upcoming = {p: read(p2l[p]) for p in batches[b + 1]} if b + 1 < len(batches) else {}
        readahead(upcoming)      # the disk fetches the next batch while the pool packs this one
        moe.load_experts(current)
    return "packed at load"
