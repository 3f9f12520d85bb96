"""Small GGUF MoE models for tests, written with the `gguf` package's own writer, their blocks
from kt_core.testing.ggml_blocks (real encodings; the dequantized weights are gguf's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kt_core.formats.ggml import STORED_TYPES, ggml_type
from kt_core.testing.ggml_blocks import dequantize, random_blocks


def write_moe_gguf(path: str | Path, *, hidden: int, intermediate: int, experts: int, top_k: int,
                   layers: int = 1, types=("Q4_K", "Q4_K", "Q6_K"), seed: int = 0, split_max_tensors: int = 0,
                   per_expert: bool = False, arch: str = "qwen3moe", biases: bool = False) -> dict[int, tuple[np.ndarray, ...]]:
    """Write a GGUF with `layers` MoE layers (fused `_exps` tensors, or per-expert ones) and
    return {layer: (gate, up, down)} dequantized f32 [E, N, K]. With split_max_tensors the
    writer produces `stem-0000k-of-0000N.gguf` files next to `path`. biases: GPT-OSS's
    `blk.{L}.ffn_{gate,up,down}_exps.bias` too (F32 [E, N]), returned as a fourth item (gate,
    up, down biases)."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_expert_feed_forward_length(intermediate)
    w.add_expert_count(experts)
    w.add_expert_used_count(top_k)
    shapes = {"gate": (intermediate, hidden), "up": (intermediate, hidden), "down": (hidden, intermediate)}
    weights = {}
    for layer in range(layers):
        dense = []
        for proj, type_name in zip(("gate", "up", "down"), types):
            blocks = random_blocks(rng, type_name, (experts, *shapes[proj]))
            name = str(type_name).upper() if str(type_name).upper() in STORED_TYPES else ggml_type(type_name).name
            qtype = gguf.GGMLQuantizationType[name]
            if per_expert:
                for e in range(experts):
                    w.add_tensor(f"blk.{layer}.ffn_{proj}.{e}.weight", blocks[e], raw_dtype=qtype)
            else:
                w.add_tensor(f"blk.{layer}.ffn_{proj}_exps.weight", blocks, raw_dtype=qtype)
            dense.append(dequantize(blocks, type_name))
        if biases:
            bias = tuple((rng.standard_normal((experts, shapes[p][0])) * 0.3).astype(np.float32) for p in shapes)
            for proj, b in zip(shapes, bias):
                w.add_tensor(f"blk.{layer}.ffn_{proj}_exps.bias", b)
            dense.append(bias)
        weights[layer] = tuple(dense)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights
