"""`kt convert`: a model folder (bf16 / fp16 / fp32 / FP8 experts) -> a kt converted folder
of INT8 or INT4 codes (converted.py describes the folder).

One MoE layer at a time: the layer's experts are read from the memory-mapped shards,
quantized on the kt pool straight into that layer's output arrays, written, and dropped, so
the peak is about one layer of codes in RAM plus the source layer in the page cache — the
bound is printed before the first layer. `resume=True` continues an interrupted conversion
after checking it is the same source and the same settings.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kt_core import __version__
from kt_core.errors import KTError
from kt_core.formats import codes as kc

from .checkpoint import Checkpoint, _torch
from .converted import (
    AS_STORED_LAYOUT,
    AS_STORED_METHODS,
    CODES_LAYOUT,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    layer_file,
    read_manifest,
    whole_files,
    write_atomically,
    write_manifest,
)
from .experts import float_experts, projection_shapes
from .packing import add_packed
from .progress import layer_progress


def _layer_layout(method: str, spec, group: int, zero_point: bool) -> dict[str, tuple]:
    """{"gate.codes": (shape, dtype), ...} of one converted layer: each matrix's stored arrays
    stacked over the layer's experts."""
    return {f"{proj}.{part}": ((spec.num_experts, *shape), dtype)
            for proj, (n, k) in projection_shapes(spec).items()
            for part, (shape, dtype) in kc.layout(method, n, k, group, zero_point).items()}


def layer_bytes(method: str, spec, group: int, zero_point: bool) -> int:
    """Bytes of one converted layer (codes, scales, zeros), without allocating it."""
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize
               for shape, dtype in _layer_layout(method, spec, group, zero_point).values())


def _quantize_layer(ckpt: Checkpoint, layer: int, method: str, group: int, zero_point: bool) -> dict[str, np.ndarray]:
    out = {name: np.empty(shape, dtype) for name, (shape, dtype) in _layer_layout(method, ckpt.spec, group,
                                                                                    zero_point).items()}
    for e in range(ckpt.spec.num_experts):
        for proj, matrix in zip(("gate", "up", "down"), float_experts(ckpt, layer, e)):
            name = f"layer {layer} expert {e} {proj}"
            dst = {part: out[f"{proj}.{part}"][e] for part in ("codes", "scales", "zeros") if f"{proj}.{part}" in out}
            if method == "INT8":
                kc.quantize_int8(matrix, name, out=dst)
            else:
                kc.quantize_int4(matrix, group, zero_point, name, out=dst)
    return out


def _save_layer(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    from safetensors.numpy import save_file

    save_file(tensors, str(path), metadata=metadata)


def _output_error(exc: OSError, path: Path, done: int) -> KTError:
    """The KTError for a failed write into the output folder, saying what to do about it.
    Every write is covered (the layer files, the manifest, the folder and config.json): a
    read-only or full output folder used to surface as a bare PermissionError/OSError."""
    if exc.errno == errno.ENOSPC:
        why, fix = "the disk is full", "make room"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        why, fix = f"the output folder is not writable ({exc.strerror})", "make it writable"
    else:
        why, fix = str(exc), "fix that"
    return KTError(f"writing {path} failed: {why}. {done} layers are complete; {fix} and run the same kt convert "
                   "with --resume")


def _write_layer(path: Path, tensors: dict[str, np.ndarray], layer: int, method: str, done: int) -> None:
    # One metadata key: safetensors writes a map's keys in hash order, and converted files
    # should be byte-identical however often (or resumed) they are made.
    meta = {"kt": json.dumps({"layer": layer, "method": method, "codes_layout": CODES_LAYOUT[method]}, sort_keys=True)}
    try:
        write_atomically(path, lambda tmp: _save_layer(tmp, tensors, meta))
    except OSError as exc:
        raise _output_error(exc, path, done) from exc


def _write_manifest(out: Path, manifest: dict) -> None:
    try:
        write_manifest(out, manifest)
    except OSError as exc:
        raise _output_error(exc, out / MANIFEST, len(manifest["layers"])) from exc


def convert(model_dir: str | Path, out_dir: str | Path, *, method: str = "INT4", group_size: int | None = None,
            zero_point: bool = False, resume: bool = False, progress: bool = False, packed: bool = False,
            log: Callable[[str], None] = lambda _: None) -> Path:
    """Convert model_dir's routed experts into out_dir (INT8, or INT4 with group_size and
    zero_point; group_size None = the largest of 128/64/32 dividing the model's K's). Returns
    out_dir. The source folder is only read. packed=True also stores
    each layer in the packed layout of this host's kernels (packed.py): loads on hosts that
    select the same layout become a copy, at the codes' size again on disk."""
    method = method.upper()
    as_stored = method in AS_STORED_METHODS
    if method not in CODES_LAYOUT and not as_stored:
        raise KTError(f"kt convert writes {' or '.join(CODES_LAYOUT)} codes, or {', '.join(AS_STORED_METHODS)} packed "
                      f"copies (--packed); got method {method!r}")
    if as_stored and not packed:
        raise KTError(f"{method} experts load as the source stores them; `kt convert --method {method}` only makes "
                      "packed copies of them, so it needs --packed")
    if method != "INT4" and (group_size is not None or zero_point):
        given = "--group-size" if group_size is not None else "--zero-point"
        raise KTError(f"{given} applies to INT4 only; method {method} has no groups (drop it, or use --method INT4)")
    if method == "INT4" and group_size is not None and group_size not in kc.INT4_GROUPS:
        raise KTError(f"INT4 group size must be one of {kc.INT4_GROUPS}, got {group_size}")
    _torch()    # before anything is written: a folder left half-made for want of torch helps no one
    ckpt = Checkpoint(model_dir)
    spec = ckpt.spec
    if spec.family.expert_biases:
        raise KTError(f"{model_dir} is a {spec.model_type} model, whose experts carry biases, which a kt converted folder "
                      "does not store yet; load its checkpoint directly (GPT-OSS: method MXFP4 as stored, or BF16)")
    if method != "INT4":
        group_size = 0
    elif group_size is None:
        try:
            group_size = kc.int4_group_for(spec.hidden, spec.intermediate)
        except ValueError as exc:
            raise KTError(str(exc)) from None
    if as_stored and spec.quantization.method != method:
        raise KTError(f"{model_dir} stores {spec.quantization.method} experts; packed copies of method {method} need a "
                      f"checkpoint that stores {method} experts (kt convert --method INT8/INT4 quantizes instead)")
    if not as_stored and spec.quantization.method not in ("BF16", "FP8"):
        raise KTError(f"{model_dir} stores {spec.quantization.method} experts; kt convert reads bf16/fp16/fp32 or FP8 "
                      f"checkpoints (load {spec.quantization.method} checkpoints directly with method="
                      f"{spec.quantization.method})")
    if method == "INT4":
        for what, k in (("hidden", spec.hidden), ("intermediate", spec.intermediate)):
            if k % group_size:
                raise KTError(f"INT4 group size {group_size} does not divide {what} = {k}")
    out = Path(out_dir)
    if out.resolve() == ckpt.path.resolve():
        raise KTError("kt convert writes into a new folder, never into the source model folder")
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "kt_version": __version__, "method": method,
        "codes_layout": AS_STORED_LAYOUT if as_stored else CODES_LAYOUT[method], "group_size": group_size,
        "zero_point": zero_point,
        "source": {"path": str(ckpt.path.resolve()), "hash": ckpt.source_hash(), "model_type": spec.model_type,
                   "quantization": spec.quantization.method},
        "geometry": {"hidden": spec.hidden, "intermediate": spec.intermediate, "num_experts": spec.num_experts,
                     "top_k": spec.top_k, "moe_layers": list(spec.moe_layers)},
        "layers": {}, "complete": False,
    }
    if (out / MANIFEST).is_file():
        if not resume:
            raise KTError(f"{out} already holds a kt conversion; pass --resume to continue it or choose another folder")
        old = read_manifest(out)
        for key in ("method", "codes_layout", "group_size", "zero_point", "geometry"):
            if old.get(key) != manifest[key]:
                raise KTError(f"cannot resume {out}: its {key} is {old.get(key)!r}, this conversion's is {manifest[key]!r}")
        if old["source"]["hash"] != manifest["source"]["hash"]:
            raise KTError(f"cannot resume {out}: the source model changed since the conversion started")
        manifest["layers"] = whole_files(out, old.get("layers", {}))
        if old.get("packed"):
            manifest["packed"] = {layout: entry | {"layers": whole_files(out, entry["layers"])}
                                  for layout, entry in old["packed"].items()}
    elif out.exists() and not out.is_dir():
        raise KTError(f"{out} is a file; kt convert writes into a folder")
    elif out.exists() and any(out.iterdir()):
        raise KTError(f"{out} is not empty and is not a kt converted folder; choose an empty or new folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob(".*.partial"):
            stale.unlink()
        (out / "config.json").write_bytes((ckpt.path / "config.json").read_bytes())
    except OSError as exc:
        raise _output_error(exc, out, len(manifest["layers"])) from exc

    todo = [] if as_stored else [L for L in spec.moe_layers if str(L) not in manifest["layers"]]
    if not as_stored:
        per_layer = layer_bytes(method, spec, group_size, zero_point)
        log(f"{spec.model_type}: {len(spec.moe_layers)} MoE layers x {spec.num_experts} experts -> {method}"
            + (f" g{group_size}{' asym' if zero_point else ''}" if method == "INT4" else "")
            + f"; {len(todo)} to convert; peak RAM about {per_layer / 2**30:.2f} GiB (one converted layer) plus one "
              "source layer in the page cache")
    _write_manifest(out, manifest)
    bar = layer_progress("converting", len(spec.moe_layers), len(spec.moe_layers) - len(todo)) if progress and todo else None
    try:
        for layer in todo:
            name = layer_file(layer)
            _write_layer(out / name, _quantize_layer(ckpt, layer, method, group_size, zero_point), layer, method,
                         len(manifest["layers"]))
            manifest["layers"][str(layer)] = {"file": name, "bytes": (out / name).stat().st_size}
            _write_manifest(out, manifest)
            if bar:
                bar[0].advance(bar[1])
    finally:
        if bar:
            bar[0].stop()
    manifest["complete"] = True
    manifest["completed_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    _write_manifest(out, manifest)
    if packed:
        add_packed(out, progress=progress, log=log)
    return out
