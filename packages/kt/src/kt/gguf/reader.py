"""GGUF models (llama.cpp's format) for method LLAMAFILE: one file or a split set, memory-mapped.

    model = open_gguf("Qwen3-30B-A3B-Q4_K_M.gguf")     # or a folder, or any *-0000k-of-0000N.gguf
    model.geometry                                     # hidden, intermediate, experts, top_k, layers
    experts = model.layer_experts(3)                   # types ("Q4_K", "Q4_K", "Q6_K") and views
    gate, up, down = experts.expert(5)                 # uint8 [N, bytes per row] views, no copy

Expert tensors are found by llama.cpp's names: fused `blk.{L}.ffn_{gate,up,down}_exps.weight`
([E, N, K] in NumPy order) or per-expert `blk.{L}.ffn_{gate,up,down}.{e}.weight` (older
Mixtral files). The layer index is the model's. Parsing uses the `gguf` package; the tensor
data stay in the page cache (np.memmap) until the packer copies them. Every problem — a
missing split, a truncated or corrupted file, a missing tensor or key, a shape that contradicts
the metadata — is a KTError naming the file and what was expected.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kt_core.errors import KTError, WeightsError
from kt_core.formats.ggml import CODE_TYPES, GGML_TYPES, STORED_TYPES, mxfp4_codes

SPLIT = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
PROJECTIONS = ("gate", "up", "down")


def _gguf():
    try:
        import gguf
    except ImportError:
        raise KTError("reading GGUF files needs the gguf package: pip install gguf") from None
    return gguf


def split_files(path: str | Path) -> list[Path]:
    """The files of one GGUF model: `path` itself, the whole split set one split file belongs
    to, or the single model (one file or one split set) in a folder."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.glob("*.gguf") if p.is_file())
        if not files:
            raise KTError(f"{path} holds no .gguf files")
        sets = {SPLIT.match(p.name).group("stem") if SPLIT.match(p.name) else p.name for p in files}
        if len(sets) > 1:
            raise KTError(f"{path} holds more than one GGUF model ({', '.join(sorted(sets))}); pass the file "
                          "(or one file of the split set) to load")
        path = files[0]
    if not path.is_file():
        raise KTError(f"GGUF file {path} does not exist")
    m = SPLIT.match(path.name)
    if not m:
        return [path]
    count = int(m.group("count"))
    files = [path.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise KTError(f"{path.name} is split {count} ways, but {', '.join(missing)} is missing from {path.parent}")
    return files


# Bytes of each GGUF metadata value type (gguf's GGUFValueType numbering); 8 = string, 9 = array.
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_MAX_DIMS = 4   # GGML_MAX_DIMS


def _unreadable(path: Path, detail: str) -> KTError:
    return KTError(f"{path} is not a readable GGUF file (truncated or corrupted?): {detail}")


def _check_layout(path: Path) -> None:
    """Walk a GGUF file's header, metadata and tensor table with every count checked against
    the bytes left, before the gguf package parses it: gguf-py's reader trusts the counts,
    and an array count past the end of the file made it loop for hours (found by fuzzing)."""
    import mmap
    import struct

    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise _unreadable(path, f"{size} bytes, shorter than the 24-byte header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            at = 0

            def take(fmt: str, what: str):
                nonlocal at
                n = struct.calcsize(fmt)
                if at + n > size:
                    raise _unreadable(path, f"it ends at byte {size} inside {what} (offset {at})")
                value = struct.unpack_from(fmt, data, at)
                at += n
                return value[0] if len(value) == 1 else value

            def skip(n: int, what: str):
                nonlocal at
                if n > size - at:
                    raise _unreadable(path, f"{what} at offset {at} needs {n} bytes, only {size - at} are left")
                at += n

            def count(n: int, least: int, what: str) -> int:
                if n * least > size - at:
                    raise _unreadable(path, f"{what} at offset {at} claims {n} entries, more than the {size - at} "
                                            "bytes left can hold")
                return n

            def value(kind: int, what: str, depth: int = 0):
                if kind in _SCALAR_BYTES:
                    skip(_SCALAR_BYTES[kind], what)
                elif kind == 8:
                    skip(take("<Q", what), what)
                elif kind == 9 and depth < 4:
                    item = take("<I", what)
                    n = take("<Q", what)
                    if item in _SCALAR_BYTES:
                        skip(count(n, _SCALAR_BYTES[item], what) * _SCALAR_BYTES[item], what)
                    else:
                        for _ in range(count(n, 8, what)):
                            value(item, what, depth + 1)
                else:
                    raise _unreadable(path, f"{what} has value type {kind}, not a GGUF type")

            magic = bytes(data[0:4])
            if magic != b"GGUF":
                raise _unreadable(path, f"it starts with {magic!r}, not b'GGUF'")
            at = 4
            version = take("<I", "the version")
            if version not in (2, 3):
                raise _unreadable(path, f"GGUF version {version}; kt reads versions 2 and 3")
            tensors, keys = take("<Q", "the tensor count"), take("<Q", "the metadata count")
            count(keys, 13, "the metadata")
            for i in range(keys):
                skip(take("<Q", f"metadata key #{i}"), f"metadata key #{i}")
                value(take("<I", f"metadata #{i}'s type"), f"metadata #{i}'s value")
            count(tensors, 24, "the tensor table")
            for i in range(tensors):
                skip(take("<Q", f"tensor #{i}'s name"), f"tensor #{i}'s name")
                dims = take("<I", f"tensor #{i}'s dimension count")
                if not 1 <= dims <= _MAX_DIMS:
                    raise _unreadable(path, f"tensor #{i} has {dims} dimensions; GGUF tensors have 1 to {_MAX_DIMS}")
                skip(8 * dims + 4 + 8, f"tensor #{i}'s shape, type and offset")


def _read(path: Path):
    gguf = _gguf()
    _check_layout(path)
    try:
        return gguf.GGUFReader(str(path), "r")
    except Exception as exc:   # the parser raises ValueError, KeyError, IndexError... on bad bytes
        raise KTError(f"{path} is not a readable GGUF file (truncated or corrupted?): {type(exc).__name__}: {exc}") \
            from None


@dataclass(frozen=True)
class Geometry:
    arch: str
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int | None
    layers: int


@dataclass
class LayerExperts:
    """One MoE layer's expert matrices: ggml type names and uint8 [N, bytes per row] per expert."""

    layer: int
    types: tuple[str, str, str]          # gate, up, down
    matrices: tuple                      # per projection: an [E, N, row_bytes] array or a list of [N, row_bytes]

    @property
    def num_experts(self) -> int:
        return len(self.matrices[0])

    def expert(self, e: int) -> tuple:
        return tuple(m[e] for m in self.matrices)


class GGUFModel:
    """A GGUF model's metadata and tensors across its split files."""

    def __init__(self, path: str | Path):
        self.files = split_files(path)
        self.path = Path(path)
        self._readers = [_read(f) for f in self.files]
        # Metadata fields, decoded on first use: a real model's tokenizer arrays hold ~150k
        # strings that kt never needs.
        self._fields = {}
        for reader in self._readers:
            for name, field in reader.fields.items():
                if not name.startswith("GGUF."):
                    self._fields.setdefault(name, field)
        self._values = {}
        self._check_split()
        self.tensors = {}
        for f, reader in zip(self.files, self._readers):
            for t in reader.tensors:
                if t.name in self.tensors:
                    raise KTError(f"tensor {t.name} appears twice in {self.path} ({self.tensors[t.name][1].name} and "
                                  f"{f.name})")
                self.tensors[t.name] = (t, f)
        self.geometry = self._geometry()

    def meta(self, name: str, default=None):
        """Metadata value `name` (e.g. "qwen3moe.expert_count"), or `default` when absent."""
        if name not in self._fields:
            return default
        if name not in self._values:
            try:
                self._values[name] = self._fields[name].contents()
            except Exception as exc:
                raise KTError(f"{self.files[0]}: metadata key {name} cannot be read (corrupted file?): {exc}") from None
        return self._values[name]

    def _check_split(self) -> None:
        count = self.meta("split.count")
        if count is not None and int(count) != len(self.files):
            raise KTError(f"{self.files[0]} says the model is split in {count} files; found {len(self.files)}")

    def _key(self, key: str, default=None, required: bool = True):
        arch = self.meta("general.architecture")
        value = self.meta(f"{arch}.{key}", default)
        if value is None and required:
            raise WeightsError(f"{self.files[0]} has no metadata key {arch}.{key}, which a {arch} MoE model needs")
        return value

    def _geometry(self) -> Geometry:
        arch = self.meta("general.architecture")
        if not arch:
            raise WeightsError(f"{self.files[0]} has no general.architecture metadata; not a llama.cpp model file")
        # Mixtral-style files have no expert_feed_forward_length: every layer is MoE and
        # feed_forward_length is the expert's.
        ff_key = "expert_feed_forward_length"
        ff = self._key(ff_key, required=False)
        if ff is None:
            ff_key = "feed_forward_length"
            ff = self._key(ff_key, required=False)
        if ff is None:
            raise WeightsError(f"{self.files[0]} has neither {arch}.expert_feed_forward_length nor "
                               f"{arch}.feed_forward_length: the experts' intermediate size is unknown")
        top_k = self._key("expert_used_count", required=False)
        return Geometry(arch=str(arch), hidden=self._count("embedding_length", self._key("embedding_length")),
                        intermediate=self._count(ff_key, ff),
                        num_experts=self._count("expert_count", self._key("expert_count")),
                        top_k=None if top_k is None else self._count("expert_used_count", top_k),
                        layers=self._count("block_count", self._key("block_count")))

    def _count(self, key: str, value) -> int:
        """A size from the metadata, which must be a positive integer (a corrupt file's zero expert
        count made layer_experts index an empty list: found by fuzzing)."""
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise WeightsError(f"{self.files[0]}: metadata {key} must be a positive integer, found {value!r}")
        return int(value)

    def moe_layers(self) -> list[int]:
        """Layers whose routed experts this file holds."""
        pattern = re.compile(r"^blk\.(\d+)\.ffn_gate(_exps|\.\d+)\.weight$")
        return sorted({int(m.group(1)) for name in self.tensors if (m := pattern.match(name))})

    def _tensor(self, name: str, kind: str, shape: tuple[int, ...]):
        """(ggml type name, uint8 bytes array) of tensor `name`, checked against `shape` (ggml order, K first)."""
        t, f = self.tensors[name]
        type_name = t.tensor_type.name
        if tuple(int(x) for x in t.shape) != shape:
            raise WeightsError(f"{name} in {f.name} has shape {list(map(int, t.shape))} (ggml order); the metadata "
                               f"says {kind} {list(shape)}")
        if type_name not in GGML_TYPES and type_name not in STORED_TYPES:
            raise WeightsError(f"{name} in {f.name} is stored as {type_name}, which kt's LLAMAFILE method does not "
                               f"read; it reads {', '.join([*GGML_TYPES, *STORED_TYPES])}"
                               + (" (llama-quantize can rewrite the file as BF16 or Q8_0)" if type_name in ("F16", "F32")
                                  else ""))
        data = t.data
        if data.dtype != np.uint8:
            data = data.view(np.uint8)
        return type_name, data

    def layer_experts(self, layer: int) -> LayerExperts:
        g = self.geometry
        if not 0 <= layer < g.layers:
            raise WeightsError(f"layer {layer} is outside this {g.arch} model's {g.layers} layers")
        shapes = {"gate": (g.hidden, g.intermediate), "up": (g.hidden, g.intermediate),
                  "down": (g.intermediate, g.hidden)}
        types, matrices = [], []
        for proj in PROJECTIONS:
            fused = f"blk.{layer}.ffn_{proj}_exps.weight"
            if fused in self.tensors:
                t, data = self._tensor(fused, f"[K, N, experts] = {list(shapes[proj]) + [g.num_experts]}",
                                       (*shapes[proj], g.num_experts))
                types.append(t)
                matrices.append(data)
                continue
            # A file cannot hold more per-expert tensors than tensors: checked first, since a corrupt
            # expert count (billions) made building the name list run out of memory (found by fuzzing).
            complete = g.num_experts <= len(self.tensors) and all(
                f"blk.{layer}.ffn_{proj}.{e}.weight" in self.tensors for e in range(g.num_experts))
            if not complete:
                moe = self.moe_layers()
                raise WeightsError(f"layer {layer} of {self.path} has no routed experts ({fused} is missing); its MoE "
                                   f"layers are {moe[0]}..{moe[-1]}" if moe else
                                   f"{self.path} has no routed expert tensors ({fused})")
            names = [f"blk.{layer}.ffn_{proj}.{e}.weight" for e in range(g.num_experts)]
            parts = [self._tensor(n, f"[K, N] = {list(shapes[proj])}", shapes[proj]) for n in names]
            kinds = sorted({p[0] for p in parts})
            if len(kinds) > 1:
                raise WeightsError(f"layer {layer}'s {proj} experts are stored in several ggml types ({', '.join(kinds)}); "
                                   "kt needs one type per matrix of a layer")
            types.append(kinds[0])
            matrices.append([p[1] for p in parts])
        return LayerExperts(layer, tuple(types), tuple(matrices))

    def layer_biases(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Layer `layer`'s expert biases, float32 gate [E, I], up [E, I], down [E, H] (GPT-OSS's
        `blk.{L}.ffn_{gate,up,down}_exps.bias`)."""
        g = self.geometry
        out = []
        for proj, n in zip(PROJECTIONS, (g.intermediate, g.intermediate, g.hidden)):
            name = f"blk.{layer}.ffn_{proj}_exps.bias"
            if name not in self.tensors:
                raise WeightsError(f"{self.path} is a {g.arch} model, whose experts carry biases, but has no {name}")
            t, f = self.tensors[name]
            if t.tensor_type.name != "F32" or tuple(int(x) for x in t.shape) != (n, g.num_experts):
                raise WeightsError(f"{name} in {f.name} is {t.tensor_type.name} {list(map(int, t.shape))} (ggml order); "
                                   f"expected F32 [{n}, {g.num_experts}]")
            out.append(np.asarray(t.data, dtype=np.float32).reshape(g.num_experts, n))
        return tuple(out)


@functools.lru_cache(maxsize=8)
def _open_cached(files: tuple[str, ...], stamp: tuple) -> GGUFModel:
    return GGUFModel(files[0])


def open_gguf(path: str | Path) -> GGUFModel:
    """The GGUF model at `path` (a file, one file of a split set, or a folder); parsed once per
    process while its files are unchanged (each layer's wrapper opens the same model)."""
    files = split_files(path)
    stamp = tuple((f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _open_cached(tuple(str(f) for f in files), stamp)


def is_gguf(path: str | Path) -> bool:
    """True for a .gguf file or a folder holding .gguf files (and no kt/HF markers decide otherwise)."""
    path = Path(path)
    if path.is_file():
        return path.suffix == ".gguf"
    return path.is_dir() and any(path.glob("*.gguf"))


# What llama.cpp architectures' experts compute where it is not SiLU(gate) * up: the gated activation
# a layer must be made with (kt_core.MoE's swiglu tuple), and whether they add biases. GPT-OSS: its
# clamped SwiGLU at the constants llama.cpp's gpt-oss graph fixes (limit 7, alpha 1.702), biases in
# `blk.{L}.ffn_{gate,up,down}_exps.bias`.
ARCH_EXPERT_ACTIVATION = {"gemma4": (0.0, 0.0, False, "gelu_tanh"), "gpt-oss": (7.0, 1.702, False, "silu")}
ARCH_EXPERT_BIASES = {"gpt-oss"}


def arch_expert_activation(model: GGUFModel) -> tuple[float, float, bool, str]:
    """The gated activation of `model`'s experts, as kt_core.MoE.swiglu says it (SiLU unless the
    architecture is listed above)."""
    return ARCH_EXPERT_ACTIVATION.get(model.geometry.arch, (0.0, 0.0, False, "silu"))


def arch_expert_biases(model: GGUFModel) -> bool:
    return model.geometry.arch in ARCH_EXPERT_BIASES


def expert_reader(moe, model: GGUFModel, layer: int):
    """(logical expert count, read(e) -> MoE.load_experts tuple) for layer `layer`, after checking
    the layer `moe` (a kt_core.MoE) against the file: method, geometry and ggml types."""
    g = model.geometry
    if moe.method != "LLAMAFILE":
        raise WeightsError(f"{model.path} is a GGUF model; its experts load with method LLAMAFILE (alias GGUF), "
                           f"not {moe.method}")
    if (g.hidden, g.intermediate) != (moe.hidden_size, moe.intermediate_size):
        raise WeightsError(f"{model.path} ({g.arch}) has hidden={g.hidden}, expert intermediate={g.intermediate}; the "
                           f"layer was created with hidden_size={moe.hidden_size}, "
                           f"intermediate_size={moe.intermediate_size}")
    if g.top_k is not None and g.top_k != moe.top_k:
        raise WeightsError(f"{model.path} routes each token to {g.top_k} experts ({g.arch}.expert_used_count); the "
                           f"layer was created with top_k={moe.top_k}")
    activation, biased = arch_expert_activation(model), arch_expert_biases(model)
    if moe.swiglu != activation or moe.expert_bias != biased:
        wanted = (f"gate_activation={activation[3]!r}" if activation[3] != "silu" else
                  f"swiglu_limit={activation[0]}, swiglu_alpha={activation[1]}" if activation[0] or activation[1] else
                  "no swiglu settings or gate_activation") + (", expert_bias=True" if biased else ", no expert biases")
        raise WeightsError(f"{model.path} is a {g.arch} model: create its layers with {wanted} (this one was made with "
                           f"swiglu={moe.swiglu}, expert_bias={moe.expert_bias})")
    experts = model.layer_experts(layer)
    if experts.types != moe.weight_types:
        raise WeightsError(f"layer {layer} of {model.path} stores gate, up, down as {', '.join(experts.types)}; the "
                           f"layer was created for {', '.join(moe.weight_types)} (weight_types)")
    biases = model.layer_biases(layer) if biased else None

    def read(e):
        weights = experts.expert(e)
        if experts.types[0] in CODE_TYPES:   # ggml MXFP4 blocks as the MXFP4 method takes them: codes, scales
            codes, scales = zip(*(mxfp4_codes(m) for m in weights))   # each uint8 [N, row bytes]
            weights = (*codes, scales, None)
        else:
            weights = (*weights, None, None)
        return (*weights, tuple(b[e] for b in biases)) if biases is not None else weights

    return experts.num_experts, read
