"""kt sft: config and data checking, training on the tiny preset, resume after a kill, export and chat."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from kt.training.sft import load_config, load_examples, merge_adapter, train  # noqa: E402
from kt.training.sft.data import IGNORE  # noqa: E402
from kt_core.errors import KTError  # noqa: E402

PAIRS = [("sky", "blue"), ("grass", "green"), ("snow", "white"), ("coal", "black"), ("blood", "red"), ("sun", "yellow")]


def write_data(path: Path) -> Path:
    lines = []
    for thing, color in PAIRS:
        lines.append({"messages": [{"role": "user", "content": f"color of {thing}?"},
                                   {"role": "assistant", "content": color}]})
        lines.append({"instruction": f"name the color of {thing}", "output": color})
    lines.append({"text": "colors: " + ", ".join(c for _, c in PAIRS)})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    return path


def write_config(tmp: Path, **train) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    write_data(tmp / "data.jsonl")
    settings = {"steps": 6, "lr": 3e-3, "batch_size": 4, "max_length": 64, "seed": 1, "save_every": 2, **train}
    cfg = {"model": "tiny", "data": "data.jsonl", "output_dir": "run", "method": "BF16",
           "lora": {"rank": 4, "alpha": 8, "target": ["gate", "up", "down"]}, "train": settings}
    import yaml

    (tmp / "sft.yaml").write_text(yaml.safe_dump(cfg))
    return tmp / "sft.yaml"


def test_training_reduces_the_loss_and_writes_a_peft_adapter(tmp_path, monkeypatch):
    from kt.training.sft import trainer

    loads, load = [], trainer.load_model
    # The frozen experts are read by kt from the model's folder, never loaded into torch.
    monkeypatch.setattr(trainer, "load_model", lambda *a, **kw: loads.append(kw) or load(*a, **kw))
    cfg = load_config(write_config(tmp_path, steps=10))
    losses = train(cfg)
    assert loads == [{"without_experts": True, "trust_remote_code": False}]
    assert len(losses) == 10 and losses[-1] < losses[0] - 0.3, losses
    run = tmp_path / "run"
    assert (run / "adapter" / "adapter_config.json").is_file() and (run / "adapter" / "adapter_model.safetensors").is_file()
    assert sorted(p.name for p in run.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in (10, 2, 4, 6, 8)]
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 11)) and all(r["tokens_per_s"] > 0 for r in log)
    with pytest.raises(KTError, match="already holds checkpoints"):
        train(cfg)


def test_resume_takes_the_steps_the_uninterrupted_run_takes(tmp_path):
    whole = train(load_config(write_config(tmp_path / "a")))
    cfg = load_config(write_config(tmp_path / "b"))
    first = train(cfg, stop_after=4)
    assert first == pytest.approx(whole[:4], rel=1e-6)
    resumed = train(cfg, resume=True)
    assert resumed[:4] == first
    assert resumed[4:] == pytest.approx(whole[4:], rel=1e-5), (resumed, whole)


def test_resume_after_a_kill(tmp_path):
    """`kt sft train` killed (SIGKILL) once checkpoint-2 is on disk, then `--resume`: the next loss is the
    uninterrupted run's."""
    config = write_config(tmp_path, steps=4, save_every=2)
    whole = train(load_config(write_config(tmp_path / "whole", steps=4, save_every=2)))
    kt = [sys.executable, "-c", "import sys; from kt_core.cli import main; sys.exit(main())"]
    proc = subprocess.Popen(kt + ["sft", "train", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (tmp_path / "run" / "checkpoint-2" / "trainer_state.pt").is_file():
        assert proc.poll() is None or (tmp_path / "run" / "checkpoint-2").is_dir(), proc.stderr.read().decode()
        assert time.time() < deadline, "no checkpoint-2 within 120 s"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    r = subprocess.run(kt + ["sft", "train", str(config), "--resume"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    after = {row["step"]: row["loss"] for row in log}   # the resumed run's lines come last
    assert after[3] == pytest.approx(whole[2], rel=1e-5) and after[4] == pytest.approx(whole[3], rel=1e-5)


def test_export_merge_and_chat(tmp_path):
    cfg = load_config(write_config(tmp_path, steps=4))
    train(cfg)
    run = tmp_path / "run"
    kt = [sys.executable, "-c", "import sys; from kt_core.cli import main; sys.exit(main())"]
    r = subprocess.run(kt + ["sft", "export", str(run), "--to", str(tmp_path / "adapter")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    r = subprocess.run(kt + ["sft", "chat", str(run), "--prompt", "color of sky?", "--max-new-tokens", "4"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "> color of sky?" in r.stdout, r.stderr
    # The merged model (plain torch, no kt) computes what kt computes with the adapter.
    from kt.integrations.transformers import patch_model
    from kt.training.sft.trainer import load_model

    merged_dir = merge_adapter(cfg, run / "adapter", tmp_path / "merged")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    model, _ = load_model("tiny", "float32")
    patch_model(model, method="BF16", expert_lora_path=run / "adapter")
    ids = torch.randint(4, 90, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = merged(ids).logits, model.eval()(ids).logits
    assert float((got - want).abs().max() / want.abs().max()) < 1e-3


def test_a_remote_code_model_trains_and_merges(tmp_path):
    """trust_remote_code: true on a Kimi-K2-style folder (kt.testing.remote_code: one module per expert):
    the run loads it without its experts, its adapters default to separate gate / up / down ones on
    each expert's Linear layers (PEFT's per-module LoRA), the loss falls, and the adapter merged into
    the model (saved with its modeling code) computes what kt computes with it."""
    import yaml
    from transformers import AutoModelForCausalLM

    from kt.integrations.transformers import patch_model
    from kt.integrations.transformers.preset import _tokenizer
    from kt.testing.remote_code import write_remote_model

    model_dir = write_remote_model(tmp_path / "kimi")
    _tokenizer().save_pretrained(model_dir)
    write_data(tmp_path / "data.jsonl")
    cfg = {"model": str(model_dir), "data": "data.jsonl", "output_dir": "run", "method": "BF16",
           "trust_remote_code": True, "lora": {"rank": 4, "alpha": 8},
           "train": {"steps": 8, "lr": 1e-2, "batch_size": 4, "max_length": 64, "seed": 1, "save_every": 4}}
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump(cfg))
    config = load_config(tmp_path / "sft.yaml")
    losses = train(config)
    assert losses[-1] < losses[0] - 0.1, losses
    adapter = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    assert adapter["target_modules"] == r".*\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)"
    merged = AutoModelForCausalLM.from_pretrained(merge_adapter(config, tmp_path / "run" / "adapter", tmp_path / "merged"),
                                                  trust_remote_code=True, dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True, dtype=torch.float32)
    patch_model(model, method="BF16", expert_lora_path=tmp_path / "run" / "adapter")
    ids = torch.randint(4, 90, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = merged(ids).logits, model.eval()(ids).logits
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5


def test_weight_path_run_trains_over_the_stored_codes(tmp_path):
    """weight_path: the frozen experts come from a kt convert folder of the model — the same INT8 codes
    kt makes at patch time, so the run is the one without weight_path, loss for loss; chat serves it."""
    import yaml

    from kt.integrations.transformers.preset import ensure_preset
    from kt.weights import convert

    converted = convert(ensure_preset(), tmp_path / "int8", method="INT8")
    runs = []
    for name, extra in (("own", {}), ("stored", {"weight_path": str(converted)})):
        path = write_config(tmp_path / name, steps=3)
        cfg = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**cfg, "method": "INT8", **extra}))
        config = load_config(path)
        assert config.weight_path == (converted if extra else None)
        runs.append(train(config))
    assert runs[0] == runs[1], runs
    kt = [sys.executable, "-c", "import sys; from kt_core.cli import main; sys.exit(main())"]
    r = subprocess.run(kt + ["sft", "chat", str(tmp_path / "stored" / "run"), "--prompt", "color of sky?",
                             "--max-new-tokens", "2"], capture_output=True, text=True)
    assert r.returncode == 0 and "> color of sky?" in r.stdout, r.stderr


def test_device_and_gpu_resident_experts(tmp_path):
    """num_gpu_experts: those experts train as torch's on `device` (here the CPU), the loss falls; a
    CUDA device on a host whose torch sees none is refused by name before the model loads."""
    import yaml

    path = write_config(tmp_path / "resident", steps=6)
    cfg = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**cfg, "num_gpu_experts": 2, "device": "cpu"}))
    config = load_config(path)
    assert (config.device, config.num_gpu_experts) == ("cpu", 2)
    losses = train(config)
    assert losses[-1] < losses[0] - 0.3, losses
    if not torch.cuda.is_available():
        path.write_text(yaml.safe_dump({**cfg, "device": "cuda:1"}))
        with pytest.raises(KTError, match="device: cuda:1, but torch sees no CUDA device here"):
            train(load_config(path))


def write_full_config(tmp: Path, num_gpu_experts: int = 0, **train) -> Path:
    """A train_experts run: the expert weights alone train (lora.rank defaults to 0)."""
    import yaml

    path = write_config(tmp, **train)
    cfg = yaml.safe_load(path.read_text())
    cfg["train_experts"] = True
    cfg["num_gpu_experts"] = num_gpu_experts
    del cfg["lora"]
    cfg["train"]["lr"] = 1e-3
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("num_gpu_experts", [0, 2])
def test_train_experts_run_trains_resumes_exports_and_chats(tmp_path, num_gpu_experts):
    """train_experts: the loss falls, run/model is the fine-tuned model (no adapter), a resumed run takes
    the uninterrupted run's steps, export writes a model folder (a checkpoint's weights with
    --checkpoint) whose plain-torch logits match kt's, and chat serves it. With GPU-resident experts
    (on the CPU device here) their weights train apart and reach the checkpoints and the model folder."""
    whole = train(load_config(write_full_config(tmp_path / "a", num_gpu_experts, steps=6)))
    assert whole[-1] < whole[0] - 0.3, whole
    cfg = load_config(write_full_config(tmp_path / "b", num_gpu_experts, steps=6))
    assert cfg.train_experts and cfg.lora.rank == 0
    first = train(cfg, stop_after=4)
    resumed = train(cfg, resume=True)
    assert resumed[:4] == first and resumed[4:] == pytest.approx(whole[4:], rel=1e-5), (resumed, whole)
    run = tmp_path / "b" / "run"
    assert (run / "model" / "config.json").is_file() and not (run / "adapter").exists()
    kt = [sys.executable, "-c", "import sys; from kt_core.cli import main; sys.exit(main())"]
    from transformers import AutoModelForCausalLM

    from kt.integrations.transformers import patch_model
    from kt.training.sft.trainer import load_model

    ids = torch.randint(4, 90, (2, 10), generator=torch.Generator().manual_seed(0))
    exported = {}
    for name, extra in (("final", []), ("step2", ["--checkpoint", "2"])):
        r = subprocess.run(kt + ["sft", "export", str(run), "--to", str(tmp_path / name), *extra], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        plain = AutoModelForCausalLM.from_pretrained(tmp_path / name).eval()
        with torch.no_grad():
            exported[name] = plain(ids).logits
    base, _ = load_model("tiny", "float32")
    with torch.no_grad():
        untrained = base.eval()(ids).logits
    assert not torch.allclose(exported["final"], exported["step2"]) and not torch.allclose(exported["final"], untrained)
    on_kt, _ = load_model(str(run / "model"), "float32")
    patch_model(on_kt, method="FP32")   # the trained float32 weights as they are (BF16 would round them)
    with torch.no_grad():
        got = on_kt.eval()(ids).logits
    want = exported["final"]
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    r = subprocess.run(kt + ["sft", "chat", str(run), "--prompt", "color of sky?", "--max-new-tokens", "4"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "> color of sky?" in r.stdout, r.stderr


def test_data_records(tmp_path):
    from kt.integrations.transformers.preset import load_preset

    _, tok = load_preset()
    examples = load_examples(write_data(tmp_path / "d.jsonl"), tok, max_length=64)
    assert len(examples) == 2 * len(PAIRS) + 1
    chat = examples[0]
    learned = tok.decode([t for t in chat.labels if t != IGNORE])
    assert learned == "blue\n"   # loss on the answer only: not the question, not the assistant header
    text = examples[-1]
    assert text.labels == text.input_ids


@pytest.mark.parametrize("line,message", [
    ("{not json", "line 1: not valid JSON"),
    ('["a"]', "line 1: expected a JSON object, got list"),
    ('{"prompt": "x"}', "line 1: expected a record with 'messages', 'instruction'/'output' or 'text'; got keys prompt"),
    ('{"messages": [{"role": "bot", "content": "x"}]}', "line 1: messages\\[0\\] must be"),
    ('{"messages": [{"role": "user", "content": "x"}]}', "line 1: no assistant message"),
    ('{"instruction": "x"}', "line 1: an instruction record needs string 'instruction' and 'output'"),
    ('{"text": ""}', "line 1: 'text' must be a non-empty string"),
])
def test_bad_data_names_the_line(tmp_path, line, message):
    from kt.integrations.transformers.preset import load_preset

    _, tok = load_preset()
    (tmp_path / "d.jsonl").write_text(line + "\n")
    with pytest.raises(KTError, match=message):
        load_examples(tmp_path / "d.jsonl", tok, max_length=64)


@pytest.mark.parametrize("dtype,setting,fast", [("float32", None, False), ("bfloat16", None, True),
                                                ("bfloat16", False, False), ("float32", True, True)])
def test_fast_activations_follow_the_model_dtype_unless_set(tmp_path, dtype, setting, fast):
    """null (the default): bf16 activations in the experts when the model computes in bf16 anyway."""
    import yaml

    path = write_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["dtype"] = dtype
    if setting is not None:
        cfg.setdefault("train", {})["fast_activations"] = setting
    path.write_text(yaml.safe_dump(cfg))
    assert load_config(path).fast_activations is fast


@pytest.mark.parametrize("edit,message", [
    ({"lr": 1}, "unknown setting\\(s\\) lr"),
    ({"train": {"lr": -1}}, "train.lr must be a positive number, got -1"),
    ({"train": {"steps": 0}}, "train.steps must be an integer >= 1, got 0"),
    ({"train": {"epochs": 3}}, "train has unknown setting\\(s\\) epochs"),
    ({"lora": {"rank": "eight"}}, "lora.rank must be an integer >= 1, got 'eight'"),
    ({"train": {"fast_activations": "yes"}}, "train.fast_activations must be true or false, got 'yes'"),
    ({"dtype": "float16"}, "dtype must be one of float32, bfloat16"),
    ({"train_experts": "yes"}, "train_experts must be true or false, got 'yes'"),
    ({"lora": {"rank": 0}}, "lora.rank must be an integer >= 1, got 0"),
    ({"data": "missing.jsonl"}, "data: .*missing.jsonl does not exist"),
    ({"model": "nowhere"}, "model: .*nowhere is not a model folder"),
    ({"output_dir": None}, "output_dir is required"),
    ({"weight_path": "nowhere"}, "weight_path: .*nowhere does not exist"),
    ({"device": "tpu"}, "device must be cpu, cuda or cuda:N, got 'tpu'"),
    ({"num_gpu_experts": -1}, "num_gpu_experts must be an integer >= 0, got -1"),
    ({"weight_path": "data.jsonl", "train_experts": True}, "weight_path: with train_experts the experts that train"),
])
def test_bad_config_names_the_field(tmp_path, edit, message):
    import yaml

    path = write_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    for k, v in edit.items():
        if isinstance(v, dict):
            cfg.setdefault(k, {}).update(v)
        else:
            cfg[k] = v
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(KTError, match=message):
        load_config(path)
