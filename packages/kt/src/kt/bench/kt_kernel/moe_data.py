"""The data both sides of benchmarks/moe_layer.py read, and the float64 truth they are checked against.

Imported by moe_layer.py (kt's environment) and by kt_kernel_runner.py (the kt-kernel venv), so
it needs NumPy and torch only — never kt_core or kt_kernel. One data directory per shape:

    manifest.json                 shape, seed, what is in the directory
    {gate,up,down}.npy            bf16 weights as uint16 bits: gate/up [E, I, H], down [E, H, I]
    rawint4_{proj}_packed.npy     uint8 [E, N, K/2]: q + 8, low nibble = even k (the little-endian
                                  bytes of compressed-tensors' int32 [N, K/8] weight_packed)
    rawint4_{proj}_scale.npy      bf16 bits [E, N, K/32]
    fp8_{proj}.npy                E4M3 (fn) bytes [E, N, K]
    fp8_{proj}_scale_inv.npy      f32 [E, ceil(N/128), ceil(K/128)]
    mxfp4_{proj}_blocks.npy       uint8 [E, N, K/2]: E2M1 codes, low nibble = even k
    mxfp4_{proj}_scales.npy       uint8 E8M0 [E, N, K/32] (kt-kernel gets them as bf16, as its loader makes them)
    inputs_{T}.npz                hidden (bf16 bits [T, H]), ids (int64 [R, T, k]), weights (f32 [R, T, k])

Weights are written once and memory-mapped by everyone (copy-on-write), so the orchestrator, the
torch baseline and the kt-kernel subprocess share one page-cache copy and see identical bytes.
Formats follow docs/formats.md; kt-kernel 0.7.2 takes the same bytes (RAWINT4 as uint8, FP8 as
bytes + fp32 block scales).
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

FORMAT_VERSION = 1
RAWINT4_GROUP = 32
MXFP4_BLOCK = 32
NVFP4_BLOCK = 16
MXFP8_BLOCK = 32
CHECKPOINT_FORMATS = ("RAWINT4", "FP8", "MXFP4", "NVFP4", "MXFP8")   # read as stored; the rest are quantized at load
FP8_BLOCK = 128
FP8_MAX = 448.0
PROJS = ("gate", "up", "down")


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int

    def proj_shape(self, proj: str) -> tuple[int, int]:
        """(N, K) of one expert's matrix: rows are output channels, K the reduction dimension."""
        return (self.intermediate, self.hidden) if proj in ("gate", "up") else (self.hidden, self.intermediate)

    @property
    def weights_per_expert(self) -> int:
        return 3 * self.hidden * self.intermediate


# The benchmarks' two layers. This file also runs in kt-kernel's venv, where kt is not installed,
# so it cannot read kt.models' presets; test_bench.py checks these rows against them.
SHAPES = {
    "qwen3-30b-a3b": Shape("qwen3-30b-a3b", hidden=2048, intermediate=768, experts=128, top_k=8),
    "deepseek-v3-64e": Shape("deepseek-v3-64e", hidden=7168, intermediate=2048, experts=64, top_k=8),
}


def format_bytes_per_expert(shape: Shape, fmt: str) -> int:
    """Bytes one expert occupies in a format as stored (weights + scales), per docs/formats.md and
    kt-kernel 0.7.2's layouts. fmt: BF16, INT8 (per-row f32 scale), INT4 (group g f32 scales, g=0:
    per row as kt-kernel's AMXINT4), RAWINT4, FP8 — optionally 'INT4:g'."""
    total = 0
    for proj in PROJS:
        n, k = shape.proj_shape(proj)
        if fmt == "BF16":
            total += n * k * 2
        elif fmt == "INT8":
            total += n * k + n * 4
        elif fmt.startswith("INT4"):
            group = int(fmt.split(":")[1]) if ":" in fmt else 0
            total += n * k // 2 + n * (k // group if group else 1) * 4
        elif fmt == "RAWINT4":
            total += n * k // 2 + n * (k // RAWINT4_GROUP) * 2
        elif fmt == "FP8":
            total += n * k + math.ceil(n / FP8_BLOCK) * math.ceil(k / FP8_BLOCK) * 4
        elif fmt == "MXFP4":
            total += n * k // 2 + n * (k // MXFP4_BLOCK)
        elif fmt == "NVFP4":
            total += n * k // 2 + n * (k // NVFP4_BLOCK) + 4
        elif fmt == "MXFP8":
            total += n * k + n * (k // MXFP8_BLOCK)
        else:
            raise ValueError(f"unknown format {fmt!r}")
    return total


# -- bf16 bits <-> floats ------------------------------------------------------------------------

def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def as_bf16_tensor(bits: np.ndarray) -> torch.Tensor:
    """A torch bf16 view of uint16 bits (no copy)."""
    return torch.from_numpy(bits).view(torch.bfloat16)


# -- checkpoint packers (docs/formats.md) ---------------------------------------------------------

def pack_rawint4(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """compressed-tensors symmetric INT4, group 32 along K: (uint8 [N, K/2] bytes, bf16-bits [N, K/32]).
    Scale = max|w| / 7 rounded to bf16 first, so the stored codes are exact for the stored scale."""
    n, k = w.shape
    if k % RAWINT4_GROUP:
        raise ValueError(f"RAWINT4 needs K divisible by {RAWINT4_GROUP}, got K={k}")
    g = w.float().reshape(n, k // RAWINT4_GROUP, RAWINT4_GROUP)
    scale = (g.abs().amax(dim=2) / 7.0).to(torch.bfloat16)
    s = scale.float().unsqueeze(2)
    q = torch.where(s > 0, torch.round(g / torch.where(s > 0, s, 1.0)), 0.0).clamp_(-8, 7)
    u = (q.reshape(n, k // 2, 2) + 8).to(torch.uint8)
    packed = u[..., 0] | (u[..., 1] << 4)
    return packed.numpy(), scale.view(torch.uint16).numpy()


def unpack_rawint4(packed: np.ndarray, scale_bits: np.ndarray) -> np.ndarray:
    """float64 [N, K] dequantized weights: scale[n, k/32] * q."""
    p = np.asarray(packed)
    n = p.shape[0]
    q = np.empty((n, p.shape[1] * 2), dtype=np.float64)
    q[:, 0::2] = (p & 0x0F).astype(np.float64) - 8
    q[:, 1::2] = (p >> 4).astype(np.float64) - 8
    s = bf16_bits_to_f32(scale_bits).astype(np.float64)
    return q * np.repeat(s, RAWINT4_GROUP, axis=1)


def quantize_fp8_block(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek-style FP8: E4M3 (fn) bytes [N, K] and f32 weight_scale_inv [ceil(N/128), ceil(K/128)]
    with scale_inv = max|block| / 448, so w ~= e4m3 * scale_inv."""
    n, k = w.shape
    bn, bk = math.ceil(n / FP8_BLOCK), math.ceil(k / FP8_BLOCK)
    wf = torch.zeros(bn * FP8_BLOCK, bk * FP8_BLOCK)
    wf[:n, :k] = w.float()
    blocks = wf.reshape(bn, FP8_BLOCK, bk, FP8_BLOCK)
    scale_inv = blocks.abs().amax(dim=(1, 3)) / FP8_MAX
    safe = torch.where(scale_inv > 0, scale_inv, 1.0)
    codes = (blocks / safe[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    codes = codes.reshape(bn * FP8_BLOCK, bk * FP8_BLOCK)[:n, :k].contiguous()
    return codes.view(torch.uint8).numpy(), scale_inv.numpy().astype(np.float32)


def dequantize_fp8_block(codes: np.ndarray, scale_inv: np.ndarray) -> np.ndarray:
    c = torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn).to(torch.float64).numpy()
    n, k = c.shape
    s = np.repeat(np.repeat(np.asarray(scale_inv, dtype=np.float64), FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)
    return c * s[:n, :k]


def pack_mxfp4(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 as GPT-OSS stores it (docs/formats.md): (uint8 [N, K/2] E2M1 codes, uint8 E8M0 [N, K/32]).
    Made by kt-core's rule (kt_core.testing.quantize.quantize_mxfp4); only kt's side packs, so the
    import is here rather than at the top (the kt-kernel venv has no kt_core)."""
    from kt_core.testing.quantize import quantize_mxfp4

    return quantize_mxfp4(w.float().numpy())


def pack_nvfp4(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NVFP4 as ModelOpt stores it (docs/formats.md): (uint8 [N, K/2] E2M1 codes, E4M3 bytes [N, K/16],
    the f32 global scale as [1])."""
    from kt_core.testing.quantize import quantize_nvfp4

    blocks, scales, glob = quantize_nvfp4(w.float().numpy())
    return blocks, scales, glob.reshape(1)


def pack_mxfp8(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """MXFP8 as MiniMax-M3 stores it (docs/formats.md): (E4M3 bytes [N, K], uint8 E8M0 [N, K/32])."""
    from kt_core.testing.quantize import quantize_mxfp8

    return quantize_mxfp8(w.float().numpy())


E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def _e2m1(blocks: np.ndarray) -> np.ndarray:
    b = np.asarray(blocks)
    codes = np.empty((b.shape[0], b.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2], codes[:, 1::2] = b & 0x0F, b >> 4
    return E2M1_VALUES[codes]


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn).to(torch.float64).numpy()


def dequantize_nvfp4(blocks: np.ndarray, scales: np.ndarray, glob: np.ndarray) -> np.ndarray:
    """float64 [N, K]: e2m1(code) * e4m3(scale) * global."""
    s = decode_e4m3(scales) * float(np.asarray(glob, dtype=np.float64).reshape(()))
    return _e2m1(blocks) * np.repeat(s, NVFP4_BLOCK, axis=1)


def dequantize_mxfp8(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float64 [N, K]: e4m3(code) * 2^(e - 127)."""
    s = np.ldexp(1.0, np.asarray(scales, dtype=np.int64) - 127)
    return decode_e4m3(codes) * np.repeat(s, MXFP8_BLOCK, axis=1)


def nvfp4_as_bf16_scales(scales: np.ndarray, glob: np.ndarray) -> np.ndarray:
    """kt-kernel's NVFP4 loader folds e4m3(scale) * global into bf16 (its bits here), lossily."""
    folded = torch.from_numpy(decode_e4m3(scales).astype(np.float32) * np.float32(np.asarray(glob).reshape(())))
    return folded.to(torch.bfloat16).view(torch.uint16).numpy()


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float64 [N, K]: e2m1(code) * 2^(e - 127)."""
    return _e2m1(blocks) * np.repeat(np.ldexp(1.0, np.asarray(scales, dtype=np.int64) - 127), MXFP4_BLOCK, axis=1)


def e8m0_as_bf16_bits(scales: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> the bf16 bits of 2^(e - 127), as kt-kernel's MXFP4 loader converts them
    (e = 0, 2^-127, is the bf16 subnormal 0x0040)."""
    e = np.asarray(scales, dtype=np.uint16)
    return np.where(e == 0, np.uint16(0x0040), e << 7).astype(np.uint16)


# -- generation -----------------------------------------------------------------------------------

def _manifest(data: Path) -> dict:
    path = data / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _save_manifest(data: Path, manifest: dict) -> None:
    tmp = data / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(data / "manifest.json")


def _save(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, arr)
    tmp.replace(path)


def prepare(data: Path, shape: Shape, seed: int, formats: set[str], tokens: list[int], rounds: int,
            log=print) -> dict:
    """Create whatever of the shape's data is missing under `data` (re-using matching files) and
    return the manifest. formats: subset of CHECKPOINT_FORMATS (checkpoint formats to pack);
    rounds: routings per token count (warm-up + timed calls)."""
    data.mkdir(parents=True, exist_ok=True)
    manifest = _manifest(data)
    key = {"version": FORMAT_VERSION, "shape": asdict(shape), "seed": seed}
    if manifest.get("key") != key:
        for f in data.glob("*.np[yz]"):
            f.unlink()
        manifest = {"key": key, "formats": [], "inputs": {}}
    fresh_weights = not all((data / f"{p}.npy").is_file() for p in PROJS)
    E = shape.experts
    if fresh_weights:
        for f in data.glob("ref_*.npy"):
            f.unlink()
        log(f"  generating bf16 weights for {shape.name} ({E * shape.weights_per_expert * 2 / 2**30:.2f} GiB)")
        gen = torch.Generator().manual_seed(seed)
        for p in PROJS:
            n, k = shape.proj_shape(p)
            out = np.lib.format.open_memmap(data / f"{p}.tmp.npy", mode="w+", dtype=np.uint16, shape=(E, n, k))
            for e in range(E):  # one expert at a time: no full-size float32 temporary
                m = torch.empty((n, k), dtype=torch.bfloat16).normal_(0.0, 1.0 / math.sqrt(k), generator=gen)
                out[e] = m.view(torch.uint16).numpy()
            out.flush()
            del out
            (data / f"{p}.tmp.npy").replace(data / f"{p}.npy")
        manifest["formats"] = []
    bf16 = load_bf16(data)
    for fmt in sorted(formats - set(manifest["formats"])):
        log(f"  packing {fmt} checkpoint tensors for {shape.name}")
        for p in PROJS:
            n, k = shape.proj_shape(p)
            if fmt == "RAWINT4":
                names = (f"rawint4_{p}_packed", f"rawint4_{p}_scale")
                specs = ((np.uint8, (E, n, k // 2)), (np.uint16, (E, n, k // RAWINT4_GROUP)))
                packer = pack_rawint4
            elif fmt == "FP8":
                names = (f"fp8_{p}", f"fp8_{p}_scale_inv")
                specs = ((np.uint8, (E, n, k)),
                         (np.float32, (E, math.ceil(n / FP8_BLOCK), math.ceil(k / FP8_BLOCK))))
                packer = quantize_fp8_block
            elif fmt == "MXFP4":
                names = (f"mxfp4_{p}_blocks", f"mxfp4_{p}_scales")
                specs = ((np.uint8, (E, n, k // 2)), (np.uint8, (E, n, k // MXFP4_BLOCK)))
                packer = pack_mxfp4
            elif fmt == "NVFP4":
                names = (f"nvfp4_{p}_blocks", f"nvfp4_{p}_scales", f"nvfp4_{p}_global")
                specs = ((np.uint8, (E, n, k // 2)), (np.uint8, (E, n, k // NVFP4_BLOCK)), (np.float32, (E, 1)))
                packer = pack_nvfp4
            elif fmt == "MXFP8":
                names = (f"mxfp8_{p}", f"mxfp8_{p}_scales")
                specs = ((np.uint8, (E, n, k)), (np.uint8, (E, n, k // MXFP8_BLOCK)))
                packer = pack_mxfp8
            else:
                raise ValueError(f"no checkpoint packer for {fmt}")
            outs = [np.lib.format.open_memmap(data / f"{nm}.tmp.npy", mode="w+", dtype=dt, shape=sh)
                    for nm, (dt, sh) in zip(names, specs)]
            for e in range(E):
                for o, part in zip(outs, packer(as_bf16_tensor(np.ascontiguousarray(bf16[p][e])))):
                    o[e] = part
            for o, nm in zip(outs, names):
                o.flush()
                del o
                (data / f"{nm}.tmp.npy").replace(data / f"{nm}.npy")
        manifest["formats"] = sorted(set(manifest["formats"]) | {fmt})
        _save_manifest(data, manifest)
    for t in tokens:
        have = manifest["inputs"].get(str(t))
        if have and have >= rounds and (data / f"inputs_{t}.npz").is_file():
            continue
        rng = np.random.default_rng([seed, t])
        hidden = torch.from_numpy(rng.standard_normal((t, shape.hidden), dtype=np.float32)).to(torch.bfloat16)
        ids = np.empty((rounds, t, shape.top_k), dtype=np.int64)
        for r in range(rounds):  # top-k without replacement per token (a random permutation's prefix)
            ids[r] = np.argsort(rng.random((t, shape.experts)), axis=1)[:, :shape.top_k]
        logits = rng.standard_normal((rounds, t, shape.top_k)).astype(np.float32)
        w = np.exp(logits - logits.max(axis=2, keepdims=True))
        w = (w / w.sum(axis=2, keepdims=True)).astype(np.float32)
        tmp = data / f"inputs_{t}.tmp.npz"
        np.savez(tmp, hidden=hidden.view(torch.uint16).numpy(), ids=ids, weights=w)
        tmp.replace(data / f"inputs_{t}.npz")
        for f in data.glob(f"ref_*_{t}_*.npy"):
            f.unlink()
        manifest["inputs"][str(t)] = rounds
    _save_manifest(data, manifest)
    return manifest


# -- loading (both processes) ---------------------------------------------------------------------

def load_shape(data: Path) -> Shape:
    return Shape(**_manifest(data)["key"]["shape"])


def _map(path: Path) -> np.ndarray:
    # copy-on-write mapping: writable (torch.from_numpy wants that), shared with every reader
    return np.load(path, mmap_mode="c")


def load_bf16(data: Path) -> dict[str, np.ndarray]:
    return {p: _map(data / f"{p}.npy") for p in PROJS}


def load_rawint4(data: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    return ({p: _map(data / f"rawint4_{p}_packed.npy") for p in PROJS},
            {p: _map(data / f"rawint4_{p}_scale.npy") for p in PROJS})


def load_fp8(data: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    return ({p: _map(data / f"fp8_{p}.npy") for p in PROJS},
            {p: _map(data / f"fp8_{p}_scale_inv.npy") for p in PROJS})


def load_mxfp4(data: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    return ({p: _map(data / f"mxfp4_{p}_blocks.npy") for p in PROJS},
            {p: _map(data / f"mxfp4_{p}_scales.npy") for p in PROJS})


def load_nvfp4(data: Path) -> tuple[dict[str, np.ndarray], ...]:
    return tuple({p: _map(data / f"nvfp4_{p}_{part}.npy") for p in PROJS} for part in ("blocks", "scales", "global"))


def load_mxfp8(data: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    return ({p: _map(data / f"mxfp8_{p}.npy") for p in PROJS}, {p: _map(data / f"mxfp8_{p}_scales.npy") for p in PROJS})


def kt_load_args(data: Path, method: str):
    """(gate, up, down, scales, zeros) for kt_core.MoE.load in the method's source format: the
    bytes kt-kernel reads, as kt takes them."""
    if method == "RAWINT4":
        packed, scale = load_rawint4(data)
        # docs/formats.md: int32 [N, K/8] words; the little-endian bytes are kt-kernel's uint8 [N, K/2]
        w = [torch.from_numpy(packed[p].view(np.int32)) for p in PROJS]
        s = tuple(as_bf16_tensor(scale[p]) for p in PROJS)
        return (*w, s, None)
    if method == "FP8":
        codes, scale = load_fp8(data)
        w = [torch.from_numpy(codes[p]).view(torch.float8_e4m3fn) for p in PROJS]
        s = tuple(torch.from_numpy(scale[p]) for p in PROJS)
        return (*w, s, None)
    if method == "MXFP4":   # the E8M0 bytes as GPT-OSS stores them (kt takes them as they are)
        blocks, scales = load_mxfp4(data)
        return (*(blocks[p] for p in PROJS), tuple(scales[p] for p in PROJS), None)
    if method == "NVFP4":   # ModelOpt's bytes; the global scale goes in as zeros ([E, 1, 1] per matrix)
        blocks, scales, glob = load_nvfp4(data)
        return (*(blocks[p] for p in PROJS), tuple(scales[p] for p in PROJS),
                tuple(np.ascontiguousarray(glob[p]).reshape(-1, 1, 1) for p in PROJS))
    if method == "MXFP8":
        codes, scales = load_mxfp8(data)
        return (*(torch.from_numpy(codes[p]).view(torch.float8_e4m3fn) for p in PROJS), tuple(scales[p] for p in PROJS),
                None)
    bf16 = load_bf16(data)
    return (*(as_bf16_tensor(bf16[p]) for p in PROJS), None, None)


def load_inputs(data: Path, tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hidden bf16 bits [T, H], ids int64 [R, T, k], weights f32 [R, T, k])."""
    with np.load(data / f"inputs_{tokens}.npz") as z:
        return z["hidden"], z["ids"], z["weights"]


# -- the float64 truth ----------------------------------------------------------------------------

def reference_weights(data: Path, fmt: str):
    """A function expert -> (gate, up, down) float64 matrices: the weights the format *means*.
    BF16/INT8/INT4 are quantized online from the bf16 weights, so their truth is the bf16 weights
    (INT8/INT4 errors then include the format's own rounding); RAWINT4/FP8 are checkpoint formats,
    so their truth is the checkpoint dequantized."""
    if fmt == "RAWINT4":
        packed, scale = load_rawint4(data)
        return lambda e: tuple(unpack_rawint4(packed[p][e], scale[p][e]) for p in PROJS)
    if fmt == "FP8":
        codes, scale = load_fp8(data)
        return lambda e: tuple(dequantize_fp8_block(codes[p][e], scale[p][e]) for p in PROJS)
    if fmt == "MXFP4":
        blocks, scales = load_mxfp4(data)
        return lambda e: tuple(dequantize_mxfp4(blocks[p][e], scales[p][e]) for p in PROJS)
    if fmt == "NVFP4":
        blocks, scales, glob = load_nvfp4(data)
        return lambda e: tuple(dequantize_nvfp4(blocks[p][e], scales[p][e], glob[p][e]) for p in PROJS)
    if fmt == "MXFP8":
        codes, scales = load_mxfp8(data)
        return lambda e: tuple(dequantize_mxfp8(codes[p][e], scales[p][e]) for p in PROJS)
    w = load_bf16(data)
    return lambda e: tuple(bf16_bits_to_f32(w[p][e]).astype(np.float64) for p in PROJS)


def moe_reference(hidden_bits: np.ndarray, ids: np.ndarray, weights: np.ndarray, expert_weights) -> np.ndarray:
    """out[t] = sum_j weights[t, j] * down_e(SiLU(gate_e x_t) * up_e x_t), float64, grouped by expert."""
    x = bf16_bits_to_f32(hidden_bits).astype(np.float64)
    out = np.zeros_like(x)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)
        g, u, d = expert_weights(int(e))
        xe = x[rows]
        a = xe @ g.T
        h = a / (1.0 + np.exp(-a)) * (xe @ u.T)
        np.add.at(out, rows, (h @ d.T) * weights[rows, slots, None].astype(np.float64))
    return out


def truth_format(fmt: str) -> str:
    """Which weights a method's output is checked against (see reference_weights)."""
    return fmt if fmt in CHECKPOINT_FORMATS else "BF16"


def reference_output(data: Path, fmt: str, tokens: int, check_tokens: int) -> np.ndarray:
    """float64 output of the first min(check_tokens, tokens) rows for routing round 0 — the call
    every side checks — cached in the data directory so each (weights, tokens) is computed once."""
    c = min(check_tokens, tokens)
    path = data / f"ref_{truth_format(fmt)}_{tokens}_{c}.npy"
    if path.is_file():
        return np.load(path)
    hidden, ids, weights = load_inputs(data, tokens)
    ref = moe_reference(hidden[:c], ids[0][:c], weights[0][:c], reference_weights(data, truth_format(fmt)))
    _save(path, ref)
    return ref


def relative_error(actual, expected) -> float:
    """max |actual - expected| / RMS(expected) — the measure kt's tests use."""
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    rms = float(np.sqrt(np.mean(b**2))) or 1.0
    return float(np.max(np.abs(a - b))) / rms


# -- timing ---------------------------------------------------------------------------------------

def summarize(times_s: list[float]) -> dict:
    """Median and spread ((max - min) / median) of per-call seconds, in ms."""
    ms = [t * 1e3 for t in times_s]
    med = statistics.median(ms)
    return {"median_ms": med, "min_ms": min(ms), "max_ms": max(ms), "spread": (max(ms) - min(ms)) / med if med else 0.0,
            "calls": len(ms)}


def run_protocol(call, ids: np.ndarray, bytes_per_expert: int, warmup: int, repeats: int, budget_s: float,
                 after_first=None) -> dict:
    """The timing protocol every side follows, so their numbers compare. call(r) runs one forward
    with routing round r and returns its seconds. Rounds 0..warmup-1 are untimed warm-up (after_first()
    runs right after round 0, whose output is the one checked); then up to `repeats` timed calls,
    fewer when the first call says they would not fit in budget_s (at least 1), each with its own
    routing round. GB/s per call = distinct experts of that call x bytes_per_expert / seconds."""
    first = call(0)
    if after_first is not None:
        after_first()
    for r in range(1, warmup):
        call(r)
    n = repeats if first <= 0 else max(1, min(repeats, int(budget_s / first)))
    n = min(n, ids.shape[0] - warmup)
    if n < 1:
        raise ValueError(f"{ids.shape[0]} routing rounds cannot serve {warmup} warm-up calls and a timed one")
    times = [call(warmup + i) for i in range(n)]
    distinct = [len(np.unique(ids[warmup + i])) for i in range(n)]
    gbps = [d * bytes_per_expert / t / 1e9 for d, t in zip(distinct, times)]
    return {**summarize(times), "gbps_median": float(np.median(gbps)), "distinct_experts_mean": float(np.mean(distinct)),
            "bytes_per_expert": bytes_per_expert}


class ForeignLoad:
    """CPU time other processes used during a block, as a fraction of all CPUs: on a shared machine
    this says which rows were measured while someone else was busy (their timings are suspect)."""

    def __enter__(self):
        self.start = (time.monotonic(), self._busy_s(), self._own_s())
        return self

    def __exit__(self, *exc):
        wall, busy, own = (b - a for a, b in zip(self.start, (time.monotonic(), self._busy_s(), self._own_s())))
        self.fraction = max(0.0, busy - own) / (wall * (os.cpu_count() or 1)) if wall > 0 else 0.0
        return False

    @staticmethod
    def _busy_s() -> float:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait

    @staticmethod
    def _own_s() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def wait_quiet(max_wait_s: float, threshold: float = 0.15, window_s: float = 0.5) -> float:
    """Wait (up to max_wait_s) until other processes use less than `threshold` of the CPUs over a
    short window; returns the last share seen."""
    deadline = time.monotonic() + max_wait_s
    while True:
        with ForeignLoad() as load:
            time.sleep(window_s)
        if load.fraction < threshold or time.monotonic() >= deadline:
            return load.fraction
