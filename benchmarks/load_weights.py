"""Loading speed: GB/s of expert weights made ready (packed in NUMA-placed memory) from a
model folder or a kt converted folder, against this machine's disk read and memory-copy
rates measured in the same run.

    python benchmarks/load_weights.py [--layers 4] [--experts 128] [--json results/load.json]

Builds a synthetic Qwen3-30B-A3B-shaped model (hidden 2048, intermediate 768; `--experts`
routed experts per layer, `--layers` MoE layers, bf16) under --workdir, converts it to INT8
and INT4 (g128), adds packed copies in this host's kernel layout to a second folder of each
(`kt convert --packed`; loaded mapped and copied, weights/packed.py) and packs the bf16 experts
as stored (`kt convert --method BF16 --packed`), then for each source times:
  - one layer, and the whole model (every layer into its own kt_core.MoE);
  - warm: files in the page cache; cold: each file evicted first (posix_fadvise DONTNEED,
    which needs no root; the disk is then really read).
Reference rates, same run, with the pool's thread count (torch's copy_): `copy` = a warm
memory-to-memory copy into memory written before (the machine's best case), `fresh copy` =
the same copy into newly allocated memory (what any loader must do: the kernel zeroes each
new page first); `disk` = reading the files cold into a buffer. "ready GB/s" counts the bytes
the weights take in the files (what must be read); the ratios divide it by those rates. A
mapped layer allocates and copies nothing, which is how it can pass `copy`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import time
from pathlib import Path

import torch

import kt_core
from kt.testing.checkpoints import write_checkpoint
from kt.weights import Checkpoint, ConvertedFolder, add_packed, convert, load_layer


def weight_files(folder: Path) -> list[Path]:
    """The files loading reads: a converted folder's packed copies when it has them."""
    return sorted(folder.glob("*.packed")) or sorted(folder.glob("*.safetensors"))


def evict(folder: Path) -> None:
    for f in weight_files(folder):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def file_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in weight_files(folder))


def disk_read_rate(folder: Path) -> float:
    """GB/s reading every weight file of folder cold."""
    evict(folder)
    buf = bytearray(64 << 20)
    total, t0 = 0, time.perf_counter()
    for f in weight_files(folder):
        with open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                total += n
    return total / (time.perf_counter() - t0) / 1e9


def copy_rate(nbytes: int, fresh: bool, repeats: int = 5) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        if fresh:
            del dst
            dst = torch.empty_like(src)
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def moe_for(source, method: str, spec) -> kt_core.MoE:
    extra = {}
    if isinstance(source, ConvertedFolder):
        extra = {"group_size": source.group_size, "zero_point": source.zero_point}
    return kt_core.MoE(num_experts=spec["experts"], top_k=8, hidden_size=spec["hidden"],
                       intermediate_size=spec["intermediate"], method=method, max_tokens=spec.get("max_tokens", 16),
                       **extra)


def warm(folder: Path) -> None:
    """Read every file once so the page cache holds it."""
    buf = bytearray(64 << 20)
    for f in weight_files(folder):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def time_load(path: Path, method: str, layers: list[int], spec: dict, cold: bool) -> tuple[float, int]:
    """(seconds, packed bytes) to load `layers` from path into fresh layers."""
    if cold:
        evict(path)
    else:
        warm(path)
    t0 = time.perf_counter()
    source = ConvertedFolder.open(path) if (path / "kt-manifest.json").is_file() else Checkpoint(path)
    moes, routes = [], set()
    for layer in layers:
        moe = moe_for(source, method, spec)
        routes.add(load_layer(moe, source, layer))
        moes.append(moe)
    seconds = time.perf_counter() - t0
    return seconds, sum(m.packed_bytes for m in moes), ", ".join(sorted(routes))


def mapped_forward_ratio(path: Path, method: str, spec: dict, tokens: int, repeats: int = 150) -> float:
    """Median forward time of a mapped packed layer over the same layer copied, interleaved:
    mapping must not make the kernels slower (page-cache pages, TLB reach)."""
    source = ConvertedFolder.open(path)
    evict(path)    # the mapped layer reads its files cold, into 2 MiB folios (see MoeLayer::map_packed)
    layers = {}
    for route, setting in (("mapped", "1"), ("copied", "0")):
        os.environ["KT_MAP_WEIGHTS"] = setting
        layers[route] = moe_for(source, method, spec | {"max_tokens": tokens})
        assert load_layer(layers[route], source, source.geometry["moe_layers"][0]) == route
    gen = torch.Generator().manual_seed(0)
    times = {route: [] for route in layers}
    for _ in range(repeats):
        x = torch.randn(tokens, spec["hidden"], dtype=torch.bfloat16, generator=gen)
        ids = torch.stack([torch.randperm(spec["experts"], generator=gen)[:8] for _ in range(tokens)])
        w = torch.rand(tokens, 8, generator=gen)
        for route, moe in layers.items():
            t0 = time.perf_counter()
            moe.forward(x, ids, w)
            times[route].append(time.perf_counter() - t0)
    return statistics.median(times["mapped"]) / statistics.median(times["copied"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--workdir", default=".bench/load_weights")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    work = Path(args.workdir)
    spec = {"hidden": 2048, "intermediate": 768, "experts": args.experts}
    model = work / f"model-{args.layers}x{args.experts}"
    if not (model / "config.json").is_file():
        shutil.rmtree(model, ignore_errors=True)
        print(f"writing a synthetic {args.layers}-layer model to {model} ...", flush=True)
        write_checkpoint(model, "qwen3_moe", hidden=spec["hidden"], intermediate=spec["intermediate"],
                         experts=args.experts, layers=args.layers, dense_prefix=0, shards=args.layers, keep_truth=False)
    sources = {"BF16": model}
    # The checkpoint's own bf16 experts, packed for this host (`kt convert --method BF16 --packed`).
    bf16_packed = work / f"{model.name}-bf16-packed"
    if not (bf16_packed / "kt-manifest.json").is_file():
        shutil.rmtree(bf16_packed, ignore_errors=True)
        convert(model, bf16_packed, method="BF16", packed=True)
    sources["BF16 packed, mapped"] = sources["BF16 packed, copied"] = bf16_packed
    for method in ("INT8", "INT4"):
        out = work / f"{model.name}-{method.lower()}"
        if not (out / "kt-manifest.json").is_file():
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            convert(model, out, method=method, group_size=128)
            print(f"converted to {method} in {time.perf_counter() - t0:.1f} s", flush=True)
        sources[method] = out
        # The same codes plus packed copies in this host's kernel layout (`kt convert --packed`):
        # the codes are hard links, the packed files are made once.
        packed = work / f"{out.name}-packed"
        if not (packed / "kt-manifest.json").is_file() or "packed" not in json.loads((packed / "kt-manifest.json").read_text()):
            shutil.rmtree(packed, ignore_errors=True)
            packed.mkdir(parents=True)
            for f in out.iterdir():
                if f.suffix == ".json":
                    shutil.copy(f, packed / f.name)
                else:
                    os.link(f, packed / f.name)
            add_packed(packed)
        sources[f"{method} packed, mapped"] = packed
        sources[f"{method} packed, copied"] = packed
    layers = list(Checkpoint(model).spec.moe_layers)
    kt_core.pool.ensure()
    threads = kt_core.pool.info().num_threads
    torch.set_num_threads(threads)

    rows = []
    for name, path in sources.items():
        method = name.split()[0]
        # Packed copies are mapped or copied (weights/packed.py): each is measured on its own.
        os.environ["KT_MAP_WEIGHTS"] = "0" if name.endswith("copied") else "1" if name.endswith("mapped") else "auto"
        size = file_bytes(path)
        disk = disk_read_rate(path)
        copy, fresh = copy_rate(min(size, 1 << 30), False), copy_rate(min(size, 1 << 30), True)
        for scope, which in (("one layer", layers[:1]), ("whole model", layers)):
            for cold in (False, True):
                runs = [time_load(path, method, which, spec, cold) for _ in range(args.repeats)]
                seconds = statistics.median(r[0] for r in runs)
                read = size * len(which) / len(layers)
                rows.append({"source": name, "route": runs[0][2], "scope": scope, "cache": "cold" if cold else "warm",
                             "seconds": seconds, "file_gb": read / 1e9, "packed_gb": runs[0][1] / 1e9,
                             "ready_gbps": read / seconds / 1e9, "copy_gbps": copy, "fresh_copy_gbps": fresh,
                             "disk_gbps": disk, "vs_copy": read / seconds / 1e9 / copy,
                             "vs_fresh_copy": read / seconds / 1e9 / fresh, "vs_disk": read / seconds / 1e9 / disk})
                r = rows[-1]
                print(f"{name:20} {scope:11} {r['cache']}: {seconds:6.3f} s  {r['ready_gbps']:5.2f} GB/s ready  "
                      f"(copy {copy:5.2f}, fresh copy {fresh:5.2f}, disk {disk:5.2f}; {r['vs_copy']:.2f}x copy, "
                      f"{r['vs_fresh_copy']:.2f}x fresh copy, {r['vs_disk']:.2f}x disk)", flush=True)
    forward_ratios = {}
    for name, path in sources.items():
        if name.endswith("mapped"):
            for tokens in (1, 32):
                ratio = mapped_forward_ratio(path, name.split()[0], spec, tokens)
                forward_ratios[f"{name.split()[0]} {tokens} tokens"] = ratio
                print(f"{name.split()[0]} forward, {tokens} tokens: mapped / copied time {ratio:.3f}", flush=True)
    result = {"command": "python benchmarks/load_weights.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v),
              "machine": {"cpu": platform.processor() or platform.machine(), "threads": threads},
              "shape": spec | {"layers": args.layers}, "rows": rows,
              "mapped_over_copied_forward_time": forward_ratios}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
