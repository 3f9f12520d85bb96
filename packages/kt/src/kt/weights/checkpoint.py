"""A Hugging Face model folder: config.json + (sharded) *.safetensors, read lazily.

Tensors come straight out of the memory-mapped shards (safetensors' views, no copy); a
layer's experts are read one layer at a time by the loader and by `kt convert`. Every
problem — a missing shard, a truncated file, a tensor of the wrong shape or dtype — is a
KTError naming the file or tensor, what was expected and what was found.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from kt_core.errors import KTError, WeightsError

from ..models import ModelSpec, read_config, spec_from_config
from ..models.spec import Quantization

INDEX = "model.safetensors.index.json"


def _torch():
    try:
        import torch
    except ImportError:
        raise KTError("reading checkpoints needs PyTorch: pip install torch") from None
    return torch


class SafetensorsFolder:
    """Read-only access to a folder's safetensors tensors by name (its shard index, or every
    *.safetensors file in it), whatever model they belong to."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder)
        if not self.path.is_dir():
            raise KTError(f"model folder {self.path} does not exist")
        self._handles: dict[str, object] = {}    # before _weight_map: without an index it opens shards
        self.weight_map = self._weight_map()

    def _missing(self, name: str) -> str:
        return f"tensor {name} is not in the safetensors files at {self.path}"

    # -- tensors ----------------------------------------------------------------------------
    def _weight_map(self) -> dict[str, str]:
        index = self.path / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, IndexError) as exc:
                raise KTError(f"{index} is not a safetensors index (no weight_map): {exc}") from None
            # Fuzzing: a weight_map of another shape raised AttributeError/TypeError below, and a
            # shard named "../x" or "/x" read outside the model folder.
            if not isinstance(weight_map, dict) or not all(
                    isinstance(s, str) and s and Path(s).name == s and s not in (".", "..")
                    for s in weight_map.values()):
                raise KTError(f"{index}: weight_map should map tensor names to shard file names in {self.path}; "
                              f"found {str(weight_map)[:200]}")
            missing = sorted({s for s in weight_map.values() if not (self.path / s).is_file()})
            if missing:
                raise KTError(f"{self.path} is missing shard(s) {', '.join(missing)} listed in {INDEX}")
            return dict(weight_map)
        shards = sorted(p.name for p in self.path.glob("*.safetensors"))
        if not shards:
            raise KTError(f"{self.path} has no *.safetensors files (and no {INDEX})")
        weight_map = {}
        for shard in shards:
            for name in self._open(shard).keys():
                weight_map[name] = shard
        return weight_map

    def _open(self, shard: str):
        handle = self._handles.get(shard)
        if handle is None:
            _torch()
            from safetensors import safe_open

            path = self.path / shard
            try:
                handle = safe_open(str(path), framework="pt")
            except Exception as exc:   # safetensors raises its own error types
                raise KTError(f"{path} is not a readable safetensors file (truncated or corrupted?): {exc}") from None
            self._handles[shard] = handle
        return handle

    def _stored_name(self, name: str) -> str:
        return name

    def has(self, name: str) -> bool:
        return self._stored_name(name) in self.weight_map

    def tensor(self, name: str):
        stored = self._stored_name(name)
        shard = self.weight_map.get(stored)
        if shard is None:
            raise WeightsError(self._missing(name))
        try:
            return self._open(shard).get_tensor(stored)
        except KTError:
            raise
        except Exception as exc:
            raise KTError(f"reading {name} from {self.path / shard} failed (truncated or corrupted?): {exc}") from None

    def close(self) -> None:
        self._handles.clear()


class Checkpoint(SafetensorsFolder):
    """Read-only access to one model folder's tensors, of the model its config.json describes."""

    def __init__(self, model_dir: str | Path):
        path = Path(model_dir)
        if not path.is_dir():
            raise KTError(f"model folder {path} does not exist")
        self.config = read_config(path)
        self.spec: ModelSpec = spec_from_config(self.config)
        super().__init__(path)
        fam = self.spec.family
        if fam.mxfp4_experts_in_fp8 and self.spec.quantization.method == "FP8" and fam.per_expert is not None:
            first = f"{fam.expert_tensor(self.spec.moe_layers[0], 0, 'gate')}.weight"
            if self.has(first) and self.tensor(first).dtype in (_torch().int8, _torch().uint8):
                self.spec = dataclasses.replace(self.spec, quantization=Quantization("MXFP4", group_size=32))

    def _stored_name(self, name: str) -> str:
        # DeepSeek's own checkpoints (V4's) name tensors `layers.L...` where transformers' have `model.layers.L...`.
        if name not in self.weight_map and name.startswith("model.") and name[6:] in self.weight_map:
            return name[6:]
        return name

    def _missing(self, name: str) -> str:
        return f"tensor {name} is not in the checkpoint at {self.path} (a {self.spec.model_type} checkpoint should have it)"

    # -- identity -------------------------------------------------------------------------
    def source_hash(self) -> str:
        """sha256 of config.json and the shard index (or the shard names and sizes): what a
        converted folder records to notice that its source changed."""
        h = hashlib.sha256((self.path / "config.json").read_bytes())
        index = self.path / INDEX
        if index.is_file():
            h.update(index.read_bytes())
        else:
            for shard in sorted(set(self.weight_map.values())):
                h.update(f"{shard}:{(self.path / shard).stat().st_size}".encode())
        return h.hexdigest()

    @staticmethod
    def source_hash_of(model_dir: Path) -> str:
        """Checkpoint(model_dir).source_hash() without parsing the folder when it has an index:
        a converted folder checks its source at every open (once per layer through the
        wrapper), and parsing a large model's index and checking its shards took longer than
        mapping the layer."""
        if (model_dir / INDEX).is_file():
            return hashlib.sha256((model_dir / "config.json").read_bytes() + (model_dir / INDEX).read_bytes()).hexdigest()
        return Checkpoint(model_dir).source_hash()


def expect_tensor(t, name: str, shape: tuple[int, ...], dtypes: tuple, what: str):
    """t itself, or a WeightsError naming the tensor, the expected and the found shape/dtype."""
    if tuple(t.shape) != tuple(shape) or t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise WeightsError(f"{name} should be {want} {list(shape)} ({what}); found {str(t.dtype).replace('torch.', '')} "
                           f"{list(t.shape)}")
    return t
