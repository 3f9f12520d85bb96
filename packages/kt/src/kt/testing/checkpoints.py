"""Tiny synthetic Hugging Face checkpoints of every registered MoE family, for tests and
benchmarks: a real config.json layout (the family's own keys), random expert weights in the
family's tensor names, optionally FP8-block, compressed-tensors INT4, GPTQ INT4, ModelOpt NVFP4 or
MXFP8 quantized, sharded
with an index like the real ones, plus a few non-expert tensors the loader must ignore.

    experts = write_checkpoint(tmp_path, "qwen3_moe", quant="fp8")
    experts[layer] -> (gate [E, I, H], up, down [E, H, I]) float64, the weights the
                      checkpoint's tensors stand for (dequantized for FP8 / RAWINT4), and for
                      families with expert biases (GPT-OSS) a fourth item (gate, up, down biases)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kt_core.testing import quantize as Q

from ..models import FAMILIES, family_for

GPTQ_GROUP = 32   # group_size of the GPTQ checkpoints written here


def make_config(model_type: str, *, hidden: int, intermediate: int, experts: int, top_k: int, layers: int,
                dense_prefix: int = 1, quant: str | None = None) -> dict:
    fam = family_for(model_type)
    text = {fam.hidden_key[0]: hidden, fam.intermediate_key[0]: intermediate, fam.experts_key[0]: experts,
            fam.top_k_key[0]: top_k, fam.layers_key[0]: layers, "vocab_size": 64, "torch_dtype": "bfloat16"}
    if fam.dense_prefix_key:
        text[fam.dense_prefix_key] = dense_prefix
    elif fam.layer_types_key:   # no key for the leading dense layers: each layer's kind listed
        text[fam.layer_types_key] = ["dense" if L < dense_prefix else "sparse" for L in range(layers)]
    if fam.moe_switch_key:   # Gemma 4: MoE blocks on
        text[fam.moe_switch_key] = True
    if fam.sparse_step_key:
        text[fam.sparse_step_key] = 1
    if fam.layer_freq_key:
        text[fam.layer_freq_key] = 1
    for part in reversed(fam.text_config_key.split(".")) if fam.text_config_key else ():   # nested where the family keeps it
        text = {part: text}
    cfg = {"model_type": model_type, **text}
    if quant == "fp8":
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                      "activation_scheme": "dynamic"}
    elif quant == "rawint4":
        cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int",
                                                                                "symmetric": True, "group_size": 32,
                                                                                "strategy": "group"}}}}
    elif quant == "gptq":
        cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": GPTQ_GROUP, "sym": True,
                                      "desc_act": False, "checkpoint_format": "gptq"}
    elif quant == "nvfp4":   # what ModelOpt's hf_quant_config becomes in a config.json
        cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                      "exclude_modules": ["lm_head"]}
    elif quant == "mxfp4" and fam.mxfp4_experts_in_fp8:   # DeepSeek-V4's: FP8 for the rest, MXFP4 experts
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                      "scale_fmt": "ue8m0", "activation_scheme": "dynamic"}
    elif quant == "mxfp4":   # GPT-OSS's quantization_config
        cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                                           "model.layers.*.mlp.router"]}
    elif quant == "mxfp8":
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [1, 32],
                                      "scale_fmt": "ue8m0", "activation_scheme": "dynamic"}
    return cfg


def _expert_tensors(fam, layer: int, gate, up, down, quant: str | None, truth: bool = True) -> tuple[dict, tuple]:
    """Checkpoint tensors of one layer and (when truth) the float64 weights they stand for."""
    import torch

    out = {}
    if fam.fused is not None:
        E, I, H = gate.shape
        prefix = fam.experts_prefix.format(layer=layer)
        pick = (slice(0, None, 2), slice(1, None, 2)) if fam.fused.interleaved else (slice(0, I), slice(I, 2 * I))
        if quant == "mxfp4":   # GPT-OSS's *_blocks [E, N, K/32, 16] and *_scales [E, N, K/32], N the output rows
            blocks = np.empty((E, 2 * I, H // 32, 16), np.uint8)
            scales = np.empty((E, 2 * I, H // 32), np.uint8)
            for rows, m in zip(pick, (gate, up)):
                b, sc = Q.quantize_mxfp4(m)
                blocks[:, rows], scales[:, rows] = b.reshape(E, I, H // 32, 16), sc
            db, ds = Q.quantize_mxfp4(down)
            out[f"{prefix}.{fam.fused.gate_up}_blocks"] = torch.from_numpy(blocks)
            out[f"{prefix}.{fam.fused.gate_up}_scales"] = torch.from_numpy(scales)
            out[f"{prefix}.{fam.fused.down}_blocks"] = torch.from_numpy(np.ascontiguousarray(db.reshape(E, H, I // 32, 16)))
            out[f"{prefix}.{fam.fused.down}_scales"] = torch.from_numpy(ds)
            real = tuple(Q.dequantized_weights("MXFP4", gate, up, down)) if truth else ()
        elif fam.fused.output_first:   # Gemma 4's: [E, 2I, H] (gate rows, then up rows), [E, H, I]
            out[f"{prefix}.{fam.fused.gate_up}"] = torch.from_numpy(np.concatenate([gate, up], axis=1)).to(torch.bfloat16)
            out[f"{prefix}.{fam.fused.down}"] = torch.from_numpy(np.ascontiguousarray(down)).to(torch.bfloat16)
            real = tuple(Q.bf16_round(m).astype(np.float64) for m in (gate, up, down)) if truth else ()
        else:
            gate_up = np.empty((E, H, 2 * I), np.float32)
            gate_up[:, :, pick[0]], gate_up[:, :, pick[1]] = gate.transpose(0, 2, 1), up.transpose(0, 2, 1)
            out[f"{prefix}.{fam.fused.gate_up}"] = torch.from_numpy(gate_up).to(torch.bfloat16)
            out[f"{prefix}.{fam.fused.down}"] = torch.from_numpy(np.ascontiguousarray(down.transpose(0, 2, 1))).to(torch.bfloat16)
            real = tuple(Q.bf16_round(m).astype(np.float64) for m in (gate, up, down)) if truth else ()
        if fam.expert_biases:   # GPT-OSS: bf16 biases, interleaved like the weights; truth gains them
            rng = np.random.default_rng(layer)
            bias = [Q.bf16_round(rng.standard_normal(shape).astype(np.float32) * np.float32(0.3))
                    for shape in ((E, I), (E, I), (E, H))]
            gu_bias = np.empty((E, 2 * I), np.float32)
            gu_bias[:, pick[0]], gu_bias[:, pick[1]] = bias[0], bias[1]
            out[f"{prefix}.{fam.fused.gate_up}_bias"] = torch.from_numpy(gu_bias).to(torch.bfloat16)
            out[f"{prefix}.{fam.fused.down}_bias"] = torch.from_numpy(bias[2]).to(torch.bfloat16)
            real = (*real, tuple(b.astype(np.float64) for b in bias)) if truth else ()
        return out, real
    if fam.stacked is not None:   # Step-3.7: each projection's experts in one bf16 tensor
        if quant is not None:
            raise ValueError(f"{fam.name}'s stacked experts are written as bf16 only, not {quant}")
        prefix = fam.experts_prefix.format(layer=layer)
        for proj, stack in (("gate", gate), ("up", up), ("down", down)):
            out[f"{prefix}.{getattr(fam.stacked, proj)}.weight"] = torch.from_numpy(stack).to(torch.bfloat16)
        return out, tuple(Q.bf16_round(m).astype(np.float64) for m in (gate, up, down)) if truth else ()
    real = []
    for proj, stack in (("gate", gate), ("up", up), ("down", down)):
        deq = np.empty(stack.shape, np.float64) if truth else None
        for e in range(stack.shape[0]):
            base = fam.expert_tensor(layer, e, proj)
            if quant == "fp8":
                codes, scale_inv = Q.quantize_fp8_block(stack[e])
                out[f"{base}.weight"] = torch.from_numpy(codes).view(torch.float8_e4m3fn)
                out[f"{base}.weight_scale_inv"] = torch.from_numpy(scale_inv)
                if truth:
                    deq[e] = Q.dequantize_fp8_block(codes, scale_inv)
            elif quant == "nvfp4":   # ModelOpt: E2M1 pairs, E4M3 block scales, the f32 global scale
                blocks, scale, glob = Q.quantize_nvfp4(stack[e])
                out[f"{base}.weight"] = torch.from_numpy(blocks)
                out[f"{base}.weight_scale"] = torch.from_numpy(scale).view(torch.float8_e4m3fn)
                out[f"{base}.weight_scale_2"] = torch.tensor(float(glob.reshape(())), dtype=torch.float32)
                out[f"{base}.input_scale"] = torch.tensor(1.0, dtype=torch.float32)   # activations: unused by kt
                if truth:
                    deq[e] = Q.dequantize_nvfp4(blocks, scale, glob)
            elif quant == "mxfp8":
                codes, exps = Q.quantize_mxfp8(stack[e])
                out[f"{base}.weight"] = torch.from_numpy(codes).view(torch.float8_e4m3fn)
                out[f"{base}.weight_scale_inv"] = torch.from_numpy(exps)
                if truth:
                    deq[e] = Q.dequantize_mxfp8(codes, exps)
            elif quant == "gptq":   # AutoGPTQ's tensors; fp16 scales, qzeros of a symmetric model (8, stored 7)
                qweight, scale = Q.pack_gptq_int4(stack[e], GPTQ_GROUP)
                scale = scale.astype(np.float16)
                n, k = stack[e].shape
                out[f"{base}.qweight"] = torch.from_numpy(qweight)
                out[f"{base}.scales"] = torch.from_numpy(scale)
                out[f"{base}.qzeros"] = torch.full((k // GPTQ_GROUP, n // 8), 0x77777777, dtype=torch.int32)
                out[f"{base}.g_idx"] = torch.arange(k, dtype=torch.int32) // GPTQ_GROUP
                if truth:
                    deq[e] = Q.dequantize_gptq_int4(qweight, scale)
            elif quant == "mxfp4":   # DeepSeek-V4's own: int8 E2M1 pairs, UE8M0 .scale, names without model.
                blocks, exps = Q.quantize_mxfp4(stack[e])
                base = base.removeprefix("model.")
                out[f"{base}.weight"] = torch.from_numpy(blocks).view(torch.int8)
                out[f"{base}.scale"] = torch.from_numpy(exps).view(torch.float8_e8m0fnu)
                if truth:
                    deq[e] = Q.dequantize_mxfp4(blocks, exps)
            elif quant == "rawint4":
                packed, scale = Q.pack_rawint4(stack[e])
                out[f"{base}.weight_packed"] = torch.from_numpy(packed)
                out[f"{base}.weight_scale"] = Q.scale_as_torch_bf16(scale)
                out[f"{base}.weight_shape"] = torch.tensor(stack[e].shape, dtype=torch.int32)
                if truth:
                    deq[e] = Q.dequantize_rawint4(packed, scale)
            else:
                out[f"{base}.weight"] = torch.from_numpy(np.ascontiguousarray(stack[e])).to(torch.bfloat16)
                if truth:
                    deq[e] = Q.bf16_round(stack[e])
        real.append(deq)
    return out, tuple(real)


def write_checkpoint(folder, model_type: str, *, hidden: int = 128, intermediate: int = 64, experts: int = 8,
                     top_k: int = 2, layers: int = 3, dense_prefix: int = 1, quant: str | None = None, shards: int = 2,
                     seed: int = 0, keep_truth: bool = True) -> dict[int, tuple]:
    """Write a checkpoint into folder; returns {moe layer: (gate, up, down) float64} (empty
    when keep_truth is False: benchmarks write models too big to hold twice). Layers are
    spread over the shards in order and each shard is written once its layers are done, so
    with shards == layers only one layer is ever in memory."""
    import torch
    from safetensors.torch import save_file

    from ..models import spec_from_config

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = make_config(model_type, hidden=hidden, intermediate=intermediate, experts=experts, top_k=top_k, layers=layers,
                      dense_prefix=dense_prefix, quant=quant)
    spec = spec_from_config(cfg)
    rng = np.random.default_rng(seed)
    shards = max(1, min(shards, layers))
    shard_of = [layer * shards // layers for layer in range(layers)]
    name_of = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    pending = {"model.embed_tokens.weight": torch.randn(64, hidden).to(torch.bfloat16)}
    truth, weight_map = {}, {}
    for layer in range(layers):
        pending[f"model.layers.{layer}.self_attn.q_proj.weight"] = torch.zeros(hidden, hidden, dtype=torch.bfloat16)
        if layer in spec.moe_layers:
            weights = [rng.standard_normal((experts, *shape), dtype=np.float32) * 0.1
                       for shape in ((intermediate, hidden), (intermediate, hidden), (hidden, intermediate))]
            layer_tensors, real = _expert_tensors(spec.family, layer, *weights, quant, keep_truth)
            del weights
            if keep_truth:
                truth[layer] = real
            pending.update(layer_tensors)
        if layer == layers - 1 or shard_of[layer + 1] != shard_of[layer]:
            shard = name_of[shard_of[layer]]
            save_file({n: t.contiguous() for n, t in pending.items()}, str(folder / shard), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(pending, shard))
            pending = {}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return truth


FAMILY_MODEL_TYPES = tuple(f.model_types[0] for f in FAMILIES)


def experts_to_fp8(folder, every_projection: bool = False) -> None:
    """Turn a bf16 model folder that transformers saved with one tensor per expert (one
    model.safetensors) into a DeepSeek-V3-style FP8 checkpoint: each expert weight as E4M3 codes
    with 128 x 128 block scales (`weight_scale_inv`), the config's fp8 quantization_config;
    `every_projection`: every `*_proj.weight` too (attention, shared experts, dense MLPs), as
    DeepSeek-V3's and Kimi-K2's own checkpoints store them."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    tensors = {}
    for name, t in load_file(folder / "model.safetensors").items():
        if (".experts." in name and name.endswith(".weight")) or (every_projection and name.endswith("_proj.weight")):
            codes, scale = Q.quantize_fp8_block(t.float().numpy())
            tensors[name] = torch.from_numpy(codes).view(torch.float8_e4m3fn)
            tensors[name[:-len("weight")] + "weight_scale_inv"] = torch.from_numpy(scale.astype("float32"))
        else:
            tensors[name] = t
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                     "activation_scheme": "dynamic"}
    (folder / "config.json").write_text(json.dumps(config))
