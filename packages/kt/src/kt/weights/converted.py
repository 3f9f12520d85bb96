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

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kt_core.errors import KTError, WeightsError
from kt_core.formats.codes import INT4_GROUPS, layout

from .checkpoint import Checkpoint, _torch

MANIFEST = "kt-manifest.json"
FORMAT = "kt-converted"
FORMAT_VERSION = 1
CODES_LAYOUT = {"INT8": "kt-codes-int8-rowwise-v1", "INT4": "kt-codes-int4-nibble-v1"}
# Methods a checkpoint's experts load as, stored: a folder of these holds no codes, only packed
# copies of the source's experts (packed.py), and falls back to the source model elsewhere.
AS_STORED_LAYOUT = "none: packed copies of the source's experts"
AS_STORED_METHODS = ("BF16", "FP8", "RAWINT4")


def layer_file(layer: int) -> str:
    return f"layer-{layer:04d}.safetensors"


@functools.cache
def _umask() -> int:
    """Read once: the only way to read the umask is to set it, which races with other threads."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: Path, write) -> None:
    """write(tmp_path) then fsync and rename onto path; the temporary file is removed on failure.
    The file gets the mode the umask gives a new file (safetensors creates its files 0600)."""
    tmp = path.with_name(f".{path.name}.partial")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def whole_files(folder: Path, layers: dict) -> dict:
    """The entries of a manifest's {layer: {file, bytes}} whose file is in `folder`, whole."""
    return {k: v for k, v in layers.items()
            if (folder / v["file"]).is_file() and (folder / v["file"]).stat().st_size == v["bytes"]}


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
    if not isinstance(manifest, dict):
        raise KTError(f"{path} should hold a JSON object; found a {type(manifest).__name__}")
    if manifest.get("format") != FORMAT:
        raise KTError(f"{path} is not a kt converted folder manifest (format {manifest.get('format')!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise KTError(f"{folder} was converted with format version {manifest.get('format_version')}; this kt reads "
                      f"version {FORMAT_VERSION}: convert the model again with this kt")
    method = manifest.get("method")
    layouts = CODES_LAYOUT | dict.fromkeys(AS_STORED_METHODS, AS_STORED_LAYOUT)
    if not isinstance(method, str) or layouts.get(method) != manifest.get("codes_layout"):
        raise KTError(f"{path}: codes layout {manifest.get('codes_layout')!r} for {method} is not one this kt reads "
                      f"({layouts})")
    _check_manifest(path, manifest)
    return manifest


def _is_int(x, low: int = 0) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _check_manifest(path: Path, m: dict) -> None:
    """Every field the loader reads, with the type it needs: a damaged or hand-edited manifest
    is a KTError naming the field, never a KeyError/TypeError deep in the loader (fuzzing)."""
    def bad(field: str, want: str, found) -> KTError:
        return KTError(f"{path}: {field} should be {want}, found {str(found)[:200]!r}; the converted folder is damaged")

    group = m.get("group_size", 0)
    if m["method"] == "INT4" and group not in INT4_GROUPS or m["method"] != "INT4" and group not in (0, None):
        raise bad("group_size", f"one of {INT4_GROUPS}" if m["method"] == "INT4" else "0", group)
    if not isinstance(m.get("zero_point", False), bool):
        raise bad("zero_point", "true or false", m.get("zero_point"))
    g = m.get("geometry")
    if not isinstance(g, dict):
        raise bad("geometry", "an object", g)
    for key in ("hidden", "intermediate", "num_experts"):
        if not _is_int(g.get(key), 1):
            raise bad(f"geometry.{key}", "a positive integer", g.get(key))
    if not isinstance(g.get("moe_layers"), list) or not all(_is_int(x) for x in g["moe_layers"]):
        raise bad("geometry.moe_layers", "a list of layer numbers", g.get("moe_layers"))
    def check_layers(field: str, layers) -> None:
        if not isinstance(layers, dict):
            raise bad(field, "an object", layers)
        for key, entry in layers.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or not _is_int(entry.get("bytes")):
                raise bad(f"{field}[{key!r}]", '{"file": name, "bytes": size}', entry)
            name = entry["file"]
            if not name or Path(name).name != name or name in (".", ".."):   # never a path out of the folder
                raise bad(f"{field}[{key!r}].file", "a file name in the folder", name)

    check_layers("layers", m.get("layers"))
    packed = m.get("packed", {})      # optional: packed.py
    if not isinstance(packed, dict):
        raise bad("packed", "an object", packed)
    for layout_id, entry in packed.items():
        if (not isinstance(entry, dict) or not _is_int(entry.get("expert_bytes"), 1)
                or not _is_int(entry.get("expert_stride"), entry["expert_bytes"]) or entry["expert_stride"] % 64):
            raise bad(f"packed[{layout_id!r}]", '{"expert_bytes": size, "expert_stride": a multiple of 64 >= size, '
                      '"layers": {...}}', entry)
        check_layers(f"packed[{layout_id!r}].layers", entry.get("layers"))
    src = m.get("source")
    if not isinstance(src, dict) or not isinstance(src.get("path"), str) or not isinstance(src.get("hash"), str):
        raise bad("source", '{"path": ..., "hash": ...}', src)


def expected_layer_arrays(method: str, geometry: dict, group_size: int, zero_point: bool) -> dict[str, tuple]:
    """{"gate.codes": (shape, numpy dtype), ...}: the arrays one converted layer file holds."""
    E, H, I = geometry["num_experts"], geometry["hidden"], geometry["intermediate"]
    return {f"{proj}.{part}": ((E, *shape), np.dtype(dtype))
            for proj, (n, k) in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I)))
            for part, (shape, dtype) in layout(method, n, k, group_size, zero_point).items()}


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
            now = Checkpoint.source_hash_of(path)
            if now != src["hash"]:
                raise KTError(f"the source model {path} changed since {self.path} was converted from it (config or "
                              "shard index differ); convert it again")

    @property
    def as_stored(self) -> bool:
        """True for a folder of packed copies of the source's own format (no codes)."""
        return self.method in AS_STORED_METHODS

    def source_checkpoint(self, why: str):
        """The source model, for the layers this folder has no packed copy of (`why` says which);
        a KTError when it is gone (check_source already refused a changed one)."""
        path = Path(self.manifest["source"]["path"])
        if not (path / "config.json").is_file():
            raise KTError(f"{self.path} holds {self.method} experts only as packed copies "
                          f"({', '.join(self.manifest.get('packed', {})) or 'none yet'}) and {why}; its source model "
                          f"{path} is gone: run `kt convert SOURCE {self.path} --method {self.method} --packed --resume` "
                          "on this host, or load the source model itself")
        return Checkpoint(path)

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
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        except Exception as exc:
            raise KTError(f"{path} is not a readable safetensors file: {exc}") from None
        # The arrays must be the ones the manifest's method, geometry and group describe
        # (fuzzing: a missing array was a KeyError, a short one an IndexError at load).
        want = expected_layer_arrays(self.method, self.geometry, self.group_size, self.zero_point)
        if set(tensors) != set(want):
            raise KTError(f"{path} holds arrays {sorted(tensors)}; a {self.method} layer holds {sorted(want)}: the "
                          "converted folder is damaged")
        for name, (shape, dtype) in want.items():
            t = tensors[name]
            found = (tuple(t.shape), str(t.dtype).replace("torch.", ""))
            if found != (shape, dtype.name):
                raise KTError(f"{path}: {name} is {found[1]} {list(found[0])}, expected {dtype.name} {list(shape)} "
                              f"({self.method}, geometry {self.geometry['num_experts']} experts x hidden "
                              f"{self.geometry['hidden']} x intermediate {self.geometry['intermediate']})")
        return tensors

    def expert(self, tensors: dict, expert: int) -> tuple:
        """(gate, up, down, scales, zeros) codes of one logical expert, as MoE.load_experts takes."""
        codes = tuple(tensors[f"{p}.codes"][expert] for p in ("gate", "up", "down"))
        scales = tuple(tensors[f"{p}.scales"][expert] for p in ("gate", "up", "down"))
        zeros = tuple(tensors[f"{p}.zeros"][expert] for p in ("gate", "up", "down")) if self.zero_point else None
        return (*codes, scales, zeros)
