"""Loading a model folder for kt: the whole model then patch_model, against load_model (everything
but the routed experts) then patch_model(weight_path=the folder), measured in one run.

    python benchmarks/load_model.py [--layers 8 --hidden 1024 --intermediate 512 --experts 64]
        [--method BF16] [--passes 2] [--folder DIR]

A Qwen3-MoE of that shape, bf16, is written by transformers' save_pretrained (once, into --folder
or a temporary one); each side then runs in a fresh process, alternating, `passes` times: wall time
to a patched model, the peak of the process's anonymous memory over its start (sampled every 2 ms:
torch's and kt's allocations), its peak resident set (VmHWM: the checkpoint's mapped pages
included, which the kernel can drop) and the anonymous memory that stays. Medians are printed,
with the checkpoint's bytes, for docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SIDE = """
import json, threading, time, torch, transformers
from kt.integrations.transformers import load_model, patch_model
def kib(key): return int(open('/proc/self/status').read().split(key + ':')[1].split()[0])
folder, method, side = {folder!r}, {method!r}, {side!r}
transformers.AutoConfig.from_pretrained(folder)   # imports done before the clock starts
before, anon_before, peak_anon, done = kib('VmRSS'), kib('RssAnon'), [0], threading.Event()
def sample():   # the kernel keeps no peak of anonymous memory alone: sampled every 2 ms
    while not done.is_set():
        peak_anon[0] = max(peak_anon[0], kib('RssAnon'))
        time.sleep(0.002)
sampler = threading.Thread(target=sample)
sampler.start()
t = time.perf_counter()
if side == "whole":
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
    patch_model(model, method=method)
else:
    model = load_model(folder, dtype="auto")
    patch_model(model, method=method, weight_path=folder)
seconds = time.perf_counter() - t
done.set()
sampler.join()
print(json.dumps({{"seconds": seconds, "peak_anon_mib": (peak_anon[0] - anon_before) / 1024,
                  "peak_mib": (kib('VmHWM') - before) / 1024, "after_mib": (kib('RssAnon') - anon_before) / 1024}}))
"""


def write_model(folder: Path, args) -> None:
    import torch
    import transformers

    config = transformers.Qwen3MoeConfig(hidden_size=args.hidden, moe_intermediate_size=args.intermediate,
                                         num_experts=args.experts, num_experts_per_tok=8, num_hidden_layers=args.layers,
                                         num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                                         intermediate_size=4 * args.hidden, vocab_size=4096)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder, max_shard_size="1GB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--method", default="BF16")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--folder", help="write the model here (kept) instead of a temporary folder")
    args = ap.parse_args()
    tmp = None if args.folder else tempfile.TemporaryDirectory()
    folder = Path(args.folder or tmp.name)
    if not (folder / "config.json").is_file():
        print(f"writing the model into {folder} ...", file=sys.stderr)
        write_model(folder, args)
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    experts = args.layers * args.experts * 3 * args.hidden * args.intermediate * 2
    runs: dict[str, list[dict]] = {"whole": [], "load_model": []}
    for _ in range(args.passes):
        for side in runs:
            code = SIDE.format(folder=str(folder), method=args.method, side=side)
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"checkpoint {size / 2**20:.0f} MiB (experts {experts / 2**20:.0f} MiB), method {args.method}, "
          f"{args.passes} passes, medians")
    print("| load | seconds | peak anonymous memory (MiB) | peak resident, mapped files included (MiB) | "
          "anonymous after (MiB) |")
    print("|---|---|---|---|---|")
    for side, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"| {side} | {med['seconds']:.2f} | {med['peak_anon_mib']:.0f} | {med['peak_mib']:.0f} | "
              f"{med['after_mib']:.0f} |")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
