"""SGLang with kt-kernel, when it can run here: `kt run` hands the model to it with kt's settings
mapped onto SGLang's --kt-* flags instead of serving through transformers."""

from __future__ import annotations

import importlib.util
import sys

from kt_core.errors import KTError

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


# kt's format names that kt-kernel spells otherwise (kt-kernel-compat takes both; the real
# kt-kernel only its own).
KT_KERNEL_METHOD = {"INT4": "AMXINT4", "INT8": "AMXINT8"}


def sglang_method(method: str) -> str:
    method = method.upper()
    if method == "FP32":
        raise KTError("--kt-method FP32 has no kt-kernel method, so SGLang cannot serve it; use BF16")
    return KT_KERNEL_METHOD.get(method, method)


def command(s: ServeSettings, model_path: str) -> list[str]:
    """python -m sglang.launch_server with kt's settings as SGLang's --kt-* flags, then whatever
    followed `--` unchanged. kt-kernel reads the CPU experts from --kt-weight-path; without one,
    that is the model folder itself."""
    cmd = [sys.executable, "-m", "sglang.launch_server",
           "--model-path", model_path,
           "--served-model-name", str(s.served_model_name),
           "--host", s.host, "--port", str(s.port),
           "--kt-method", sglang_method(s.method),
           "--kt-weight-path", s.weight_path or model_path,
           "--kt-cpuinfer", str(s.cpuinfer),
           "--kt-threadpool-count", str(s.threadpool_count),
           "--kt-num-gpu-experts", str(s.num_gpu_experts),
           "--kt-max-deferred-experts-per-token", str(s.max_deferred_experts_per_token)]
    if s.numa_nodes is not None:
        cmd += ["--kt-numa-nodes", *map(str, s.numa_nodes)]
    for flag, value in (("--kt-gpu-experts-ratio", s.gpu_experts_ratio),
                        ("--kt-gpu-prefill-token-threshold", s.gpu_prefill_token_threshold),
                        ("--kt-expert-placement-strategy", s.expert_placement_strategy),
                        ("--kt-expert-lora-path", s.expert_lora_path)):
        if value is not None:
            cmd += [flag, str(value)]
    cmd += [flag for flag, on in (("--kt-enable-dynamic-expert-update", s.dynamic_expert_update),
                                  ("--record-kt-gpu-expert-distribution", s.record_gpu_expert_distribution),
                                  ("--trust-remote-code", s.trust_remote_code)) if on]
    return cmd + list(s.sglang_args)
