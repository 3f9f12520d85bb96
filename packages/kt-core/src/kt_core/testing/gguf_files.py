"""Small GGUF MoE models for tests, written with the `gguf` package's own writer.

Blocks are real encodings: `gguf.quants.quantize` of random weights for the types it can
encode (Q4_0, Q8_0), random bytes with finite, moderate f16 scales for the others (gguf-py
has no K-quant encoder; every bit pattern of their codes is a valid block). The dequantized
weights come from `gguf.quants.dequantize`, the oracle the kernels are held to.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..formats.ggml import ggml_type

# Byte offsets of each type's f16 scale fields within a block, and a magnitude that keeps
# weights around 0.1 (the largest sub-scale x code product differs per type; small ones are
# f16 subnormals, which the kernels must decode too).
_F16_FIELDS = {"Q4_0": (0,), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
               "Q6_K": (208,), "IQ4_XS": (0,)}
_SCALE = {"Q2_K": 2e-3, "Q3_K": 5e-4, "Q4_K": 1e-4, "Q5_K": 5e-5, "Q6_K": 2.5e-5, "IQ4_XS": 2.5e-5}


def random_blocks(rng: np.random.Generator, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """uint8 [..., N, bytes per row] of ggml type `type_name` for float shape [..., N, K]."""
    import gguf

    t = ggml_type(type_name)
    qtype = gguf.GGMLQuantizationType[t.name]
    if t.name in ("Q4_0", "Q8_0"):
        return gguf.quants.quantize((rng.standard_normal(shape) * 0.05).astype(np.float32), qtype)
    *lead, n, k = shape
    blocks = rng.integers(0, 256, size=(*lead, n, k // t.block_elems, t.block_bytes), dtype=np.uint8)
    for at in _F16_FIELDS[t.name]:
        scales = (rng.uniform(0.25, 1.0, size=blocks.shape[:-1]) * _SCALE[t.name]).astype(np.float16)
        blocks[..., at:at + 2] = scales[..., None].view(np.uint8)
    return blocks.reshape(*lead, n, t.row_bytes(k))


def dequantize(blocks: np.ndarray, type_name: str) -> np.ndarray:
    import gguf

    return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[ggml_type(type_name).name])


def write_moe_gguf(path: str | Path, *, hidden: int, intermediate: int, experts: int, top_k: int,
                   layers: int = 1, types=("Q4_K", "Q4_K", "Q6_K"), seed: int = 0, split_max_tensors: int = 0,
                   per_expert: bool = False, arch: str = "qwen3moe") -> dict[int, tuple[np.ndarray, ...]]:
    """Write a GGUF with `layers` MoE layers (fused `_exps` tensors, or per-expert ones) and
    return {layer: (gate, up, down)} dequantized f32 [E, N, K]. With split_max_tensors the
    writer produces `stem-0000k-of-0000N.gguf` files next to `path`."""
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
            qtype = gguf.GGMLQuantizationType[ggml_type(type_name).name]
            if per_expert:
                for e in range(experts):
                    w.add_tensor(f"blk.{layer}.ffn_{proj}.{e}.weight", blocks[e], raw_dtype=qtype)
            else:
                w.add_tensor(f"blk.{layer}.ffn_{proj}_exps.weight", blocks, raw_dtype=qtype)
            dense.append(dequantize(blocks, type_name))
        weights[layer] = tuple(dense)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


def moe_reference(x: np.ndarray, ids: np.ndarray, weights: np.ndarray, gate, up, down) -> np.ndarray:
    """The FP32 MoE over dequantized weights: sum_j w_j * down_e(SiLU(gate_e x) * up_e x), in f64."""
    out = np.zeros((x.shape[0], down.shape[1]))
    for t in range(x.shape[0]):
        for e, wt in zip(ids[t], weights[t]):
            if e < 0:
                continue
            g = gate[e].astype(np.float64) @ x[t]
            u = up[e].astype(np.float64) @ x[t]
            out[t] += wt * (down[e].astype(np.float64) @ (g / (1 + np.exp(-g)) * u))
    return out
