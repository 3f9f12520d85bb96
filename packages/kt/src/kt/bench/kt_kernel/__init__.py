"""Driving kt-kernel 0.7.2 as the comparison baseline, from its own virtual environment.

`kt_kernel_runner.py` runs under that venv's Python (it never imports kt_core); `moe_data.py` is
imported by both sides, so kt and kt-kernel read the same memory-mapped weights and inputs.
Both need torch and numpy. `benchmarks/setup_kt_kernel.sh` creates the venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "kt_kernel_runner.py"
# kt-kernel's names for kt's methods.
KT_KERNEL_METHOD = {"BF16": "BF16", "INT8": "AMXINT8", "INT4": "AMXINT4", "RAWINT4": "RAWINT4", "FP8": "FP8",
                    "MXFP4": "MXFP4", "NVFP4": "NVFP4", "MXFP8": "MXFP8"}

from . import moe_data  # noqa: E402  (the runner, a script, imports it by path)


def prepare_shared(data: Path, shape, methods: list[str], tokens: list[int], rounds: int, seed: int = 0) -> None:
    """The weights and routings kt and kt-kernel both read (moe_data's format) under `data`."""
    mshape = moe_data.Shape(shape.name, shape.hidden, shape.intermediate, shape.experts, shape.top_k)
    moe_data.prepare(data, mshape, seed, {m for m in methods if m in moe_data.CHECKPOINT_FORMATS}, tokens, rounds,
                     log=lambda *_: None)


def compare(venv: str, shape, methods: list[str], tokens: list[int], threads: list[int], warmup: int, repeats: int,
            progress=lambda _msg: None, data: Path | None = None) -> dict:
    """kt-kernel's median latency per (method, threads, tokens) for this shape: {key: ms}; methods
    kt-kernel lacks or runs that fail are reported under "skipped". `data`: a moe_data directory
    already prepared for these methods and token counts (the bytes kt ran on); else one is
    written for the call."""
    py = Path(venv) / "bin" / "python"
    if not py.is_file():
        raise FileNotFoundError(f"--compare-kt-kernel {venv}: no {py}; create it with benchmarks/setup_kt_kernel.sh")
    wanted = [m for m in methods if m in KT_KERNEL_METHOD]
    out = {"rows": {}, "skipped": [m for m in methods if m not in KT_KERNEL_METHOD]}
    with tempfile.TemporaryDirectory(prefix="kt-bench-kk-") as tmp:
        if data is None:
            data = Path(tmp) / "data"
            progress("kt-kernel: writing the shared weights")
            prepare_shared(data, shape, wanted, tokens, warmup + repeats)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["OMP_NUM_THREADS"] = "1"
        for n in threads:
            for method in wanted:
                progress(f"kt-kernel {method}, {n} thread(s)")
                result = Path(tmp) / f"{method}-{n}.json"
                cmd = [str(py), str(RUNNER), "--data", str(data), "--method", KT_KERNEL_METHOD[method], "--threads", str(n),
                       "--tokens", *map(str, tokens), "--warmup", str(warmup), "--repeats", str(repeats),
                       "--check-tokens", "0", "--json", str(result)]
                r = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if r.returncode != 0 or not result.is_file():
                    last = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
                    out["skipped"].append(f"{method} N={n}: runner exit {r.returncode}: {last[0]}")
                    continue
                for row in json.loads(result.read_text())["rows"]:
                    if "median_ms" in row:
                        out["rows"][f"{method} N={n} T={row['tokens']}"] = row["median_ms"]
    return out
