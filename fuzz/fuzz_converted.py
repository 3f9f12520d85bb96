"""Fuzz target: a kt converted folder (`kt convert`'s output) as `load_layer` reads it: the
manifest (format, version, codes layout, geometry, layer list, packed copies), each layer
file's size check and safetensors header, the codes/scales/zeros packed into a layer of the
geometry the seeds were made with (the user's layer, fixed; the folder is what lies), and the
packed copies (`kt convert --packed`, reference layouts) mapped or read into it.

Input: a folder in _harness.pack_files form (slots: FILES).
Documented errors: KTError (converted.py, loader.py; WeightsError is one), and the ValueError
kt_core.MoE raises for weights of the wrong shape or dtype.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

FILES = ("kt-manifest.json", "layer-0001.safetensors", "layer-0002.safetensors", "config.json",
         # packed copies in the reference backend's layouts (seeds.py adds them to some seeds)
         "layer-0001.kt-int8-rowmajor-ref-v1.packed", "layer-0002.kt-int8-rowmajor-ref-v1.packed",
         "layer-0001.kt-int4-group-ref-v1.packed", "layer-0002.kt-int4-group-ref-v1.packed")
H, I, E, TOP_K = 32, 32, 2, 1      # seeds.py's geometry
_scratch = None


def _setup():
    global _scratch, _allowed, _layers, load_layer, ConvertedFolder
    if _scratch is None:
        from kt.weights import ConvertedFolder, load_layer
        from kt_core import MoE
        from kt_core.errors import KTError

        _scratch, _allowed = _harness.Scratch(), (KTError,)
        # One layer per setting a folder can hold; the reference backend runs everywhere.
        _layers = {(m, g, z): MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method=m,
                                  group_size=g, zero_point=z, backend="reference")
                   for m, g, z in (("INT8", 0, False), ("INT4", 32, False), ("INT4", 32, True))}


def _read(folder: Path) -> None:
    source = ConvertedFolder.open(folder)
    manifest = source.manifest
    key = (manifest.get("method"), manifest.get("group_size"), manifest.get("zero_point"))
    moe = _layers.get(key, _layers[("INT8", 0, False)])
    for n, layer in enumerate((1, 2)):
        os.environ["KT_MAP_WEIGHTS"] = "1" if n == 0 else "0"     # both routes for packed copies
        load_layer(moe, source, layer)


def check(data: bytes) -> None:
    _setup()
    folder = _scratch.folder(_harness.unpack_files(FILES, data))
    _harness.verdict(lambda: _read(folder), _allowed, "loading a converted folder",
                     boundary=((ValueError,), ("kt_core/moe.py", "kt_core/_arrays.py")))


if __name__ == "__main__":
    _harness.main(lambda: (_setup(), check)[1])
