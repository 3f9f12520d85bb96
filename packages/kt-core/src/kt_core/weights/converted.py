"""A kt converted folder: `kt convert`'s output, INT8/INT4 codes independent of the host.

    kt-manifest.json          format, version, codes layout, quantization, source hash,
                              geometry, and the layers completed so far
    layer-0003.safetensors    one per MoE layer: {gate,up,down}.{codes,scales[,zeros]},
                              each stacked over the layer's logical experts

Nothing in it depends on the NUMA or thread count of the host that loads it: the loader
packs each expert into its NUMA node's memory at load. Files are written under temporary
names and renamed when complete, and the manifest lists a layer only after its file is in
place, so an interrupted conversion never leaves a file that looks valid.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import KTError, WeightsError
from .checkpoint import _torch

MANIFEST = "kt-manifest.json"
FORMAT = "kt-converted"
FORMAT_VERSION = 1
CODES_LAYOUT = {"INT8": "kt-codes-int8-rowwise-v1", "INT4": "kt-codes-int4-nibble-v1"}


def layer_file(layer: int) -> str:
    return f"layer-{layer:04d}.safetensors"


def write_atomically(path: Path, write) -> None:
    """write(tmp_path) then fsync and rename onto path; the temporary file is removed on failure."""
    tmp = path.with_name(f".{path.name}.partial")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_manifest(folder: Path, manifest: dict) -> None:
    write_atomically(folder / MANIFEST, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True)))


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise KTError(f"{folder} is not a kt converted folder: no {MANIFEST}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise KTError(f"{path} is not valid JSON: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise KTError(f"{path} is not a kt converted folder manifest (format {manifest.get('format')!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise KTError(f"{folder} was converted with format version {manifest.get('format_version')}; this kt reads "
                      f"version {FORMAT_VERSION}: convert the model again with this kt")
    method = manifest.get("method")
    if CODES_LAYOUT.get(method) != manifest.get("codes_layout"):
        raise KTError(f"{path}: codes layout {manifest.get('codes_layout')!r} for {method} is not one this kt reads "
                      f"({CODES_LAYOUT})")
    return manifest


@dataclass
class ConvertedFolder:
    path: Path
    manifest: dict

    @classmethod
    def open(cls, folder: str | Path, *, check_source: bool = True) -> ConvertedFolder:
        folder = Path(folder)
        manifest = read_manifest(folder)
        if not manifest.get("complete"):
            done = len(manifest.get("layers", {}))
            raise KTError(f"{folder} is an unfinished conversion ({done} of {len(manifest['geometry']['moe_layers'])} "
                          "layers); run `kt convert ... --resume` to finish it")
        self = cls(folder, manifest)
        if check_source:
            self.check_source()
        return self

    def check_source(self) -> None:
        """Refuse a folder whose source model, if still where it was, changed since conversion."""
        src = self.manifest["source"]
        path = Path(src["path"])
        if (path / "config.json").is_file():
            from .checkpoint import Checkpoint

            now = Checkpoint(path).source_hash()
            if now != src["hash"]:
                raise KTError(f"the source model {path} changed since {self.path} was converted from it (config or "
                              "shard index differ); convert it again")

    @property
    def method(self) -> str:
        return self.manifest["method"]

    @property
    def group_size(self) -> int:
        return int(self.manifest.get("group_size", 0))

    @property
    def zero_point(self) -> bool:
        return bool(self.manifest.get("zero_point", False))

    @property
    def geometry(self) -> dict:
        return self.manifest["geometry"]

    def layer_tensors(self, layer: int) -> dict:
        entry = self.manifest["layers"].get(str(layer))
        if entry is None:
            raise WeightsError(f"{self.path} has no layer {layer}; its MoE layers are {self.geometry['moe_layers']}")
        path = self.path / entry["file"]
        if not path.is_file() or path.stat().st_size != entry["bytes"]:
            size = path.stat().st_size if path.is_file() else "missing"
            raise KTError(f"{path} should hold {entry['bytes']} bytes, found {size}: the converted folder is damaged")
        _torch()
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return {name: f.get_tensor(name) for name in f.keys()}
        except Exception as exc:
            raise KTError(f"{path} is not a readable safetensors file: {exc}") from None

    def expert(self, tensors: dict, expert: int) -> tuple:
        """(gate, up, down, scales, zeros) codes of one logical expert, as MoE.load_experts takes."""
        codes = tuple(tensors[f"{p}.codes"][expert] for p in ("gate", "up", "down"))
        scales = tuple(tensors[f"{p}.scales"][expert] for p in ("gate", "up", "down"))
        zeros = tuple(tensors[f"{p}.zeros"][expert] for p in ("gate", "up", "down")) if self.zero_point else None
        return (*codes, scales, zeros)
