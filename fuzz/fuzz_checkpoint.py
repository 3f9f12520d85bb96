"""Fuzz target: kt.weights.Checkpoint — a Hugging Face model folder (config.json, the
shard index, safetensors shards) as the loader and `kt convert` read it: the model spec from
config.json, the weight map, every expert tensor of the first MoE layers in the checkpoint's
format (float, FP8 blocks, RAWINT4, fused), and their dequantization.

Input: a folder in _harness.pack_files form (slots: seeds.CHECKPOINT_FILES).
Documented errors (checkpoint.py, models/spec.py): KTError (WeightsError is one).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

FILES = ("config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
         "model-00002-of-00002.safetensors", "model.safetensors")
_scratch = None


def _setup():
    global _scratch, _allowed, Checkpoint, checkpoint_experts, float_experts
    if _scratch is None:
        from kt.weights.checkpoint import Checkpoint
        from kt.weights.experts import checkpoint_experts, float_experts
        from kt_core.errors import KTError

        _scratch, _allowed = _harness.Scratch(), (KTError,)


def _read(folder: Path) -> None:
    ckpt = Checkpoint(folder)
    ckpt.source_hash()
    spec = ckpt.spec
    for layer in spec.moe_layers[:2]:
        for e in range(min(spec.num_experts, 2)):
            # RAWINT4 loads as stored; the others are also read as the quantizing methods read them.
            checkpoint_experts(ckpt, layer, e)
            if spec.quantization.method != "RAWINT4":
                float_experts(ckpt, layer, e)
    ckpt.close()


def check(data: bytes) -> None:
    _setup()
    folder = _scratch.folder(_harness.unpack_files(FILES, data))
    _harness.verdict(lambda: _read(folder), _allowed, "reading a checkpoint folder")


if __name__ == "__main__":
    _harness.main(lambda: (_setup(), check)[1])
