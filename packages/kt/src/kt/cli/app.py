"""The application's commands: `kt demo`, `kt bench`, `kt convert`, `kt run`, `kt chat` (kt-core owns the
`kt` script and `kt version` / `kt doctor` / `kt backends`; kt_core.cli dispatches here)."""

from __future__ import annotations

import importlib.util
import json
import os

import typer
from rich.console import Console

from kt_core.errors import KTError

from ..models.shapes import SHAPES, MoEShape, shape_for

# Plain click errors: one line naming the flag, not a box whose wrapping splits the message.
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="kt: run the routed experts of Mixture-of-Experts models on the CPU.")
console = Console()
err_console = Console(stderr=True)
FAST_ACTIVATIONS_HELP = ("--fast-activations: kt's layers carry activations coarsely (one int8 pass; bf16 for BF16 and "
                         "FP8), faster prefill at kt-kernel's precision; --precise-activations: two int8 passes on every "
                         "method, GGUF included (its default is llama.cpp's activation blocks, one pass)")


@app.command()
def demo(
    method: str = typer.Option("BF16", help="expert weight format (BF16 must reproduce torch's text exactly)"),
    tokens: int = typer.Option(48, min=1, help="tokens to generate"),
    prompt: str = typer.Option("The quick brown fox", help="text to continue"),
    backend: str = typer.Option(None, help="force a backend (default: the best installed for the method)"),
) -> None:
    """Generate with a built-in tiny Qwen3-MoE model (seeded random weights, written to the user
    cache on first use), first with torch's experts, then with kt's: both texts, whether they
    agree, and tokens/s of each."""
    from .demo import run

    run(console, method=method, tokens=tokens, prompt=prompt, backend=backend)


@app.command()
def bench(
    model: str = typer.Option(None, help="a model folder (its config.json) or a preset: " + ", ".join(SHAPES)),
    hidden: int = typer.Option(None, help="hidden size (instead of --model)"),
    intermediate: int = typer.Option(None, help="expert intermediate size"),
    experts: int = typer.Option(None, help="routed experts in the layer"),
    top_k: int = typer.Option(None, help="experts per token"),
    moe_layers: int = typer.Option(None, help="MoE layers of the model, for the whole-model estimate"),
    methods: list[str] = typer.Option(["BF16"], "--method", "--methods", help="weight formats to run (repeatable)"),
    tokens: list[int] = typer.Option([1, 4, 32, 256, 1024], "--tokens", min=1, help="tokens per call (repeatable)"),
    threads: list[int] = typer.Option([], "--threads", min=1, help="thread counts (repeatable); default: physical cores"),
    backend: str = typer.Option(None, help="force a backend (default: the best installed for each method)"),
    repeats: int = typer.Option(5, min=1, help="timed calls per row"),
    warmup: int = typer.Option(2, min=0, help="untimed calls before them"),
    bandwidth_mib: int = typer.Option(1024, min=1, help="buffer size of the bandwidth probe"),
    json_path: str = typer.Option(None, "--json", help="write the results here"),
    plot_path: str = typer.Option(None, "--plot", help="write a PNG of latency and roofline position here"),
    compare_kt_kernel: str = typer.Option(None, "--compare-kt-kernel", metavar="VENV",
                                          help="also measure kt-kernel 0.7.2 installed in this venv, same run"),
    fast_activations: bool = typer.Option(False, "--fast-activations",
                                          help="kt's layers carry activations coarsely (one int8 pass; bf16 for BF16 "
                                               "and FP8): faster prefill at kt-kernel's precision"),
) -> None:
    """Benchmark one MoE layer against this host's measured bandwidth and compute peak."""
    from rich.progress import Progress

    from kt_core.backends.selection import canonical_method, selector
    from kt_core.host import host

    from ..bench import BenchConfig, MemoryRefusal, run
    from ..bench.report import plot, render

    known = selector().methods()
    unknown = [m for m in methods if canonical_method(m) not in known]
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: not a method of any installed backend; they provide "
                                 f"{', '.join(sorted(known))}", param_hint="--method")
    if plot_path and importlib.util.find_spec("matplotlib") is None:
        raise typer.BadParameter("writing a plot needs matplotlib: pip install 'kt[plot]' (checked before the "
                                 "benchmark runs)", param_hint="--plot")
    if model:
        try:
            base = shape_for(model)
        except KTError as exc:
            raise typer.BadParameter(str(exc), param_hint="--model") from None
        except KeyError:
            raise typer.BadParameter(f"unknown model {model!r}: neither a preset ({', '.join(SHAPES)}) nor a folder "
                                     "with a config.json", param_hint="--model") from None
    else:
        missing = [n for n, v in (("--hidden", hidden), ("--intermediate", intermediate), ("--experts", experts),
                                  ("--top-k", top_k)) if v is None]
        if missing:
            raise typer.BadParameter(f"give --model or all of --hidden --intermediate --experts --top-k "
                                     f"(missing {', '.join(missing)})")
        base = MoEShape("custom", hidden, intermediate, experts, top_k, moe_layers or 1)
    shape = MoEShape(base.name, hidden or base.hidden, intermediate or base.intermediate, experts or base.experts,
                     top_k or base.top_k, moe_layers or base.moe_layers)
    cfg = BenchConfig(shape=shape, methods=[m.upper() for m in methods], tokens=sorted(set(tokens)),
                      threads=sorted(set(threads)) or [host().physical_cores], backend=backend, repeats=repeats,
                      warmup=warmup, bandwidth_mib=bandwidth_mib, compare_kt_kernel=compare_kt_kernel,
                      fast_activations=fast_activations)
    try:
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("kt bench", total=None)
            result = run(cfg, progress=lambda msg: bar.update(task, description=msg))
    except MemoryRefusal as exc:
        fail("kt bench", exc, 2)
    except (KTError, FileNotFoundError) as exc:
        fail("kt bench", exc, 1)
    render(result, console)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    if plot_path:
        plot(result, plot_path)
        console.print(f"plot written to {plot_path}")


@app.command("convert")
def convert_cmd(
    model: str = typer.Argument(..., help="Hugging Face model folder (bf16/fp16/fp32 or FP8 experts; RAWINT4 too "
                                "with --method RAWINT4 --packed)"),
    out: str = typer.Argument(..., help="folder to write (new or empty; or the same folder with --resume)"),
    method: str = typer.Option("INT4", help="INT8 or INT4 codes; or BF16, FP8, RAWINT4 (what the source stores) with "
                               "--packed: packed copies only"),
    group_size: int = typer.Option(None, help="INT4 group size: 32, 64 or 128 (default: the largest dividing the "
                                   "model's hidden and intermediate sizes)"),
    zero_point: bool = typer.Option(False, "--zero-point", help="asymmetric INT4 (zero points per group)"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted conversion into OUT"),
    packed: bool = typer.Option(False, "--packed", help="also store every layer in this host's packed kernel layout: "
                                "loading on hosts with that layout becomes a copy (the codes' size again on disk)"),
    threads: int = typer.Option(0, min=0, help="quantizer threads (default: physical cores)"),
) -> None:
    """Quantize a model's routed experts into a kt converted folder, one layer at a time (or, with
    --method BF16/FP8/RAWINT4 --packed, store them packed for this host without quantizing)."""
    from kt_core import pool

    from ..weights import convert

    try:
        pool.ensure(threads)
        done = convert(model, out, method=method, group_size=group_size, zero_point=zero_point, resume=resume,
                       progress=True, packed=packed, log=console.print)
    except KTError as exc:
        fail("kt convert", exc, 1)
    console.print(f"converted folder ready: {done}")


@app.command("run", context_settings={"allow_extra_args": True})
def run_cmd(
    ctx: typer.Context,
    model: str = typer.Argument("tiny", help="Hugging Face model folder (with tokenizer), or 'tiny': the built-in preset"),
    kt_method: str = typer.Option("BF16", "--kt-method", help="expert weight format: BF16, FP32, INT8, INT4, FP8, RAWINT4"),
    kt_weight_path: str = typer.Option(None, "--kt-weight-path",
                                       help="read the experts from here: a kt convert folder, or a checkpoint as stored"),
    kt_cpuinfer: int = typer.Option(None, "--kt-cpuinfer", help="kt pool threads (default: kt doctor's, physical cores)"),
    kt_threadpool_count: int = typer.Option(None, "--kt-threadpool-count",
                                            help="thread groups (default: kt doctor's, NUMA nodes)"),
    kt_num_gpu_experts: int = typer.Option(0, "--kt-num-gpu-experts", help="experts per layer kept as torch tensors"),
    kt_max_deferred: int = typer.Option(0, "--kt-max-deferred-experts-per-token",
                                        help="each token's lowest-weight experts added into the next layer"),
    fast_activations: bool | None = typer.Option(None, "--fast-activations/--precise-activations",
                                                 help=FAST_ACTIVATIONS_HELP),
    kt_numa_nodes: str = typer.Option(None, "--kt-numa-nodes", help="SGLang: NUMA node of each thread pool, e.g. 0,1"),
    kt_gpu_experts_ratio: float = typer.Option(None, "--kt-gpu-experts-ratio",
                                               help="SGLang: fraction of all experts on the GPU (overrides the count)"),
    kt_gpu_prefill_token_threshold: int = typer.Option(None, "--kt-gpu-prefill-token-threshold",
                                                       help="SGLang: from this many tokens, prefill whole layers on the GPU"),
    kt_expert_placement_strategy: str = typer.Option(None, "--kt-expert-placement-strategy",
                                                     help="SGLang: frequency, front-loading, uniform or random"),
    kt_enable_dynamic_expert_update: bool = typer.Option(False, "--kt-enable-dynamic-expert-update",
                                                         help="SGLang: re-pick the GPU experts after GPU prefills"),
    record_kt_gpu_expert_distribution: bool = typer.Option(False, "--record-kt-gpu-expert-distribution",
                                                           help="SGLang: record the GPU expert mask per forward"),
    kt_expert_lora_path: str = typer.Option(None, "--kt-expert-lora-path",
                                            help="a PEFT adapter of the routed experts, served with them"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, help="port to listen on (0: any free port)"),
    served_model_name: str = typer.Option(None, "--served-model-name", help="model id clients ask for"),
    max_queue: int = typer.Option(64, help="requests that may wait behind the running one (503 beyond)"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                           help="run the modeling code the model folder ships (Kimi-K2, DeepSeek's own)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print what would run, start nothing"),
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API with its routed experts on kt (SGLang with
    --kt-* flags instead, where SGLang and a CUDA GPU are present; arguments after `--` go to
    SGLang unchanged, e.g. `kt run MODEL -- --tp 2 --disable-cuda-graph`)."""

    from ..serve.launch import run
    from ..serve.settings import ServeSettings

    extra = list(ctx.args)
    if model.startswith("-"):   # `kt run -- --tp 2`: no MODEL before `--`, so click gave it SGLang's first argument
        model, extra = "tiny", [model, *extra]
    settings = ServeSettings(model=model, method=kt_method, weight_path=kt_weight_path, cpuinfer=kt_cpuinfer,
                             threadpool_count=kt_threadpool_count, num_gpu_experts=kt_num_gpu_experts,
                             max_deferred_experts_per_token=kt_max_deferred, fast_activations=fast_activations,
                             host=host, port=port,
                             served_model_name=served_model_name, max_queue=max_queue,
                             trust_remote_code=trust_remote_code,
                             numa_nodes=numa_node_list(kt_numa_nodes),
                             gpu_experts_ratio=kt_gpu_experts_ratio,
                             gpu_prefill_token_threshold=kt_gpu_prefill_token_threshold,
                             expert_placement_strategy=kt_expert_placement_strategy,
                             dynamic_expert_update=kt_enable_dynamic_expert_update,
                             record_gpu_expert_distribution=record_kt_gpu_expert_distribution,
                             expert_lora_path=kt_expert_lora_path, sglang_args=tuple(extra))
    try:
        run(settings, console, dry_run=dry_run)
    except (KTError, ImportError, OSError) as exc:
        fail("kt run", exc, 1)


def numa_node_list(text: str | None) -> tuple[int, ...] | None:
    """--kt-numa-nodes 0,1 (or "0 1") as node ids."""
    if text is None:
        return None
    try:
        return tuple(int(n) for n in text.replace(",", " ").split())
    except ValueError:
        raise typer.BadParameter(f"NUMA node ids separated by commas, e.g. 0,1; got {text!r}",
                                 param_hint="--kt-numa-nodes") from None


@app.command()
def chat(
    url: str = typer.Option("http://127.0.0.1:8000/v1", help="an OpenAI-compatible endpoint"),
    model: str = typer.Option(None, help="model id (default: the first the server lists)"),
    max_tokens: int = typer.Option(256, min=1, help="most tokens per reply"),
    temperature: float = typer.Option(0.7, min=0, help="sampling temperature (0: greedy)"),
    system: str = typer.Option(None, help="a system message to start every conversation with"),
) -> None:
    """Chat with an OpenAI-compatible server (kt run's or any): streamed replies, history,
    /clear, /exit, token counts. Reads lines from stdin when it is not a terminal."""
    from .chat import ChatError, run

    try:
        run(console, url=url, model=model, max_tokens=max_tokens, temperature=temperature, system=system)
    except ChatError as exc:
        fail("kt chat", exc, 1)
    except ImportError as exc:
        fail("kt chat", f"needs httpx ({exc}): pip install 'kt[serve]'", 1)


def fail(command: str, error, code: int):
    """One line on stderr, then exit `code`. Printed without markup: an install hint such as
    `pip install 'kt[serve]'` is text, not a style tag."""
    error_line(command, error)
    raise typer.Exit(code)


def error_line(command: str, error) -> None:
    err_console.print(f"{command}: {error}", style="red", markup=False, highlight=False, soft_wrap=True)


config_app = typer.Typer(help="user-level defaults of kt run, kt bench and kt convert (a YAML file)",
                         no_args_is_help=True)
app.add_typer(config_app, name="config")


def _option(key: str):
    """The click option a config key names, checked against the command."""
    from ..config import split_key

    command, name = split_key(key)
    cmd = typer.main.get_command(app).commands[command]
    options = {p.name: p for p in cmd.params if p.param_type_name == "option"}
    if name not in options:
        raise KTError(f"kt {command} has no option {name!r}; it has {', '.join(sorted(options))}")
    return options[name]


def _checked_value(command: str, option, values: list[str]):
    """The value as kt COMMAND would take it from its flag: parsed by the command itself, so
    whatever the flag refuses (a type, a range) the config refuses too."""
    import yaml

    flag = option.opts[0]
    if option.is_flag:
        value = yaml.safe_load(values[0]) if len(values) == 1 else None
        if not isinstance(value, bool):
            raise KTError(f"{command}.{option.name} is the flag {flag}: true or false, got {' '.join(values)}")
        return value
    if not option.multiple and len(values) != 1:
        raise KTError(f"{command}.{option.name} takes one value, got {len(values)}")
    args = [a for v in values for a in (flag, v)]
    cmd = typer.main.get_command(app).commands[command]
    parsed = cmd.make_context(f"kt {command}", args, resilient_parsing=True).params.get(option.name)
    if parsed is None or (option.multiple and len(parsed) != len(values)):
        raise KTError(f"{' '.join(values)} is not a value kt {command} {flag} takes (kt {command} --help)")
    return list(parsed) if option.multiple else parsed


def _config_fail(exc) -> None:
    fail("kt config", exc, 1)


@config_app.command("list")
def config_list() -> None:
    """Every setting, as COMMAND.OPTION = VALUE."""
    from ..config import config_path, load

    try:
        data = load()
    except KTError as exc:
        _config_fail(exc)
    for command, options in sorted(data.items()):
        for name, value in sorted(options.items()):
            print(f"{command}.{name} = {value!r}")
    if not data:
        print(f"no settings ({config_path()} does not exist or is empty)")


@config_app.command("get")
def config_get(key: str = typer.Argument(..., help="COMMAND.OPTION, e.g. run.kt_method")) -> None:
    """One setting's value (exit 1 when it is not set)."""
    from ..config import load, split_key

    try:
        command, name = split_key(key)
        _option(key)
        options = load().get(command, {})
    except KTError as exc:
        _config_fail(exc)
    if name not in options:
        fail("kt config", f"{key} is not set", 1)
    print(options[name])


@config_app.command("set")
def config_set(key: str = typer.Argument(..., help="COMMAND.OPTION, e.g. run.kt_method"),
               values: list[str] = typer.Argument(..., help="the value (several for a repeatable option)")) -> None:
    """Set a default, checked as the command checks its flag."""
    from ..config import load, save, split_key

    try:
        command, name = split_key(key)
        value = _checked_value(command, _option(key), values)
        data = load()
        data.setdefault(command, {})[name] = value
        path = save(data)
    except KTError as exc:
        _config_fail(exc)
    print(f"{key} = {value!r} ({path})")


@config_app.command("unset")
def config_unset(key: str = typer.Argument(..., help="COMMAND.OPTION")) -> None:
    """Remove a setting (the command's own default applies again)."""
    from ..config import load, save, split_key

    try:
        command, name = split_key(key)
        data = load()
        data.get(command, {}).pop(name, None)
        save(data)
    except KTError as exc:
        _config_fail(exc)


@config_app.command("path")
def config_path_cmd() -> None:
    """Where the settings live ($KT_CONFIG, else $XDG_CONFIG_HOME/kt/config.yaml)."""
    from ..config import config_path

    print(config_path())


sft_app = typer.Typer(help="LoRA fine-tuning of an MoE model with its routed experts on kt (a YAML config)",
                      no_args_is_help=True)
app.add_typer(sft_app, name="sft")


@sft_app.command("train")
def sft_train(
    config: str = typer.Argument(..., help="the run's YAML config (kt.training.sft.config documents every field)"),
    resume: bool = typer.Option(False, help="continue from output_dir's last checkpoint"),
) -> None:
    """Train expert LoRA adapters (and, train_experts, the expert weights): progress with loss and tokens/s,
    checkpoints every save_every steps, the final adapter in output_dir/adapter (PEFT format), the
    fine-tuned model in output_dir/model."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ..training.sft import load_config, train

    cfg = load_config(config)
    with Progress(TextColumn("[bold]kt sft[/bold]"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss {task.fields[loss]}  {task.fields[rate]} tokens/s"), TimeRemainingColumn(),
                  console=console) as progress:
        task = progress.add_task("train", total=cfg.train.steps, loss="-", rate="-")

        def on_step(row):
            progress.update(task, completed=row["step"], loss=f"{row['loss']:.4f}", rate=f"{row['tokens_per_s']:.0f}")

        losses = train(cfg, resume=resume, on_step=on_step)
    saved = ([f"adapter: {cfg.output_dir / 'adapter'}"] if cfg.lora.rank else []) + \
        ([f"model: {cfg.output_dir / 'model'}"] if cfg.train_experts else [])
    console.print(f"{len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}; {', '.join(saved)}")


def _run_config(run_dir: str):
    from ..training.sft import load_config

    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        raise KTError(f"{run_dir} is not a kt sft output folder (no config.yaml)")
    return load_config(path, need_data=False)


def _adapter_of(run_dir: str, checkpoint: int | None, cfg) -> str | None:
    """The run's adapter folder (None for a train_experts run without adapters)."""
    if cfg.train_experts and not cfg.lora.rank:
        return None
    path = os.path.join(run_dir, "adapter" if checkpoint is None else f"checkpoint-{checkpoint}")
    if not os.path.isfile(os.path.join(path, "adapter_config.json")):
        raise KTError(f"{path} holds no adapter" + ("" if checkpoint is not None else " (the run has not finished: "
                                                   "pass --checkpoint STEP)"))
    return path


@sft_app.command("export")
def sft_export(
    run_dir: str = typer.Argument(..., help="a kt sft output folder"),
    to: str = typer.Option(..., "--to", help="where to write"),
    merge: bool = typer.Option(False, help="write the model with the adapter merged into its expert weights "
                                           "(a full model folder) instead of the adapter"),
    checkpoint: int = typer.Option(None, help="a checkpoint's adapter (and weights) instead of the final ones"),
) -> None:
    """Save the run's expert adapter (PEFT format), or the model with it merged in. A train_experts run
    writes its fine-tuned model folder (with the adapter in TO/adapter, or merged in with --merge)."""
    import shutil
    from pathlib import Path

    from ..training.sft import merge_adapter
    from ..training.sft.trainer import save_model_folder, trained_model

    cfg = _run_config(run_dir)
    adapter = _adapter_of(run_dir, checkpoint, cfg)
    model = tokenizer = None
    if cfg.train_experts:
        model, tokenizer = trained_model(cfg, Path(run_dir), checkpoint)
        if adapter is None or not merge:
            save_model_folder(model, tokenizer, Path(to))
            console.print(f"fine-tuned model: {to}")
            if adapter is None:
                return
            to = os.path.join(to, "adapter")
    if merge:
        merge_adapter(cfg, Path(adapter), Path(to), model, tokenizer)
        console.print(f"merged model: {to}")
        return
    os.makedirs(to, exist_ok=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copyfile(os.path.join(adapter, name), os.path.join(to, name))
    console.print(f"adapter (PEFT format): {to}")


@sft_app.command("chat")
def sft_chat(
    run_dir: str = typer.Argument(..., help="a kt sft output folder"),
    prompt: list[str] = typer.Option([], "--prompt", help="ask this (repeatable) instead of reading stdin"),
    max_new_tokens: int = typer.Option(64, min=1, help="tokens per reply"),
    checkpoint: int = typer.Option(None, help="a checkpoint's adapter (and weights) instead of the final ones"),
) -> None:
    """Try the trained adapter (or weights): greedy replies of the model with its experts (and their LoRA) on kt."""
    import sys
    from pathlib import Path

    import torch

    from ..integrations.transformers import patch_model
    from ..training.sft.trainer import model_for_kt, trained_model

    cfg = _run_config(run_dir)
    adapter = _adapter_of(run_dir, checkpoint, cfg)
    if cfg.train_experts:
        (model, tokenizer), weight_path = trained_model(cfg, Path(run_dir), checkpoint), cfg.weight_path
    else:   # the frozen experts as the run had them, read by kt (the model loaded without them where it can)
        model, tokenizer, weight_path = model_for_kt(cfg)
    patch_model(model, method=cfg.method, group_size=cfg.group_size, zero_point=cfg.zero_point,
                weight_path=weight_path, expert_lora_path=adapter)
    model.eval()
    questions = prompt or (line.rstrip("\n") for line in sys.stdin)
    for q in questions:
        if not q.strip():
            continue
        ids = tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                            return_tensors="pt")
        ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
        console.print(f"> {q}\n{tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)}", soft_wrap=True)


def main(argv: list[str]) -> int:
    from ..config import load

    try:
        defaults = load() if argv and argv[0] in ("run", "bench", "convert") else {}
    except KTError as exc:
        error_line(f"kt {argv[0]}", exc)
        return 1
    try:
        app(args=argv, prog_name="kt", standalone_mode=True, default_map=defaults)
    except KTError as exc:   # a setting (KT_*), a backend choice: what the commands did not catch themselves
        error_line(f"kt {argv[0]}", exc)
        return 1
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
