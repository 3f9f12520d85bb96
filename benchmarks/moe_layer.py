"""One MoE layer's routed experts: kt vs kt-kernel 0.7.2 vs plain torch, measured in the same run.

    python benchmarks/moe_layer.py [--shapes qwen3-30b-a3b] [--tokens 1 32] [--methods BF16 INT8]
        [--threads 1 2] [--repeats 10] [--kt-kernel-venv .bench/kt-kernel-venv] [--json OUT]

Measured in one run, so the ratios hold on a noisy machine:
  - read bandwidth with N threads, at the start and at the end of the run (the median is used):
    benchmarks/stream_read.c, compiled here with gcc -fopenmp, each thread summing its slice of a
    1 GiB buffer (>> L3) on huge pages, as kt's allocator places the expert weights (also reported:
    the same on 4 KiB pages, and torch.sum; torch.sum is the fallback without a compiler);
  - and right before and right after each of kt's memory-bound rows (<= 32 tokens) the same probe
    with the row's thread count on 256 MiB (three passes): the bandwidth drifts by half within
    minutes here, so the row's share of these adjacent probes is the figure to read for decode;
then per shape (weights written once to a data directory and memory-mapped by every side, so all
see the same bytes; see moe_data.py) and per thread count N, one side at a time:
  - plain torch, bf16: per routed expert F.silu(x @ gate.T) * (x @ up.T) @ down.T, weighted and
    summed, torch.set_num_threads(N) — the natural implementation, as Hugging Face's MoE blocks do it;
  - kt: kt_core.MoE per method on whatever backend kt selects (recorded: backend, kernel id);
    kt_core.pool.configure(num_threads=N); methods kt cannot run are skipped with kt's reason;
  - kt-kernel: kt_core/bench/kt_kernel/kt_kernel_runner.py in the kt-kernel venv, one process per method
    (its CPUInfer with cpuinfer_threads=N — plus kt-kernel's own busy-polling dispatcher thread).
Every side: the same hidden states, routings (top-k without replacement, softmax weights, fixed
seed; a fresh routing for every call, also for decode, so repeated calls do not find the same
experts in cache), warm-up calls first, then timed calls; median and spread ((max-min)/median).
Rows also give GB/s of expert weight bytes touched (distinct experts of the call x bytes per expert:
kt's real packed size, layer.packed_bytes / experts; the format's stored size for kt-kernel and
torch), its share of the measured bandwidth, speedups, the relative error of each side's output
(first rows of the first call) against a float64 reference, and how much CPU other processes took
meanwhile. A shape whose estimated memory need does not fit is refused with a message.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kt.bench.kt_kernel import KT_KERNEL_METHOD, RUNNER, moe_data  # noqa: E402  (shared with `kt bench --compare-kt-kernel`)

ROOT = Path(__file__).resolve().parent.parent
METHODS = tuple(KT_KERNEL_METHOD)
SIDES = ("torch", "kt", "kt-kernel")
GIB = 2**30
# Rows up to this many tokens stream the weights (the "% of bandwidth" rows; report.py shows those).
MEMORY_BOUND_TOKENS = 32


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


QUIET_WAIT_S = 0.0


def settle() -> None:
    """Let the previous side's spinning workers (OpenMP, kt's pool) go to sleep before timing, and
    with --quiet-wait, wait for other processes on a shared machine to quiet down."""
    time.sleep(0.3)
    if QUIET_WAIT_S > 0:
        moe_data.wait_quiet(QUIET_WAIT_S)


# -- memory ---------------------------------------------------------------------------------------

def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def shape_memory_need(shape: moe_data.Shape, tokens: list[int]) -> dict:
    """Resident bytes a shape needs at its peak: the bf16 weights (memory-mapped; torch computes
    from them and every side loads from them), the packed copy of one method — the sides run one at
    a time and load one method at a time; the largest is bf16, and kt-kernel's BF16 load briefly
    holds two copies (measured: 2.4 GB anonymous for the 1.1 GiB Qwen3 layer) — and forward scratch.
    Each kt layer's exact packed size is checked again before its weights are loaded. Checkpoint
    files (RAWINT4, FP8) are only read while loading, so page cache may drop them."""
    bf16 = shape.experts * moe_data.format_bytes_per_expert(shape, "BF16")
    t = max(tokens)
    scratch = 4 * t * shape.top_k * (shape.hidden + 2 * shape.intermediate) * 4 + 64 * 2**20
    return {"source": bf16, "packed": 2 * bf16, "scratch": scratch, "total": 3 * bf16 + scratch}


def fits(packed_bytes: int, resident_bytes: int) -> str | None:
    """None when a packed copy fits next to what must stay resident, else the refusal message.
    (MemAvailable counts our own mapped weights as reclaimable, so they are subtracted.)"""
    avail = mem_available()
    if packed_bytes <= avail - resident_bytes:
        return None
    return (f"refused: a packed copy of {packed_bytes / GIB:.1f} GiB next to {resident_bytes / GIB:.1f} GiB of mapped "
            f"weights does not fit in the {avail / GIB:.1f} GiB available (--force to try anyway)")


# -- bandwidth ------------------------------------------------------------------------------------

def build_stream_read(workdir: Path) -> Path | None:
    src = Path(__file__).resolve().parent / "stream_read.c"
    exe = workdir / "stream_read"
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        return None
    for flags in (["-mprefer-vector-width=512", "-funroll-loops"], []):
        r = subprocess.run([cc, "-O3", "-march=native", "-fopenmp", *flags, str(src), "-o", str(exe)],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return exe
    log(f"  (could not compile stream_read.c: {r.stderr.strip()[:300]}; using torch.sum)")
    return None


def bandwidth_c(exe: Path, threads: int, mib: int, passes: int, pages: str) -> list[float]:
    env = dict(os.environ, OMP_PROC_BIND="close", OMP_PLACES="cores")
    r = subprocess.run([str(exe), str(threads), str(mib), str(passes), pages], capture_output=True, text=True,
                       env=env, check=True)
    return json.loads(r.stdout)["gbps"]


def bandwidth_torch(threads: int, mib: int, passes: int) -> list[float]:
    torch.set_num_threads(threads)
    x = torch.ones(mib * 2**20 // 4)
    x.sum()
    out = []
    for _ in range(passes):
        t = time.perf_counter()
        x.sum()
        out.append(x.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return out


def adjacent_probe(exe: Path | None, threads: int) -> float:
    """A short probe next to one row: the median of three passes over 256 MiB (>> L3)."""
    if exe is not None:
        return float(np.median(bandwidth_c(exe, threads, 256, 3, "huge")))
    return float(np.median(bandwidth_torch(threads, 256, 3)))


def measure_bandwidth(exe: Path | None, threads: int, mib: int, passes: int) -> dict:
    res = {"threads": threads, "buffer_mib": mib}
    settle()
    with moe_data.ForeignLoad() as load:
        if exe is not None:
            res["c_stream_gbps"] = bandwidth_c(exe, threads, mib, passes, "huge")
            res["c_stream_small_pages_gbps"] = bandwidth_c(exe, threads, mib, passes, "small")
        res["torch_sum_gbps"] = bandwidth_torch(threads, mib, passes)
    res["foreign_cpu"] = load.fraction
    return res


def bandwidth_summary(samples: list[dict]) -> dict:
    """Median over every pass of every sample (start and end of the run). The reference figure is
    stream_read.c on huge pages (kt's allocator asks for them; the machine's best), else torch.sum."""
    def med(key):
        v = [x for s in samples for x in s.get(key, [])]
        return (float(np.median(v)), max(v)) if v else (None, None)

    c, c_best = med("c_stream_gbps")
    small, _ = med("c_stream_small_pages_gbps")
    t, t_best = med("torch_sum_gbps")
    out = {"torch_sum_median_gbps": t, "small_pages_gbps": small, "samples": samples}
    if c is not None:
        out.update(gbps=c, best_gbps=c_best, method="stream_read.c, OpenMP integer sum, huge pages")
    else:
        out.update(gbps=t, best_gbps=t_best, method="torch.sum, float32 (no C compiler)")
    return out


# -- the sides ------------------------------------------------------------------------------------

def torch_moe(x, gate, up, down, ids, weights):
    """Plain torch, bf16 weights and activations, one expert at a time over the tokens routed to it."""
    out = torch.zeros(x.shape[0], gate.shape[2], dtype=torch.float32)
    for e in torch.unique(ids).tolist():
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        xe = x[rows]
        h = F.silu(F.linear(xe, gate[e])) * F.linear(xe, up[e])
        y = F.linear(h, down[e])
        out.index_add_(0, rows, y.float() * weights[rows, slots, None])
    return out.to(torch.bfloat16)


class Inputs:
    def __init__(self, data: Path, tokens: int):
        self.hidden_bits, self.ids_np, self.w_np = moe_data.load_inputs(data, tokens)
        self.x = moe_data.as_bf16_tensor(np.ascontiguousarray(self.hidden_bits)).clone()
        self.ids = [torch.from_numpy(np.ascontiguousarray(i)) for i in self.ids_np]
        self.w = [torch.from_numpy(np.ascontiguousarray(w)) for w in self.w_np]


def measure_side(fn, inp: Inputs, bytes_per_expert: int, args, data: Path, truth_fmt: str, tokens: int) -> dict:
    """Run the shared protocol on fn(x, ids, w) -> output and check the first call's output."""
    first = []
    last = [None]

    def call(r: int) -> float:
        t = time.perf_counter()
        last[0] = fn(inp.x, inp.ids[r], inp.w[r])
        return time.perf_counter() - t

    with moe_data.ForeignLoad() as load:
        row = moe_data.run_protocol(call, inp.ids_np, bytes_per_expert, args.warmup, args.repeats, args.budget_s,
                                    lambda: first.append(last[0].float().numpy().copy()))
    row["foreign_cpu"] = load.fraction
    if args.check_tokens:
        ref = moe_data.reference_output(data, truth_fmt, tokens, args.check_tokens)
        row["rel_error"] = moe_data.relative_error(first[0][: len(ref)], ref)
        row["checked_tokens"] = len(ref)
    return row


def run_kt(shape: moe_data.Shape, data: Path, method: str, threads: int, tokens: list[int], args, source_bytes: int,
           probe_exe: Path | None):
    import kt_core
    from kt_core.errors import KTError

    kt_core.pool.configure(num_threads=threads)
    info = {"method": method, "threads": threads, "fast_activations": args.kt_fast_activations}
    try:
        layer = kt_core.MoE(num_experts=shape.experts, top_k=shape.top_k, hidden_size=shape.hidden,
                            intermediate_size=shape.intermediate, method=method, max_tokens=max(tokens),
                            fast_activations=args.kt_fast_activations)
    except (KTError, ValueError) as exc:
        info["skipped"] = f"{type(exc).__name__}: {exc}"
        return info, {}
    info.update(backend=layer.backend, kernel_id=layer.kernel_id, layout_id=layer.layout_id,
                packed_bytes=layer.packed_bytes)
    refusal = None if args.force else fits(layer.packed_bytes, source_bytes)
    if refusal:
        info["skipped"] = refusal
        return info, {}
    gate, up, down, scales, zeros = moe_data.kt_load_args(data, method)
    t0 = time.perf_counter()
    try:
        layer.load(gate, up, down, scales=scales, zeros=zeros)
    except (KTError, ValueError, TypeError) as exc:
        info["skipped"] = f"load failed: {type(exc).__name__}: {exc}"
        return info, {}
    info["load_s"] = time.perf_counter() - t0
    bpe = layer.packed_bytes // shape.experts  # what kt really streams per expert
    rows = {}
    with torch.inference_mode():
        for T in tokens:
            inp = Inputs(data, T)
            memory_bound = T <= MEMORY_BOUND_TOKENS
            before = adjacent_probe(probe_exe, threads) if memory_bound else None
            settle()
            try:
                rows[T] = measure_side(layer, inp, bpe, args, data, moe_data.truth_format(method), T)
            except (KTError, ValueError, RuntimeError) as exc:
                rows[T] = {"error": f"{type(exc).__name__}: {exc}"}
            if memory_bound and "gbps_median" in rows[T]:
                adjacent = [before, adjacent_probe(probe_exe, threads)]
                rows[T]["adjacent_bandwidth_gbps"] = adjacent
                rows[T]["pct_adjacent_bandwidth"] = 100 * rows[T]["gbps_median"] / float(np.mean(adjacent))
            log(f"    kt {method:7s} T={T:<5d} N={threads}: " + fmt_row(rows[T]))
    del layer
    gc.collect()
    return info, rows


def run_torch(shape: moe_data.Shape, data: Path, threads: int, tokens: list[int], args) -> dict:
    torch.set_num_threads(threads)
    bf16 = moe_data.load_bf16(data)
    gate, up, down = (moe_data.as_bf16_tensor(bf16[p]) for p in moe_data.PROJS)
    bpe = moe_data.format_bytes_per_expert(shape, "BF16")
    rows = {}
    with torch.inference_mode():
        for T in tokens:
            inp = Inputs(data, T)
            settle()
            rows[T] = measure_side(lambda x, i, w: torch_moe(x, gate, up, down, i, w), inp, bpe, args, data, "BF16", T)
            log(f"    torch bf16 T={T:<5d} N={threads}: " + fmt_row(rows[T]))
    return rows


def run_kt_kernel(venv: Path, shape: moe_data.Shape, data: Path, method: str, threads: int, tokens: list[int], args,
                  workdir: Path, source_bytes: int) -> dict:
    packed = 2 * shape.experts * moe_data.format_bytes_per_expert(shape, method)  # load-time peak, see above
    refusal = None if args.force else fits(packed, source_bytes)
    if refusal:
        return {"skipped": refusal}
    py = venv / "bin" / "python"
    out = workdir / f"kt_kernel_{shape.name}_{method}_{threads}.json"
    out.unlink(missing_ok=True)
    cmd = [str(py), str(RUNNER), "--data", str(data),
           "--method", KT_KERNEL_METHOD[method], "--threads", str(threads), "--tokens", *map(str, tokens),
           "--warmup", str(args.warmup), "--repeats", str(args.repeats), "--budget-s", str(args.budget_s),
           "--check-tokens", str(args.check_tokens), "--quiet-wait", str(args.quiet_wait), "--json", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"  # torch in the runner only stages data
    timeout = 600 + len(tokens) * (args.budget_s + 120) * 2
    settle()
    try:
        with moe_data.ForeignLoad() as load:
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"skipped": f"kt-kernel runner timed out after {timeout:.0f} s"}
    if r.returncode != 0 or not out.is_file():
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        log(f"    kt-kernel {method} N={threads} failed (exit {r.returncode}):\n{tail}")
        return {"skipped": f"kt-kernel runner failed (exit {r.returncode}): {tail.splitlines()[-1] if tail else ''}"}
    for line in r.stderr.splitlines():
        if line.startswith("kt-kernel "):
            log("    " + line)
    res = json.loads(out.read_text())
    res["runner_foreign_cpu"] = load.fraction  # over the whole runner process, loading included
    return res


# -- report ---------------------------------------------------------------------------------------

def fmt_row(row: dict) -> str:
    if not row:
        return "-"
    if "error" in row:
        return row["error"]
    s = f"{row['median_ms']:.3f} ms (±{row['spread']:.0%}, {row['calls']} calls), {row['gbps_median']:.1f} GB/s"
    if "rel_error" in row:
        s += f", err {row['rel_error']:.1e}"
    return s


def print_tables(result: dict) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None
    for sh in result["shapes"]:
        title = (f"{sh['shape']['name']}: hidden {sh['shape']['hidden']}, intermediate {sh['shape']['intermediate']}, "
                 f"{sh['shape']['experts']} experts, top-{sh['shape']['top_k']}")
        if "refused" in sh:
            print(f"{title}\n  refused: {sh['refused']}")
            continue
        head = ["method", "T", "N", "kt ms", "±", "kt GB/s", "%BW", "%adj", "torch ms", "kt×torch", "kt-kernel ms", "±",
                "kk GB/s", "kt×kk", "err kt", "err kk", "other"]
        body = []
        for r in sh["rows"]:
            kt, tr, kk = r.get("kt") or {}, r.get("torch") or {}, r.get("kt_kernel") or {}

            def ms(x):
                return f"{x['median_ms']:.2f}" if "median_ms" in x else ("skip" if x.get("skipped") else "err" if x else "-")

            def sp(x):
                return f"{x['spread']:.0%}" if "spread" in x else ""

            def ratio(a, b):
                return f"{a['median_ms'] / b['median_ms']:.2f}" if "median_ms" in a and "median_ms" in b else ""

            def err(x):
                return f"{x['rel_error']:.1e}" if "rel_error" in x else ""

            body.append([r["method"], str(r["tokens"]), str(r["threads"]), ms(kt), sp(kt),
                         f"{kt['gbps_median']:.1f}" if "gbps_median" in kt else "",
                         f"{kt['pct_bandwidth']:.0f}%" if "pct_bandwidth" in kt else "",
                         f"{kt['pct_adjacent_bandwidth']:.0f}%" if "pct_adjacent_bandwidth" in kt else "",
                         ms(tr), ratio(tr, kt), ms(kk), sp(kk),
                         f"{kk['gbps_median']:.1f}" if "gbps_median" in kk else "", ratio(kk, kt), err(kt), err(kk),
                         f"{max(x.get('foreign_cpu', 0.0) for x in (kt, tr, kk)):.0%}"])
        notes = []
        for key, info in sorted(sh["kt_layers"].items()):
            what = info.get("skipped") or f"{info['backend']} {info['kernel_id']}"
            notes.append(f"kt {key}: {what}")
        for key, info in sorted(sh["kt_kernel_layers"].items()):
            what = info.get("skipped") or f"{info['class']} ({info['cpu_variant']})"
            notes.append(f"kt-kernel {key}: {what}")
        bw = ", ".join(f"N={n}: {b['gbps']:.1f} GB/s (best {b['best_gbps']:.1f}"
                       + (f"; 4 KiB pages {b['small_pages_gbps']:.1f}" if b.get("small_pages_gbps") else "")
                       + f"; torch.sum {b['torch_sum_median_gbps']:.1f})" for n, b in sorted(result["bandwidth"].items()))
        notes.append(f"read bandwidth ({next(iter(result['bandwidth'].values()))['method']}): {bw}")
        notes.append("%BW: kt's GB/s over the run's median bandwidth; %adj: over the mean of the probes taken right "
                     "before and after the row (same threads, 256 MiB)")
        notes.append("kt×torch, kt×kk: their median / kt's median (>1: kt faster); err: max|out - ref| / rms(ref) "
                     "vs float64 (INT8/INT4 vs the bf16 weights, so it includes the format's rounding); other: CPU "
                     "share other processes used while the row was measured (high: timings disturbed)")
        if Console is not None:
            table = Table(title=title, show_lines=False)
            for h in head:
                table.add_column(h, justify="left" if h == "method" else "right")
            for b in body:
                table.add_row(*b)
            console = Console(width=max(160, shutil.get_terminal_size().columns))
            console.print(table)
            for n in notes:
                console.print("  " + n, highlight=False, soft_wrap=True)
        else:
            widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
            print(title)
            print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
            for b in body:
                print("  ".join(c.rjust(w) for c, w in zip(b, widths)))
            for n in notes:
                print("  " + n)


# -- main -----------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--shapes", nargs="+", default=list(moe_data.SHAPES), choices=sorted(moe_data.SHAPES))
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 4, 32, 256, 1024])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), type=str.upper, choices=METHODS)
    parser.add_argument("--kt-fast-activations", action="store_true",
                        help="kt's integer kernels use one int8 activation pass (kt-kernel's precision) instead of two")
    parser.add_argument("--threads", nargs="+", type=int, default=None, help="default: 1 and the physical cores")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per row (each with its own routing)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before them")
    parser.add_argument("--budget-s", type=float, default=60.0,
                        help="per row and side: fewer timed calls when the first call says they would take longer")
    parser.add_argument("--check-tokens", type=int, default=32, help="output rows checked against float64 (0: none)")
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--kt-kernel-venv", type=Path, default=None,
                        help="venv made by benchmarks/setup_kt_kernel.sh; without it the kt-kernel columns are skipped")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="keep (and re-use) the generated weights here, one sub-directory per shape; "
                             "default: a temporary directory under .bench/, removed at the end")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bandwidth-mib", type=int, default=1024, help="buffer for the bandwidth probe (>> L3)")
    parser.add_argument("--force", action="store_true", help="run configurations the memory check refuses")
    parser.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                        help="before each measurement wait up to S seconds for other processes to use < 15%% of the "
                             "CPUs (shared machines); the share seen while measuring is reported either way")
    parser.add_argument("--json", type=Path, help="write all results here")
    args = parser.parse_args()
    if args.warmup < 1 or args.repeats < 1 or min(args.tokens) < 1:
        parser.error("--warmup, --repeats and --tokens must be at least 1")
    global QUIET_WAIT_S
    QUIET_WAIT_S = args.quiet_wait
    sides = set(args.sides)
    if "kt-kernel" in sides and args.kt_kernel_venv is None:
        log("note: no --kt-kernel-venv; kt-kernel columns skipped (create one with benchmarks/setup_kt_kernel.sh)")
        sides.discard("kt-kernel")
    if "kt-kernel" in sides and not (args.kt_kernel_venv / "bin" / "python").is_file():
        parser.error(f"--kt-kernel-venv {args.kt_kernel_venv}: no bin/python there; run benchmarks/setup_kt_kernel.sh")

    machine = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
               "mem_total_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB}
    cores = os.cpu_count() or 1
    try:
        import kt_core

        h = kt_core.host()
        cores = h.physical_cores
        machine.update(cpu=h.brand, isa_level=h.isa_level, physical_cores=cores, kt_core=kt_core.__version__)
    except Exception as exc:  # kt not importable: only torch and kt-kernel sides
        if "kt" in sides:
            parser.error(f"cannot import kt_core ({exc}); install kt or pass --sides torch kt-kernel")
    threads = args.threads or sorted({1, cores})
    tokens = sorted(set(args.tokens))
    rounds = args.warmup + args.repeats

    own_tmp = args.data_dir is None
    base = Path(tempfile.mkdtemp(prefix="moe-layer-", dir=_bench_dir())) if own_tmp else args.data_dir
    base.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "threads": threads, "tokens": tokens, "bandwidth": {}, "shapes": []}
    try:
        with tempfile.TemporaryDirectory(prefix="moe-layer-work-") as work:
            work = Path(work)
            exe = build_stream_read(work)
            log("measuring read bandwidth" + (" (stream_read.c)" if exe else " (torch.sum)"))
            samples = {n: [measure_bandwidth(exe, n, args.bandwidth_mib, 10)] for n in threads}
            for shape_name in args.shapes:
                result["shapes"].append(run_shape(moe_data.SHAPES[shape_name], base / shape_name, args, sides, threads,
                                                  tokens, rounds, work, exe))
            for n in threads:  # again at the end: the machine is shared, bandwidth drifts
                samples[n].append(measure_bandwidth(exe, n, args.bandwidth_mib, 10))
            result["bandwidth"] = {n: bandwidth_summary(samples[n]) for n in threads}
            for sh in result["shapes"]:
                for r in sh.get("rows", []):
                    kt = r.get("kt") or {}
                    if "gbps_median" in kt:
                        kt["pct_bandwidth"] = 100 * kt["gbps_median"] / result["bandwidth"][r["threads"]]["gbps"]
                    kk = r.get("kt_kernel") or {}
                    if "gbps_median" in kk:
                        kk["pct_bandwidth"] = 100 * kk["gbps_median"] / result["bandwidth"][r["threads"]]["gbps"]
    finally:
        if own_tmp:
            shutil.rmtree(base, ignore_errors=True)
    print_tables(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        log(f"wrote {args.json}")


def _bench_dir() -> Path:
    d = ROOT / ".bench"
    d.mkdir(exist_ok=True)
    return d


def run_shape(shape: moe_data.Shape, data: Path, args, sides: set[str], threads: list[int], tokens: list[int],
              rounds: int, work: Path, probe_exe: Path | None) -> dict:
    methods = list(dict.fromkeys(args.methods))
    out = {"shape": {"name": shape.name, "hidden": shape.hidden, "intermediate": shape.intermediate,
                     "experts": shape.experts, "top_k": shape.top_k}, "kt_layers": {}, "kt_kernel_layers": {}}
    need = shape_memory_need(shape, tokens)
    avail = mem_available()
    out["memory"] = {**need, "available": avail}
    log(f"{shape.name}: needs about {need['total'] / GIB:.1f} GiB (weights {need['source'] / GIB:.1f}, packed copies "
        f"up to {need['packed'] / GIB:.1f} while loading, scratch {need['scratch'] / GIB:.1f}); {avail / GIB:.1f} GiB available")
    if need["total"] > 0.9 * avail and not args.force:
        out["refused"] = (f"needs about {need['total'] / GIB:.1f} GiB, only {avail / GIB:.1f} GiB available "
                          "(fewer tokens, another shape, or --force)")
        log(f"  refused: {out['refused']}")
        return out
    moe_data.prepare(data, shape, args.seed, {m for m in methods if m in moe_data.CHECKPOINT_FORMATS}, tokens, rounds, log=log)
    log("  float64 references")
    for m in {moe_data.truth_format(m) for m in methods} | {"BF16"}:
        for T in tokens:
            if args.check_tokens:
                moe_data.reference_output(data, m, T, args.check_tokens)
    source = {m: shape.experts * moe_data.format_bytes_per_expert(shape, m if m in moe_data.CHECKPOINT_FORMATS else "BF16")
              for m in methods}
    cells: dict[tuple, dict] = {}
    for n in threads:
        log(f"  threads {n}")
        if "torch" in sides:
            for T, row in run_torch(shape, data, n, tokens, args).items():
                for m in methods:
                    cells.setdefault((m, T, n), {})["torch"] = row
        if "kt" in sides:
            for m in methods:
                info, rows = run_kt(shape, data, m, n, tokens, args, source[m], probe_exe)
                out["kt_layers"][f"{m} N={n}"] = info
                if "skipped" in info:
                    log(f"    kt {m:7s} N={n}: skipped: {info['skipped']}")
                for T in tokens:
                    cells.setdefault((m, T, n), {})["kt"] = rows.get(T, {"skipped": info.get("skipped", "")})
        if "kt-kernel" in sides:
            for m in methods:
                res = run_kt_kernel(args.kt_kernel_venv, shape, data, m, n, tokens, args, work, source[m])
                info = {k: v for k, v in res.items() if k != "rows"}
                out["kt_kernel_layers"][f"{KT_KERNEL_METHOD[m]} N={n}"] = info
                by_t = {r["tokens"]: r for r in res.get("rows", [])}
                for T in tokens:
                    cells.setdefault((m, T, n), {})["kt_kernel"] = by_t.get(T, {"skipped": res.get("skipped", "")})
    out["rows"] = [{"method": m, "tokens": T, "threads": n, **cells.get((m, T, n), {})}
                   for m in methods for T in tokens for n in threads]
    return out


if __name__ == "__main__":
    main()
