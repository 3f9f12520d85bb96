"""SGLang with kt-kernel, when it can run here: `kt run` hands the model to it with kt's settings
mapped onto SGLang's --kt-* flags instead of serving through transformers."""

from __future__ import annotations

import importlib.util
import sys

from .settings import ServeSettings


def available() -> tuple[bool, str]:
    """Whether SGLang can serve here (it is installed and torch sees a CUDA GPU), and why not."""
    if importlib.util.find_spec("sglang") is None:
        return False, "SGLang is not installed"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "SGLang is installed but torch sees no CUDA GPU"
    return True, "SGLang is installed and torch sees a CUDA GPU"


def command(s: ServeSettings, model_path: str) -> list[str]:
    """python -m sglang.launch_server with kt's settings as SGLang's --kt-* flags. kt-kernel reads
    the CPU experts from --kt-weight-path; without one, that is the model folder itself."""
    return [sys.executable, "-m", "sglang.launch_server",
            "--model-path", model_path,
            "--served-model-name", str(s.served_model_name),
            "--host", s.host, "--port", str(s.port),
            "--kt-method", s.method,
            "--kt-weight-path", s.weight_path or model_path,
            "--kt-cpuinfer", str(s.cpuinfer),
            "--kt-threadpool-count", str(s.threadpool_count),
            "--kt-num-gpu-experts", str(s.num_gpu_experts),
            "--kt-max-deferred-experts-per-token", str(s.max_deferred_experts_per_token)]
