"""What `kt run` serves and how: the model, kt's expert settings, the host's thread defaults."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from kt_core.errors import KTError

PRESET_NAME = "tiny"
# SGLang's --kt-expert-placement-strategy choices.
PLACEMENT_STRATEGIES = ("frequency", "front-loading", "uniform", "random")


@dataclass(frozen=True)
class ServeSettings:
    model: str = PRESET_NAME               # a Hugging Face model folder, or "tiny" (the built-in preset)
    method: str = "BF16"
    weight_path: str | None = None         # a kt convert folder or a checkpoint read as stored
    cpuinfer: int | None = None            # kt pool threads; None: kt doctor's recommendation
    threadpool_count: int | None = None    # thread groups; None: kt doctor's recommendation
    num_gpu_experts: int = 0
    max_deferred_experts_per_token: int = 0
    fast_activations: bool | None = None   # True: one int8 activation pass / bf16 (kt-kernel's precision);
                                           # None: two passes, one on GGUF (llama.cpp's activation blocks)
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None   # None: "tiny", or the folder's name
    max_queue: int = 64                    # requests waiting behind the running one
    trust_remote_code: bool = False        # run the modeling code a model folder ships (Kimi-K2, DeepSeek's own)
    threads_reason: str = ""
    pools_reason: str = ""
    # SGLang's other --kt-* flags (kvcache-ai's server_args.py), passed on when SGLang serves.
    numa_nodes: tuple[int, ...] | None = None
    gpu_experts_ratio: float | None = None
    gpu_prefill_token_threshold: int | None = None
    expert_placement_strategy: str | None = None
    dynamic_expert_update: bool = False
    record_gpu_expert_distribution: bool = False
    expert_lora_path: str | None = None    # a PEFT adapter of the routed experts, served with them
    sglang_args: tuple[str, ...] = ()      # everything after `--`, for SGLang unchanged

    def sglang_only(self) -> list[str]:
        """The flags given that only SGLang serves (kt's transformers server has no use for them)."""
        given = [("--kt-numa-nodes", self.numa_nodes is not None),
                 ("--kt-gpu-experts-ratio", self.gpu_experts_ratio is not None),
                 ("--kt-gpu-prefill-token-threshold", self.gpu_prefill_token_threshold is not None),
                 ("--kt-expert-placement-strategy", self.expert_placement_strategy is not None),
                 ("--kt-enable-dynamic-expert-update", self.dynamic_expert_update),
                 ("--record-kt-gpu-expert-distribution", self.record_gpu_expert_distribution),
                 ("arguments after --", bool(self.sglang_args))]
        return [flag for flag, on in given if on]

    @property
    def is_preset(self) -> bool:
        return self.model == PRESET_NAME

    def resolved(self) -> ServeSettings:
        """Checked, with the host defaults (kt doctor's recommendations) and the served name filled in."""
        from kt_core.cli.doctor import recommended

        if not self.is_preset and not (Path(self.model) / "config.json").is_file():
            raise KTError(f"{self.model} is neither a model folder (no config.json in it) nor the built-in preset "
                          f"{PRESET_NAME!r}")
        for name in ("num_gpu_experts", "max_deferred_experts_per_token"):
            if getattr(self, name) < 0:
                raise KTError(f"--kt-{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        for name in ("cpuinfer", "threadpool_count"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise KTError(f"--kt-{name.replace('_', '-')} must be >= 1, got {value}")
        if self.gpu_experts_ratio is not None and not 0.0 <= self.gpu_experts_ratio <= 1.0:
            raise KTError(f"--kt-gpu-experts-ratio is a fraction of all experts, in [0, 1]; got {self.gpu_experts_ratio}")
        if self.gpu_prefill_token_threshold is not None and self.gpu_prefill_token_threshold < 0:
            raise KTError(f"--kt-gpu-prefill-token-threshold must be >= 0, got {self.gpu_prefill_token_threshold}")
        if self.expert_placement_strategy not in (None, *PLACEMENT_STRATEGIES):
            raise KTError(f"--kt-expert-placement-strategy {self.expert_placement_strategy!r}: choose one of "
                          f"{', '.join(PLACEMENT_STRATEGIES)}")
        if not 0 <= self.port < 65536:
            raise KTError(f"--port must be in 1..65535 (or 0 for any free port), got {self.port}")
        if self.max_queue < 1:
            raise KTError(f"--max-queue must be >= 1, got {self.max_queue}")
        self._check_method()
        rec = recommended()
        threads, threads_reason = self.cpuinfer, "given"
        if threads is None:
            threads, threads_reason = rec["cpuinfer_threads"], "kt doctor: " + rec["cpuinfer_threads_reason"]
        pools, pools_reason = self.threadpool_count, "given"
        if pools is None:
            pools, pools_reason = rec["threadpool_count"], "kt doctor: " + rec["threadpool_count_reason"]
        if self.numa_nodes is not None and len(self.numa_nodes) != pools:
            raise KTError(f"--kt-numa-nodes lists {len(self.numa_nodes)} node(s), one per thread pool, and "
                          f"--kt-threadpool-count is {pools} ({pools_reason})")
        name = self.served_model_name or (PRESET_NAME if self.is_preset else Path(self.model).resolve().name)
        return dataclasses.replace(self, method=self.method.upper(), cpuinfer=threads, threadpool_count=pools,
                                   served_model_name=name, threads_reason=threads_reason, pools_reason=pools_reason)

    def _check_method(self) -> None:
        """--kt-method against the installed backends and --kt-weight-path, before any loading."""
        from kt_core.backends.selection import canonical_method, selector

        from ..weights.converted import MANIFEST, read_manifest

        method = canonical_method(self.method)
        known = selector().methods()
        if method not in known:
            raise KTError(f"--kt-method {self.method}: not a method of any installed backend; they provide "
                          f"{', '.join(sorted(known))}")
        if self.weight_path and (Path(self.weight_path) / MANIFEST).is_file():
            stored = str(read_manifest(Path(self.weight_path)).get("method", "")).upper()
            if stored != method:
                raise KTError(f"--kt-weight-path {self.weight_path} holds {stored} experts (a kt convert folder); "
                              f"run with --kt-method {stored}, or convert the model again with --method {method}")

    def _experts_line(self) -> str:
        from ..weights.loader import expert_source

        lean = None if self.is_preset else expert_source(self.model, self.method, self.weight_path,
                                                          self.num_gpu_experts)
        if lean is not None:   # the engine then loads the model without its experts (load_model)
            source = "the model's files" if self.weight_path is None else str(self.weight_path)
            return f"{self.method} read from {source} (transformers loads the rest of the model only)"
        return f"{self.method}" + (f" from {self.weight_path}" if self.weight_path else " packed from the model's own weights")

    def check_expert_lora(self) -> None:
        """kt's server takes --kt-expert-lora-path as a PEFT adapter folder of the experts (SGLang reads
        its own): refused before the model loads when it is not one, or with deferral."""
        if self.expert_lora_path is None:
            return
        from ..training.peft_format import adapter_settings

        adapter_settings(self.expert_lora_path)
        if self.max_deferred_experts_per_token:
            raise KTError("--kt-max-deferred-experts-per-token with --kt-expert-lora-path: kt's experts with "
                          "adapters run in their own layer (no deferral)")

    def _lora_line(self) -> str:
        from ..training.peft_format import adapter_settings

        rank, alpha, targets = adapter_settings(self.expert_lora_path)
        return f"{self.expert_lora_path} (PEFT adapter: rank {rank}, alpha {alpha:g}, on {', '.join(targets)})"

    def describe(self) -> list[tuple[str, str]]:
        """(setting, value) rows for --dry-run and the start-up banner."""
        return [
            ("model", self.model + (" (the built-in tiny Qwen3-MoE preset)" if self.is_preset else "")),
            ("served as", str(self.served_model_name)),
            *([("modeling code", "the model folder's own (--trust-remote-code)")] if self.trust_remote_code else []),
            ("experts", self._experts_line()),
            ("cpuinfer threads", f"{self.cpuinfer} ({self.threads_reason})"),
            ("threadpool count", f"{self.threadpool_count} ({self.pools_reason})"),
            ("GPU-resident experts", f"{self.num_gpu_experts} per layer (torch on the model's device)"),
            ("deferred experts", f"{self.max_deferred_experts_per_token} per token"),
            *([("expert LoRA", self._lora_line())] if self.expert_lora_path is not None else []),
            ("activations", "fast: one int8 pass, bf16 for BF16/FP8 (kt-kernel's precision)" if self.fast_activations
             else "f32-exact (two int8 passes; split bf16)" if self.fast_activations is False
             else "f32-exact (two int8 passes; split bf16); GGUF: llama.cpp's activation blocks (one int8 pass)"),
            ("listen", f"http://{self.host}:{self.port}/v1"),
            ("scheduling", f"one request at a time, FIFO queue of up to {self.max_queue} waiting (503 beyond)"),
        ]
