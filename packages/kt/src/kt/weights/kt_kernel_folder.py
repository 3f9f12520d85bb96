"""Folders of experts quantized by kt-kernel 0.7.2 (KTransformers), read into kt's INT8 / INT4 codes.

kt-kernel's `convert_cpu_weights.py` quantizes a model's experts to AMXINT8 / AMXINT4 (hours for a
large model) and writes each expert's weights as its CPU buffers hold them:

    model*.safetensors        blk.{L}.ffn_{gate,up,down}_exps.{E}.numa.{N}.weight   int8, 1-D
                              blk.{L}.ffn_{gate,up,down}_exps.{E}.numa.{N}.scale    f32, 1-D
                              (+ the non-expert tensors and a copy of config.json)
    _layer_{L}/_numa_{N}/     {INT8,INT4}_{gate,up,down}_{E}_{bytes}Byte_{quant,scale}_.kt
                              (the same arrays unmerged: what kt-kernel's wrapper saves, and the
                              script's output with merging off)

Slice N of a layer is NUMA node N's tensor-parallel share: rows [N·I/T, (N+1)·I/T) of gate and up,
the same columns of down, T slices in all, each quantized on its own with one scale per row.
The bytes are kt-kernel's "kt-int8-n32-k64-vnni-v1" tiles (its only INT8 weight layout, on every
CPU variant of 0.7.2; INT4 is the same tiles over 128 k, k and k + 64 sharing a byte):

    per block of 32 rows x 64 k (INT4: 128 k), blocks k-major within each 32-row band:
      two halves of 16 rows, each 16 chunks of 64 bytes; chunk c holds, for row r of the half,
      4 bytes at 4r: k = 4c .. 4c+3 of the block (INT4: low nibble k, high nibble k + 64),
      INT4 codes as signed nibbles.

kt decodes that once, at load: gate and up become kt's INT8 (per-row scale) or INT4 (a group
that divides the slice width, every group of a row carrying the row's scale) exactly. Down's row
has one scale per slice: exact in INT4's groups; INT8 keeps one scale per row, so a down matrix
of T > 1 slices is handed over as its exact float values and requantized per row (one more
rounding, logged). The layout was read off files kt-kernel 0.7.2 wrote on an AVX-512 host;
`tests/test_kt_kernel_folder.py` checks kt against it where a kt-kernel venv is at hand.
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path

import numpy as np

from kt_core.errors import KTError, WeightsError
from kt_core.formats.codes import INT4_GROUPS

from .checkpoint import Checkpoint

log = logging.getLogger("kt")

KEY = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.(\d+)\.numa\.(\d+)\.(weight|scale)$")
DUMP = re.compile(r"^(INT8|INT4)_(gate|up|down)_(\d+)_(\d+)Byte_(quant|scale)_\.kt$")
LAYER_DIR = re.compile(r"^_layer_(\d+)$")
NUMA_DIR = re.compile(r"^_numa_(\d+)$")
PROJS = ("gate", "up", "down")
BAND, HALF, CHUNK = 32, 16, 64   # rows per band, rows per half, bytes per chunk


@functools.lru_cache(maxsize=32)
def tile_order(n: int, k: int, bits: int) -> np.ndarray:
    """For each code of an [n, k] matrix in kt-kernel's tiles (bytes for INT8, nibbles low-then-high
    for INT4), its row-major index n_i * k + k_i."""
    span = 64 if bits == 8 else 128           # k per block
    if n % BAND or k % span:
        raise WeightsError(f"kt-kernel's {'INT8' if bits == 8 else 'INT4'} tiles cover {BAND} rows x {span} k; "
                           f"a [{n}, {k}] slice is not made of them")
    i = np.arange(n * k, dtype=np.int64)
    p, hi = (i, 0) if bits == 8 else (i // 2, i % 2)
    block, r = p // (BAND * 64), p % (BAND * 64)
    band, kb = block // (k // span), block % (k // span)
    half, r = r // (HALF * CHUNK), r % (HALF * CHUNK)
    chunk, r = r // CHUNK, r % CHUNK
    row = band * BAND + half * HALF + r // 4
    col = kb * span + hi * 64 + chunk * 4 + r % 4
    return row * k + col


def untile(raw: np.ndarray, n: int, k: int, bits: int) -> np.ndarray:
    """kt-kernel's tiled codes -> row-major int8 codes [n, k] (INT4: the signed nibble values)."""
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if bits == 8:
        codes = raw.view(np.int8)
    else:
        nib = np.empty(2 * raw.size, np.int8)
        nib[0::2], nib[1::2] = raw & 15, raw >> 4
        codes = np.where(nib > 7, nib - 16, nib).astype(np.int8)
    out = np.empty(n * k, np.int8)
    out[tile_order(n, k, bits)] = codes
    return out.reshape(n, k)


class _Merged:
    """The merged safetensors: tensors through a Checkpoint (config.json is the script's copy)."""

    def __init__(self, ckpt: Checkpoint):
        self.ckpt = ckpt
        self.entries = [tuple(int(x) if x.isdigit() else x for x in m.groups())
                        for m in map(KEY.match, (n for n in ckpt.weight_map if n.startswith("blk."))) if m]

    def array(self, layer: int, proj: str, expert: int, numa: int, part: str) -> np.ndarray:
        return self.ckpt.tensor(f"blk.{layer}.ffn_{proj}_exps.{expert}.numa.{numa}.{part}").numpy()


class _Dumps:
    """The unmerged `_layer_L/_numa_N/*.kt` files."""

    def __init__(self, path: Path):
        self.files: dict[tuple, Path] = {}
        self.bits = set()
        for layer_dir in path.iterdir():
            lm = LAYER_DIR.match(layer_dir.name)
            if not (lm and layer_dir.is_dir()):
                continue
            for numa_dir in layer_dir.iterdir():
                nm = NUMA_DIR.match(numa_dir.name)
                if not (nm and numa_dir.is_dir()):
                    continue
                for f in numa_dir.iterdir():
                    dm = DUMP.match(f.name)
                    if dm:
                        kind, proj, expert, _, part = dm.groups()
                        self.bits.add(kind)
                        self.files[(int(lm[1]), proj, int(expert), int(nm[1]), "weight" if part == "quant" else "scale")] = f
        self.entries = [(layer, proj, e, numa, part) for (layer, proj, e, numa, part) in self.files]

    def array(self, layer: int, proj: str, expert: int, numa: int, part: str) -> np.ndarray:
        f = self.files.get((layer, proj, expert, numa, part))
        if f is None:
            raise WeightsError(f"kt-kernel dump of layer {layer} lacks {proj} {part} of expert {expert}, NUMA slice {numa}")
        return np.fromfile(f, dtype=np.float32 if part == "scale" else np.int8)


def is_dump_folder(path: Path) -> bool:
    return path.is_dir() and any(LAYER_DIR.match(p.name) and p.is_dir() for p in path.iterdir())


def is_merged(ckpt: Checkpoint) -> bool:
    """Whether a model folder is kt-kernel's merged output. Runs on every checkpoint opened, so the
    regular expression sees only "blk." names (none in a Hugging Face folder)."""
    return any(name.startswith("blk.") and KEY.match(name) for name in ckpt.weight_map)


class KtKernelFolder:
    """One kt-kernel AMXINT8 / AMXINT4 folder. Each layer's geometry and method come from its own
    files (and must agree with config.json where the folder has one)."""

    def __init__(self, path: Path, store, spec=None):
        self.path, self._store, self.spec = Path(path), store, spec
        self._layers: dict[int, dict] = {}
        self._geometry: dict[int, tuple] = {}
        for layer, _proj, e, numa, _part in store.entries:
            info = self._layers.setdefault(layer, {"experts": set(), "slices": set()})
            info["experts"].add(e)
            info["slices"].add(numa)
        if not self._layers:
            raise KTError(f"{self.path} holds no kt-kernel expert tensors (blk.L.ffn_*_exps.E.numa.N.*)")

    @classmethod
    def open(cls, path: str | Path) -> KtKernelFolder:
        path = Path(path)
        if is_dump_folder(path):
            return cls(path, _Dumps(path))
        return cls(path, *cls.merged(Checkpoint(path)))

    @staticmethod
    def merged(ckpt: Checkpoint) -> tuple:
        """(store, spec) of a merged folder already opened as a Checkpoint."""
        return _Merged(ckpt), ckpt.spec

    def layer(self, layer: int) -> tuple[int, int]:
        """(logical experts, NUMA slices) of a layer, checked to be complete."""
        info = self._layers.get(layer)
        if info is None:
            raise WeightsError(f"{self.path} holds no experts of layer {layer}; it has layers {sorted(self._layers)}")
        experts, slices = sorted(info["experts"]), sorted(info["slices"])
        if experts != list(range(len(experts))) or slices != list(range(len(slices))):
            raise WeightsError(f"{self.path} layer {layer}: experts {experts[:3]}..{experts[-1]} and NUMA slices "
                               f"{slices} should each be numbered from 0 without gaps (an interrupted conversion?)")
        return len(experts), len(slices)

    def geometry(self, layer: int) -> tuple[int, int, str, int]:
        """(hidden, intermediate, method, INT4 group or 0) of a layer, from its files: a row scale per
        row, so down's scale count is hidden and a gate slice's is intermediate / slices; the bytes
        of a gate slice say INT8 or INT4."""
        if layer not in self._geometry:
            self._geometry[layer] = self._read_geometry(layer)
        return self._geometry[layer]

    def _read_geometry(self, layer: int) -> tuple[int, int, str, int]:
        _, slices = self.layer(layer)
        hidden = self._store.array(layer, "down", 0, 0, "scale").size
        intermediate = slices * self._store.array(layer, "gate", 0, 0, "scale").size
        size = self._store.array(layer, "gate", 0, 0, "weight").size
        cells = intermediate // slices * hidden
        if size not in (cells, cells // 2):
            raise WeightsError(f"{self.path} layer {layer}: a gate slice of {size} bytes is neither INT8 ({cells}) nor "
                               f"INT4 ({cells // 2}) for hidden={hidden}, intermediate={intermediate} in {slices} "
                               "NUMA slice(s)")
        if self.spec is not None and (self.spec.hidden, self.spec.intermediate) != (hidden, intermediate):
            raise WeightsError(f"{self.path}: its tensors have hidden={hidden}, intermediate={intermediate}, its "
                               f"config.json hidden={self.spec.hidden}, intermediate={self.spec.intermediate}")
        if size == cells:
            return hidden, intermediate, "INT8", 0
        # INT4: the largest of kt's groups dividing hidden and a slice's width, so that each group
        # lies in one slice and carries that slice's row scale.
        width = intermediate // slices
        fits = [g for g in sorted(INT4_GROUPS, reverse=True) if hidden % g == 0 and width % g == 0]
        if not fits:
            raise WeightsError(f"{self.path}: no INT4 group of {INT4_GROUPS} divides hidden={hidden} and the slice "
                               f"width {width}")
        return hidden, intermediate, "INT4", fits[0]

    def reader(self, layer: int):
        """(logical experts, expert -> (gate, up, down, scales, None)) in the form MoE.load_experts takes."""
        experts, slices = self.layer(layer)
        hidden, intermediate, method, group = self.geometry(layer)
        width = intermediate // slices
        if method == "INT8" and slices > 1:
            log.info("%s: INT8 down matrices come in %d slices with a scale each; kt's INT8 has one scale per row, "
                     "so they are requantized per row from their exact values", self.path, slices)
        bits = 8 if method == "INT8" else 4

        def part(proj, e, numa, n, k):
            raw = self._store.array(layer, proj, e, numa, "weight")
            # INT4's stored scale is the weight step over 16: kt-kernel's kernels read a nibble as
            # the high half of an int8 (16 q).
            scale = np.asarray(self._store.array(layer, proj, e, numa, "scale"), np.float32).reshape(-1)
            scale = scale * np.float32(16) if bits == 4 else scale
            if raw.size * (8 // bits) != n * k or scale.size != n:
                raise WeightsError(f"{self.path} layer {layer} expert {e} {proj} slice {numa}: {raw.size} bytes and "
                                   f"{scale.size} scales, expected {n * k * bits // 8} and {n} for [{n}, {k}]")
            return untile(raw, n, k, bits), scale

        def read(e: int):
            gate_up = []
            for proj in ("gate", "up"):
                pieces = [part(proj, e, j, width, hidden) for j in range(slices)]
                codes = np.concatenate([c for c, _ in pieces])
                scale = np.concatenate([s for _, s in pieces])
                gate_up.append((codes, scale))
            pieces = [part("down", e, j, hidden, width) for j in range(slices)]
            if method == "INT8":
                (gq, gs), (uq, us) = gate_up
                if slices == 1:
                    dq, ds = pieces[0]
                    return gq, uq, dq, (gs[:, None], us[:, None], ds[:, None]), None
                down = np.concatenate([c.astype(np.float32) * s[:, None] for c, s in pieces], axis=1)
                return gq, uq, down, (gs[:, None], us[:, None], None), None
            down_codes = np.concatenate([c for c, _ in pieces], axis=1)
            down_scale = np.repeat(np.stack([s for _, s in pieces], axis=1), width // group, axis=1)
            (gq, gs), (uq, us) = gate_up
            gate_scale = np.repeat(gs[:, None], hidden // group, axis=1)
            up_scale = np.repeat(us[:, None], hidden // group, axis=1)
            return (*(_nibbles(q) for q in (gq, uq, down_codes)), (gate_scale, up_scale, down_scale), None)

        return experts, read


def _nibbles(q: np.ndarray) -> np.ndarray:
    """Signed INT4 codes [n, k] -> kt's stored INT4 codes: u = q + 8, element 2j in the low nibble of byte j."""
    u = (q.astype(np.int16) + 8).astype(np.uint8)
    return np.ascontiguousarray(u[:, 0::2] | (u[:, 1::2] << 4))
