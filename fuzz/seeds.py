"""Seed corpora of every fuzz target: small valid inputs that reach deep into each reader.

    python fuzz/seeds.py OUT      # writes OUT/<target>/<seed> for every target

The tests build the same seeds (tests/test_fuzz_regressions.py) and run each target's check()
on them, so a seed that stops being accepted, or a reader change that makes a seed crash,
fails CI before any fuzzing happens. Seeds are kept tiny (a few KiB): libFuzzer mutates
small inputs far faster, and caps new inputs near the largest seed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

FUZZ_DIR = Path(__file__).resolve().parent
if str(FUZZ_DIR) not in sys.path:
    sys.path.insert(0, str(FUZZ_DIR))

from _harness import pack_files  # noqa: E402
from fuzz_checkpoint import FILES as CHECKPOINT_FILES  # noqa: E402
from fuzz_converted import FILES as CONVERTED_FILES  # noqa: E402

TARGETS = ("gguf", "checkpoint", "converted", "plugin")

# Geometry of every seed model: the smallest that still has two experts and blocks of 32.
H, I, E, TOP_K = 32, 32, 2, 1


def gguf_seeds(tmp: Path) -> dict[str, bytes]:
    from kt.testing.gguf_files import write_moe_gguf

    seeds = {}
    for name, kw in {"fused-q8": dict(types=("Q8_0", "Q8_0", "Q8_0")),
                     "fused-mixed": dict(types=("Q4_0", "Q4_0", "Q8_0"), layers=2),
                     "per-expert": dict(types=("Q4_0", "Q4_0", "Q4_0"), per_expert=True),
                     "mixtral": dict(types=("Q8_0", "Q8_0", "Q8_0"), arch="llama")}.items():
        path = tmp / f"{name}.gguf"
        write_moe_gguf(path, hidden=H, intermediate=I, experts=E, top_k=TOP_K, **kw)
        seeds[name] = path.read_bytes()
    return seeds




def checkpoint_seeds(tmp: Path) -> dict[str, bytes]:
    from kt.testing.checkpoints import write_checkpoint

    seeds = {}
    for name, model_type, quant in (("deepseek-bf16", "deepseek_v3", None), ("qwen3-fp8", "qwen3_moe", "fp8"),
                                    ("kimi-rawint4", "kimi_k2", "rawint4"), ("gpt-oss-fused", "gpt_oss", None),
                                    ("qwen3vl-fused", "qwen3_vl_moe", None)):
        folder = tmp / name
        write_checkpoint(folder, model_type, hidden=H, intermediate=I, experts=E, top_k=TOP_K, layers=2,
                         dense_prefix=1, quant=quant, keep_truth=False)
        seeds[name] = pack_files(CHECKPOINT_FILES, {p.name: p.read_bytes() for p in sorted(folder.iterdir())})
    # save_pretrained's single-file layout: no index.
    folder = tmp / "mixtral-single"
    write_checkpoint(folder, "mixtral", hidden=H, intermediate=I, experts=E, top_k=TOP_K, layers=1, dense_prefix=0,
                     shards=1, keep_truth=False)
    (folder / "model.safetensors.index.json").unlink()
    (folder / "model-00001-of-00001.safetensors").rename(folder / "model.safetensors")
    seeds["mixtral-single"] = pack_files(CHECKPOINT_FILES, {p.name: p.read_bytes() for p in sorted(folder.iterdir())})
    return seeds


def converted_seeds(tmp: Path) -> dict[str, bytes]:
    from kt.testing.checkpoints import write_checkpoint
    from kt.weights import add_packed, convert

    src = tmp / "src"
    write_checkpoint(src, "deepseek_v3", hidden=H, intermediate=I, experts=E, top_k=TOP_K, layers=3, dense_prefix=1,
                     keep_truth=False)
    seeds = {}
    for name, kw in (("int8", dict(method="INT8")), ("int4-g32", dict(method="INT4", group_size=32)),
                     ("int4-g32-zp", dict(method="INT4", group_size=32, zero_point=True)),
                     ("int8-packed", dict(method="INT8")), ("int4-g32-zp-packed", dict(method="INT4", group_size=32,
                                                                                         zero_point=True))):
        out = convert(src, tmp / name, **kw)
        if name.endswith("packed"):
            add_packed(out, backend="reference")      # the layouts fuzz_converted's layers read
        manifest = json.loads((out / "kt-manifest.json").read_text())
        manifest["source"]["path"] = "/nonexistent/kt-fuzz-source"   # no source check against this machine
        files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
        files["kt-manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
        seeds[name] = pack_files(CONVERTED_FILES, files)
    return seeds


def plugin_seeds(tmp: Path) -> dict[str, bytes]:
    from fuzz_plugin import encode_seed

    return encode_seed()


BUILDERS = {"gguf": gguf_seeds, "checkpoint": checkpoint_seeds, "converted": converted_seeds, "plugin": plugin_seeds}


def build(target: str) -> dict[str, bytes]:
    """{seed name: bytes} of one target."""
    with tempfile.TemporaryDirectory(prefix="kt-seeds-") as tmp:
        return BUILDERS[target](Path(tmp))


def write(out: Path, targets=TARGETS) -> dict[str, Path]:
    """Write every target's seeds under out/<target>/; returns {target: folder}."""
    folders = {}
    for target in targets:
        folder = Path(out) / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in build(target).items():
            (folder / f"seed-{name}").write_bytes(data)
        folders[target] = folder
    return folders


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python fuzz/seeds.py OUT [TARGET ...]")
    for target, folder in write(Path(sys.argv[1]), tuple(sys.argv[2:]) or TARGETS).items():
        print(f"{target}: {len(list(folder.iterdir()))} seeds in {folder}")
