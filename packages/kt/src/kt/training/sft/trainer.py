"""`kt sft train`: LoRA fine-tuning of an MoE model's routed experts on kt, resumable.

The model's routed experts go to kt (frozen, `method`) with trainable LoRA (patch_model(mode=
"train")); with train_experts their own weights train too (or alone, lora.rank 0); everything else
is frozen. AdamW over what trains, linear warm-up then constant
learning rate, batches padded to their longest sequence. Step s trains on examples
[s * batch_size, (s + 1) * batch_size) of the data shuffled anew each epoch by (seed, epoch), so
what a step sees depends only on the config and s: a run resumed from a checkpoint takes exactly
the steps the uninterrupted run would have taken.

Output folder:
  checkpoint-STEP/   adapter (PEFT format, with adapters) + trainer_state.pt (the trained parameters
                     as kt holds them, optimizer, step, losses), written aside and renamed in (a kill
                     never leaves a half checkpoint)
  adapter/           the final adapter (PEFT format), with adapters
  model/             train_experts: the fine-tuned model (save_pretrained: the base model's folder
                     layout, its expert weights trained; the adapters are not merged in)
  log.jsonl          one line per step: step, loss, tokens, tokens/s, lr
  config.yaml        the run's settings as used
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kt_core.errors import KTError

from ..lora_experts import RESIDENT_WEIGHTS, is_adapter
from .config import PRESET, SFTConfig
from .data import IGNORE, Example, load_examples

STATE = "trainer_state.pt"


def model_folder(model: str) -> str:
    """The folder of a config's model: itself, or the built-in preset's (written on first use)."""
    if model == PRESET:
        from ...integrations.transformers.preset import ensure_preset

        return str(ensure_preset())
    return model


def load_model(model: str, dtype: str, without_experts: bool = False, trust_remote_code: bool = False):
    """(model, tokenizer) of a model folder or the built-in preset, in train-ready form;
    `without_experts`: the routed experts left unloaded, for kt to read from a weight_path
    (kt.integrations.transformers.load_model); `trust_remote_code`: the folder's modeling code runs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ...integrations.transformers import load_model as load_without_experts

    folder = model_folder(model)
    load = load_without_experts if without_experts else AutoModelForCausalLM.from_pretrained
    return (load(folder, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code),
            AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code))


def model_for_kt(config: SFTConfig):
    """(model, tokenizer, weight_path) for a run whose frozen experts go to kt: the model without its
    routed experts where kt reads them from its folder or the config's weight_path (then returned),
    otherwise loaded whole. With train_experts the experts are the model's own parameters: whole."""
    from ...weights.loader import expert_source

    weight_path = None if config.train_experts else expert_source(model_folder(config.model), config.method,
                                                                   config.weight_path, config.num_gpu_experts)
    model, tokenizer = load_model(config.model, config.dtype, without_experts=weight_path is not None,
                                  trust_remote_code=config.trust_remote_code)
    return model, tokenizer, weight_path or config.weight_path


def batch_for(examples: list[Example], step: int, batch_size: int, seed: int, pad_id: int):
    """(input_ids, attention_mask, labels) of step `step` (see the module doc for the order)."""
    n = len(examples)
    picks = []
    for i in range(step * batch_size, (step + 1) * batch_size):
        epoch, at = divmod(i, n)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        picks.append(examples[int(order[at])])
    longest = max(len(e.input_ids) for e in picks)
    ids = torch.full((len(picks), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(picks), longest), dtype=torch.long)
    labels = torch.full((len(picks), longest), IGNORE, dtype=torch.long)
    for row, e in enumerate(picks):
        ids[row, : len(e.input_ids)] = torch.tensor(e.input_ids)
        mask[row, : len(e.input_ids)] = 1
        labels[row, : len(e.labels)] = torch.tensor(e.labels)
    return ids, mask, labels


def checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for p in output_dir.glob("checkpoint-*"):
        if p.is_dir() and p.name.split("-", 1)[1].isdigit() and (p / STATE).is_file():
            found.append((int(p.name.split("-", 1)[1]), p))
    return sorted(found)


def _write_aside(destination: Path, write: Callable[[Path], None]) -> Path:
    """write(folder) into a temporary folder beside `destination`, then renamed in: a kill never
    leaves a half-written one."""
    tmp = destination.with_name(f".{destination.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    shutil.rmtree(destination, ignore_errors=True)
    os.replace(tmp, destination)
    return destination


def _trained(patch) -> dict[str, torch.Tensor]:
    """What trains, as kt holds it ({module path.parameter name: tensor}): the adapters (the PEFT
    folder beside may have changed their form: separate gate and up adapters are written as one fused
    adapter) and, with train_experts, the expert weights (the GPU-resident experts' both as their own
    parameters and, brought up to date, in their rows of the model's)."""
    for m in patch.modules.values():
        m.sync_resident_weights()
    return {f"{path}.{name}": p.detach().clone() for path, m in patch.modules.items() for name, p in m.named_parameters()}


def _save_checkpoint(output_dir: Path, step: int, patch, opt, sched, losses: list[float], config: SFTConfig) -> Path:
    def write(folder: Path) -> None:
        if config.lora.rank:
            patch.save_adapter(folder, base_model_name_or_path=config.model)
        # The parameters as kt holds them, so a resumed run continues from the same ones the optimizer
        # state belongs to.
        torch.save({"step": step, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "losses": losses,
                    "parameters": _trained(patch), "config": config.as_dict()}, folder / STATE)

    return _write_aside(output_dir / f"checkpoint-{step}", write)


def save_model_folder(model, tokenizer, destination: Path, state_dict: dict | None = None) -> Path:
    """The model and its tokenizer as a model folder (save_pretrained; `state_dict` in place of the
    model's own), written aside and renamed in."""
    def write(folder: Path) -> None:
        model.save_pretrained(folder, state_dict=state_dict)
        tokenizer.save_pretrained(folder)

    return _write_aside(Path(destination), write)


def _save_model(model, tokenizer, patch, destination: Path) -> Path:
    """A patched model in its own folder layout, without kt's adapter parameters."""
    adapters = {f"{path}.{name}" for path, m in patch.modules.items() for name, _ in m.named_parameters()
                if is_adapter(name)}
    return save_model_folder(model, tokenizer, destination,
                             {k: v for k, v in model.state_dict().items() if k not in adapters})


def trained_model(config: SFTConfig, run_dir: Path, checkpoint: int | None = None):
    """(model, tokenizer): the run's base model, with its trained expert weights when it trained them
    (train_experts: the final model/ folder, or checkpoint STEP's parameters)."""
    if not config.train_experts:
        return load_model(config.model, config.dtype, trust_remote_code=config.trust_remote_code)
    if checkpoint is None:
        folder = run_dir / "model"
        if not (folder / "config.json").is_file():
            raise KTError(f"{folder} holds no model (the run has not finished: pass --checkpoint STEP)")
        return load_model(str(folder), config.dtype, trust_remote_code=config.trust_remote_code)
    state_file = run_dir / f"checkpoint-{checkpoint}" / STATE
    if not state_file.is_file():
        raise KTError(f"{state_file.parent} is not a checkpoint of this run (no {STATE})")
    model, tokenizer = load_model(config.model, config.dtype, trust_remote_code=config.trust_remote_code)
    trained = torch.load(state_file, weights_only=False)["parameters"]
    weights = {k: v for k, v in trained.items() if not is_adapter(k) and k.rsplit(".", 1)[-1] not in RESIDENT_WEIGHTS}
    missing = model.load_state_dict(weights, strict=False)
    if missing.unexpected_keys:
        raise KTError(f"{state_file}: {missing.unexpected_keys[0]} is not a parameter of {config.model}")
    return model, tokenizer


def train(config: SFTConfig, *, resume: bool = False, on_step: Callable[[dict], None] | None = None,
          stop_after: int | None = None) -> list[float]:
    """Run (or resume) the configured training; returns the loss of every step taken so far.
    stop_after: return after that many steps in total (tests: a run killed after a checkpoint)."""
    import yaml

    from ...integrations.transformers import patch_model

    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise KTError(f"{config.source}: device: {config.device}, but torch sees no CUDA device here "
                      f"(torch {torch.__version__}, torch.cuda.is_available() is False)")
    out = config.output_dir
    existing = checkpoints(out) if out.is_dir() else []
    if existing and not resume:
        raise KTError(f"{out} already holds checkpoints (up to step {existing[-1][0]}): pass --resume to continue that "
                      "run, or choose another output_dir")
    if resume and not existing:
        raise KTError(f"--resume: {out} holds no checkpoint to resume from")
    torch.manual_seed(config.train.seed)
    model, tokenizer, weight_path = model_for_kt(config)
    examples = load_examples(config.data, tokenizer, config.train.max_length)
    # Patched on the CPU (the experts' weights go to kt, GPU-resident ones are taken from there), then
    # the model moves: LoRAExperts keeps its adapters (and trained weights) on the CPU for kt.
    patch = patch_model(model, method=config.method, group_size=config.group_size, zero_point=config.zero_point,
                        weight_path=weight_path, num_gpu_experts=config.num_gpu_experts, mode="train",
                        lora_rank=config.lora.rank, lora_alpha=config.lora.alpha,
                        target=config.lora.target, recompute=config.train.recompute,
                        max_tokens=max(config.train.max_length * config.train.batch_size, 16),
                        fast_activations=config.fast_activations, train_experts=config.train_experts)
    model.to(device)
    params = patch.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=config.train.lr, weight_decay=config.train.weight_decay)
    warm = config.train.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    losses: list[float] = []
    start = 0
    if resume:
        step, path = existing[-1]
        state = torch.load(path / STATE, weights_only=False)
        keys = ("train", "lora", "train_experts")
        written = {k: state["config"].get(k) for k in keys}
        if any(written[k] != config.as_dict()[k] for k in keys):
            raise KTError(f"--resume: {path} was written with other lora/train/train_experts settings ({written}) than "
                          "the config's; a resumed run must use the same ones")
        with torch.no_grad():   # in place: kt re-packs trained expert weights as they change
            for path_, m in patch.modules.items():
                for name, p in m.named_parameters():
                    p.copy_(state["parameters"][f"{path_}.{name}"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        losses, start = list(state["losses"]), step
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(config.as_dict(), sort_keys=False))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.train()
    last = config.train.steps if stop_after is None else min(stop_after, config.train.steps)
    with open(out / "log.jsonl", "a") as log:
        for step in range(start, last):
            ids, mask, labels = (t.to(device) for t in batch_for(examples, step, config.train.batch_size,
                                                                 config.train.seed, pad))
            t0 = time.perf_counter()
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            if not torch.isfinite(loss):
                raise KTError(f"step {step + 1}: the loss is {loss.item()} (lower train.lr?)")
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            seconds = time.perf_counter() - t0
            tokens = int(mask.sum())
            losses.append(loss.item())
            row = {"step": step + 1, "loss": losses[-1], "tokens": tokens, "tokens_per_s": tokens / seconds,
                   "lr": opt.param_groups[0]["lr"]}
            log.write(json.dumps(row) + "\n")
            log.flush()
            if on_step:
                on_step(row)
            if (step + 1) % config.train.save_every == 0 or step + 1 == config.train.steps:
                _save_checkpoint(out, step + 1, patch, opt, sched, losses, config)
    if last == config.train.steps:
        if config.lora.rank:
            _write_aside(out / "adapter", lambda folder: patch.save_adapter(folder, base_model_name_or_path=config.model))
        if config.train_experts:
            _save_model(model, tokenizer, patch, out / "model")
    return losses


def merge_adapter(config: SFTConfig, adapter: Path, destination: Path, model=None, tokenizer=None) -> Path:
    """The model (the base one unless given: a train_experts run's, trained_model) with the expert
    adapter merged into its expert weights, saved as a model folder (W_e += alpha / rank * B_e A_e
    on gate_up_proj and down_proj, in the model's dtype)."""
    from ..peft_format import merge_expert_adapter

    if model is None:
        model, tokenizer = load_model(config.model, config.dtype, trust_remote_code=config.trust_remote_code)
    merged = merge_expert_adapter(model, adapter)
    if not merged:
        raise KTError(f"{adapter}: none of its tensors names an experts module of {config.model}")
    return save_model_folder(model, tokenizer, destination)
