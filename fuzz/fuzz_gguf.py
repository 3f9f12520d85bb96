"""Fuzz target: kt.gguf — a .gguf file's header, metadata and tensor table, the model
geometry derived from them, and every MoE layer's expert views.

Documented errors (kt/gguf/reader.py): KTError for every problem with the file
(WeightsError, a KTError, for a contradiction between metadata and tensors).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

_scratch = None
_allowed = None


def _setup():
    global _scratch, _allowed, GGUFModel
    if _scratch is None:
        from kt.gguf.reader import GGUFModel
        from kt_core.errors import KTError

        _scratch, _allowed = _harness.Scratch(), (KTError,)


def _read(path: Path) -> int:
    model = GGUFModel(path)
    g = model.geometry
    touched = 0
    for layer in model.moe_layers()[:4]:
        experts = model.layer_experts(layer)
        for e in range(min(experts.num_experts, 4)):
            for m in experts.expert(e):
                touched += int(m.reshape(-1)[:1].sum()) if m.size else 0   # the views must be readable
    return touched + g.hidden


def check(data: bytes) -> None:
    _setup()
    path = _scratch.folder() / "model.gguf"
    path.write_bytes(data)
    _harness.verdict(lambda: _read(path), _allowed, "reading a .gguf file")


if __name__ == "__main__":
    _harness.main(lambda: (_setup(), check)[1])
