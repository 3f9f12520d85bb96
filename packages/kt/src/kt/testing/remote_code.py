"""A tiny remote-code MoE model folder (config.json with an auto_map, its modeling files beside the
weights) of the DeepSeek-V3 / Kimi-K2 kind, for tests: the layout transformers loads only with
trust_remote_code=True, as it loads Kimi-K2 and DeepSeek's own modeling code from the hub.

    folder = write_remote_model(tmp_path)                 # model_type kimi_k2, bf16 weights
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

CODE = Path(__file__).with_name("remote_deepseek")
FILES = ("configuration_deepseek.py", "modeling_deepseek.py")
AUTO_MAP = {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
            "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}


def write_remote_model(folder: str | os.PathLike, *, model_type: str = "kimi_k2", seed: int = 0,
                       dtype: str = "bfloat16", **config) -> Path:
    """Write a seeded tiny model (kt.testing.remote_deepseek's defaults, overridden by `config`) with
    its modeling code, as a hub folder of a remote-code model is; returns the folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copyfile(CODE / name, out / name)
    (out / "config.json").write_text(json.dumps({"model_type": model_type, "auto_map": AUTO_MAP,
                                                 "architectures": ["DeepseekV3ForCausalLM"], **config}))
    cfg = AutoConfig.from_pretrained(out, trust_remote_code=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=True).to(getattr(torch, dtype))
    model.save_pretrained(out)
    return out
