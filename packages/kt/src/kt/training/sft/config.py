"""`kt sft`'s run configuration, a YAML file:

    model: tiny                 # a Hugging Face model folder, or "tiny" (kt demo's built-in preset)
    data: train.jsonl           # chat ("messages"), instruction ("instruction"/"input"/"output") or "text" records
    output_dir: runs/tiny-lora  # checkpoints, the final adapter (PEFT format), log.jsonl
    method: BF16                # kt's format for the frozen experts (BF16, INT8, INT4, ...)
    weight_path: null           # the frozen experts as stored instead of from the model: a checkpoint's own
                                # FP8 / INT4 / NVFP4 codes (method FP8, RAWINT4, ...), a kt convert folder, a GGUF
    group_size: 0               # INT4 only (0: kt's default); zero_point: false
    dtype: float32              # the torch parts of the model (float32 or bfloat16)
    device: cpu                 # where they run (cpu, cuda, cuda:N); the routed experts and their LoRA stay on kt
    num_gpu_experts: 0          # experts per layer kept on `device`, computed by torch with their LoRA rows
    trust_remote_code: false    # true: run the modeling code the model folder ships (Kimi-K2, DeepSeek's own)
    lora: {rank: 8, alpha: 16, target: [gate_up, down]}   # or [gate, up, down]: separate gate and up adapters
                                # (the default for models holding one module per expert: remote-code DeepSeek /
                                # Kimi-K2, whose PEFT adapters are per expert Linear layer)
    train_experts: false        # true: the experts' own weights train too (BF16/FP32; lora.rank then defaults
                                # to 0, the weights alone); the run's model/ folder holds the result
    train: {steps: 100, lr: 2.0e-4, batch_size: 4, max_length: 512, seed: 0, save_every: 50,
            warmup_steps: 0, weight_decay: 0.0, recompute: false, fast_activations: null}
                                # fast_activations: bf16 activations and (BF16 experts) bf16 gradients in the
                                # experts; null: on with dtype bfloat16 (what the model computes anyway), else off

Relative paths are relative to the file. Every field is checked: an error names the field, what it
expected and what it found; an unknown field is an error (a misspelt one would silently do nothing).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from kt_core.errors import KTError

PRESET = "tiny"
DTYPES = ("float32", "bfloat16")


@dataclass
class LoraSettings:
    rank: int = 8
    alpha: float = 16.0
    target: tuple[str, ...] | None = None   # None: by how the model holds its experts (patch_model's default)


@dataclass
class TrainSettings:
    steps: int = 100
    lr: float = 2e-4
    batch_size: int = 4
    max_length: int = 512
    seed: int = 0
    save_every: int = 50
    warmup_steps: int = 0
    weight_decay: float = 0.0
    recompute: bool = False
    fast_activations: bool | None = None   # None: on with dtype bfloat16 (SFTConfig.fast_activations)


@dataclass
class SFTConfig:
    model: str
    data: Path
    output_dir: Path
    method: str = "BF16"
    weight_path: Path | None = None
    group_size: int = 0
    zero_point: bool = False
    dtype: str = "float32"
    device: str = "cpu"
    num_gpu_experts: int = 0
    train_experts: bool = False
    trust_remote_code: bool = False
    lora: LoraSettings = field(default_factory=LoraSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    source: Path | None = None   # the YAML file it came from

    @property
    def fast_activations(self) -> bool:
        """bf16 activations in the experts: as set, or (null) when the model computes in bf16 anyway."""
        chosen = self.train.fast_activations
        return self.dtype == "bfloat16" if chosen is None else chosen

    def as_dict(self) -> dict:
        return {"model": self.model, "data": str(self.data), "output_dir": str(self.output_dir), "method": self.method,
                "weight_path": None if self.weight_path is None else str(self.weight_path),
                "group_size": self.group_size, "zero_point": self.zero_point, "dtype": self.dtype,
                "device": self.device, "num_gpu_experts": self.num_gpu_experts, "train_experts": self.train_experts,
                "trust_remote_code": self.trust_remote_code,
                "lora": {"rank": self.lora.rank, "alpha": self.lora.alpha,
                         "target": None if self.lora.target is None else list(self.lora.target)},
                "train": dict(vars(self.train))}


def _where(path: Path, key: str) -> str:
    return f"{path}: {key}"


def _check(path: Path, key: str, value, kind: str, ok: bool):
    if not ok:
        raise KTError(f"{_where(path, key)} must be {kind}, got {value!r}")
    return value


def _int(path, key, value, least: int):
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= least
    return _check(path, key, value, f"an integer >= {least}", ok)


def _number(path, key, value, positive: bool):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > 0 if positive else value >= 0)
    return float(_check(path, key, value, "a positive number" if positive else "a number >= 0", ok))


def _bool(path, key, value):
    return _check(path, key, value, "true or false", isinstance(value, bool))


def _section(path: Path, key: str, raw, cls):
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise KTError(f"{_where(path, key)} must be a mapping of settings, got {raw!r}")
    known = set(vars(cls()))
    unknown = sorted(set(raw) - known)
    if unknown:
        raise KTError(f"{_where(path, key)} has unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return raw


def load_config(path: str | Path, need_data: bool = True) -> SFTConfig:
    """The checked config; need_data=False for commands that only use the model (export, chat)."""
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise KTError(f"{path}: no such config file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise KTError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(raw, dict):
        raise KTError(f"{path}: expected a mapping of settings (model, data, output_dir, ...), got {type(raw).__name__}")
    known = {"model", "data", "output_dir", "method", "weight_path", "group_size", "zero_point", "dtype", "device",
             "num_gpu_experts", "train_experts", "trust_remote_code", "lora", "train"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise KTError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    for key in ("model", "data", "output_dir"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise KTError(f"{_where(path, key)} is required: a {'path' if key != 'model' else 'model folder or tiny'}, "
                          f"got {raw.get(key)!r}")
    base = path.parent

    def resolve(p: str) -> Path:
        q = Path(p).expanduser()
        return (q if q.is_absolute() else base / q).resolve()

    model = raw["model"] if raw["model"] == PRESET else str(resolve(raw["model"]))
    if model != PRESET and not (Path(model) / "config.json").is_file():
        raise KTError(f"{_where(path, 'model')}: {model} is not a model folder (no config.json) and not {PRESET!r}")
    data = resolve(raw["data"])
    if need_data and not data.is_file():
        raise KTError(f"{_where(path, 'data')}: {data} does not exist")
    method = raw.get("method", "BF16")
    _check(path, "method", method, "a kt method name (BF16, INT8, INT4, ...)", isinstance(method, str) and method)
    weight_path = raw.get("weight_path")
    if weight_path is not None:
        _check(path, "weight_path", weight_path, "a path (a checkpoint, kt convert folder or GGUF file)",
               isinstance(weight_path, str) and weight_path)
        weight_path = resolve(weight_path)
        if not weight_path.exists():
            raise KTError(f"{_where(path, 'weight_path')}: {weight_path} does not exist")
    dtype = raw.get("dtype", "float32")
    _check(path, "dtype", dtype, f"one of {', '.join(DTYPES)}", dtype in DTYPES)
    device = raw.get("device", "cpu")
    _check(path, "device", device, "cpu, cuda or cuda:N", isinstance(device, str) and re.fullmatch(r"cpu|cuda(:\d+)?", device))
    num_gpu_experts = _int(path, "num_gpu_experts", raw.get("num_gpu_experts", 0), 0)
    train_experts = _bool(path, "train_experts", raw.get("train_experts", False))
    trust_remote_code = _bool(path, "trust_remote_code", raw.get("trust_remote_code", False))
    if train_experts and weight_path is not None:
        raise KTError(f"{_where(path, 'weight_path')}: with train_experts the experts that train are the model's own "
                      "weights; weight_path gives frozen experts for LoRA over them (drop one of the two)")
    lora_raw = _section(path, "lora", raw.get("lora"), LoraSettings)
    lora = LoraSettings(rank=0 if train_experts else LoraSettings.rank)
    if isinstance(lora_raw, dict):
        if "rank" in lora_raw:   # 0 (no adapters) when the expert weights train
            lora.rank = _int(path, "lora.rank", lora_raw["rank"], 0 if train_experts else 1)
        if "alpha" in lora_raw:
            lora.alpha = _number(path, "lora.alpha", lora_raw["alpha"], positive=True)
        if lora_raw.get("target") is not None:   # null: by how the model holds its experts
            t = lora_raw["target"]
            ok = isinstance(t, list) and t and all(isinstance(x, str) for x in t)
            lora.target = tuple(_check(path, "lora.target", t, "a list of gate_up, gate, up, down", ok))
    train_raw = _section(path, "train", raw.get("train"), TrainSettings)
    train = TrainSettings()
    if isinstance(train_raw, dict):
        least = {"steps": 1, "batch_size": 1, "max_length": 2, "seed": 0, "save_every": 1, "warmup_steps": 0}
        for key, value in train_raw.items():
            if key in least:
                setattr(train, key, _int(path, f"train.{key}", value, least[key]))
            elif key in ("lr",):
                train.lr = _number(path, "train.lr", value, positive=True)
            elif key == "weight_decay":
                train.weight_decay = _number(path, "train.weight_decay", value, positive=False)
            elif key == "fast_activations" and value is None:
                train.fast_activations = None
            elif key in ("recompute", "fast_activations"):
                setattr(train, key, _bool(path, f"train.{key}", value))
    return SFTConfig(model=model, data=data, output_dir=resolve(raw["output_dir"]), method=method,
                     weight_path=weight_path, device=device, num_gpu_experts=num_gpu_experts,
                     group_size=_int(path, "group_size", raw.get("group_size", 0), 0),
                     zero_point=_bool(path, "zero_point", raw.get("zero_point", False)), dtype=dtype,
                     train_experts=train_experts, trust_remote_code=trust_remote_code, lora=lora,
                     train=train, source=path)
