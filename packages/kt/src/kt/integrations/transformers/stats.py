"""Expert activation statistics: per MoE layer, how often the router picked each expert.
Recorded with `patch_model(..., record_stats=PATH)`, read back by the `frequency` placement."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from kt_core.errors import KTError

FORMAT = "kt-expert-stats"
VERSION = 1


class ExpertStats:
    """Counts of (token, top-k slot) picks per expert, one vector per decoder layer index."""

    def __init__(self, *, model_type: str, num_experts: int, top_k: int, layers, path: str | os.PathLike | None = None):
        self.model_type, self.num_experts, self.top_k = model_type, num_experts, top_k
        self.path = Path(path) if path is not None else None
        self.counts = {int(layer): torch.zeros(num_experts, dtype=torch.int64) for layer in layers}
        self.unsaved = False

    def record(self, layer: int, topk_ids: torch.Tensor) -> None:
        counts = self.counts[layer]
        if counts.device != topk_ids.device:   # counted where the router ran: no device sync per layer
            counts = self.counts[layer] = counts.to(topk_ids.device)
        counts += torch.bincount(topk_ids.reshape(-1), minlength=self.num_experts)[: self.num_experts]
        self.unsaved = True

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "model_type": self.model_type, "num_experts": self.num_experts,
                "top_k": self.top_k, "layers": {str(layer): c.cpu().tolist() for layer, c in self.counts.items()}}

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the counts as JSON, atomically (a reader never sees half a file)."""
        target = Path(path) if path is not None else self.path
        if target is None:
            raise KTError("no path to save expert statistics to: pass one, or patch with record_stats=PATH")
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_json(), f)
            os.replace(tmp, target)
        except BaseException:
            os.unlink(tmp)
            raise
        self.unsaved = False
        return target

    def save_if_unsaved(self) -> None:
        """At exit: write counts recorded since the last save (a recorder that saw nothing new
        leaves the file alone, so it cannot overwrite statistics another run recorded)."""
        if self.unsaved and self.path is not None:
            self.save()


def load_counts(path: str | os.PathLike, *, num_experts: int, model_type: str) -> dict[int, list[int]]:
    """Per-layer counts from a statistics file, checked against the model they will place."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise KTError(f"expert statistics file {path} does not exist; record one with patch_model(..., "
                      "record_stats=PATH)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise KTError(f"expert statistics file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise KTError(f"{path} is not a kt expert statistics file (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise KTError(f"{path} is version {data.get('version')!r} of the statistics format; this kt reads {VERSION}")
    if data.get("num_experts") != num_experts or data.get("model_type") != model_type:
        raise KTError(f"{path} was recorded on a {data.get('model_type')} model with {data.get('num_experts')} experts "
                      f"per layer; this is a {model_type} model with {num_experts}")
    layers = data.get("layers")
    ok = isinstance(layers, dict) and all(
        k.isdigit() and isinstance(v, list) and all(isinstance(c, int) and c >= 0 for c in v) for k, v in layers.items())
    if not ok:
        raise KTError(f"{path}: \"layers\" must map layer indices to lists of non-negative counts")
    return {int(k): v for k, v in layers.items()}
