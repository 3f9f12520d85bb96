"""The model behind `kt run`, and the one worker thread that generates with it.

A patched model runs one forward at a time (its kt layers, scratch and deferral hand-off are per
model), so requests wait in a FIFO queue and a single worker generates each to its end before
the next starts: no batching. A request's tokens come back as events on its own queue, so
concurrent clients never see each other's output; a request whose client went away is
cancelled and the worker stops it at the next token.
"""

from __future__ import annotations

import inspect
import queue
import secrets
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kt_core.errors import KTError

from .settings import ServeSettings
from .text import TextStream

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class Unavailable(KTError):
    """The engine cannot take the request now (queue full, shutting down): HTTP 503."""


@dataclass
class Job:
    """One generation request. Events on `events`: ("delta", text), then ("done", finish_reason)
    or ("error", http_status, message)."""
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    events: queue.Queue = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    completion_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def cancel(self) -> None:
        self.cancelled.set()


class Engine:
    def __init__(self, model, tokenizer, settings: ServeSettings, patch=None, log: Callable[[str], None] = print):
        import torch

        self.model, self.tokenizer, self.settings, self.patch, self.log = model, tokenizer, settings, patch, log
        self.name = settings.served_model_name
        self.created = int(time.time())
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        text_config = model.config.get_text_config()     # the config itself, or a multimodal model's text part
        self.context_length = int(getattr(text_config, "max_position_embeddings", 0) or 0) or None
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos = eos
        # transformers 5 renamed the KV cache argument and output field from past_key_values to cache.
        self._cache_key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._torch = torch
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._closing = False
        self.running: Job | None = None
        self.counts = {"served": 0, "cancelled": 0, "failed": 0}
        self._worker = threading.Thread(target=self._work, name="kt-generate", daemon=True)
        self._worker.start()

    @classmethod
    def load(cls, settings: ServeSettings, log: Callable[[str], None] = print) -> Engine:
        """Configure kt's pool, load the model and tokenizer (the preset or a folder), patch its
        experts onto kt and start the worker. Refuses a model kt cannot patch before loading it."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from kt_core.wrapper import KTMoEWrapper

        from ..integrations.transformers import load_model, patch_model
        from ..integrations.transformers.patch import _family
        from ..integrations.transformers.preset import load_preset
        from ..weights.loader import expert_source

        settings.check_expert_lora()
        # The same mapping KTMoEWrapper(cpuinfer_threads=, threadpool_count=) uses, before any kt layer exists.
        KTMoEWrapper._configure_pool(settings.cpuinfer, settings.threadpool_count)
        start = time.perf_counter()
        lean = None   # where kt reads the experts from when the model was loaded without them
        if settings.is_preset:
            model, tokenizer = load_preset()
        else:
            remote = settings.trust_remote_code
            config = AutoConfig.from_pretrained(settings.model, trust_remote_code=remote)
            _family(getattr(config, "model_type", None) or "")   # unknown or unsupported family: refused now
            # Checked first: without these files transformers 5 quietly builds an empty tokenizer.
            if not any((Path(settings.model) / f).is_file() for f in TOKENIZER_FILES):
                raise KTError(f"{settings.model} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); kt run needs one")
            try:
                tokenizer = AutoTokenizer.from_pretrained(settings.model, trust_remote_code=remote)
            except (OSError, ValueError) as exc:
                raise KTError(f"{settings.model}'s tokenizer does not load: {exc}") from None
            # The experts go to kt: where it reads them from the checkpoint (or weight_path), transformers
            # loads the rest only — the memory of the non-expert weights, not the whole model's.
            lean = expert_source(settings.model, settings.method, settings.weight_path, settings.num_gpu_experts)
            if lean is not None:
                model = load_model(settings.model, dtype="auto", trust_remote_code=remote).eval()
            else:
                model = AutoModelForCausalLM.from_pretrained(settings.model, dtype="auto",
                                                             trust_remote_code=remote).eval()
        weight_path = settings.weight_path if lean is None else lean
        patch = patch_model(model, method=settings.method, weight_path=weight_path,
                            num_gpu_experts=settings.num_gpu_experts,
                            max_deferred_experts_per_token=settings.max_deferred_experts_per_token,
                            fast_activations=settings.fast_activations, expert_lora_path=settings.expert_lora_path)
        how = (f"read its experts from {weight_path} into kt" if lean is not None else
               f"moved its experts onto kt ({patch.freed_bytes / 2**20:.1f} MiB of torch expert weights freed)")
        lora = "" if settings.expert_lora_path is None else f", expert LoRA from {settings.expert_lora_path}"
        log(f"loaded {settings.model} and {how} ({patch.method} on {', '.join(patch.backends)}, "
            f"{len(patch.layers)} MoE layers{lora}) in {time.perf_counter() - start:.1f} s")
        return cls(model, tokenizer, settings, patch, log)

    # -- prompts --------------------------------------------------------------------------
    def chat_prompt(self, messages: list[dict]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{self.name}'s tokenizer has no chat template; use /v1/completions with a plain prompt")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):     # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def text_prompt(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer(text).input_ids]

    # -- the queue ------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._lock:
            if self._closing:
                raise Unavailable("the server is shutting down")
            if self._queue.qsize() >= self.settings.max_queue:
                raise Unavailable(f"{self._queue.qsize()} requests are already waiting (--max-queue "
                                  f"{self.settings.max_queue}); retry later")
            self._queue.put(job)

    @property
    def closing(self) -> bool:
        return self._closing

    def status(self) -> dict:
        return {"queued": self._queue.qsize(), "running": int(self.running is not None), **self.counts}

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new requests, end the waiting ones (503) and the running one, stop the worker."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.events.put(("error", 503, "the server is shutting down"))
        running = self.running
        if running is not None:
            running.cancel()
        self._queue.put(None)
        self._worker.join(timeout)
        if not self._worker.is_alive():
            # Release the model (and kt's packed experts) now, not whenever the last reference goes.
            self.model = self.patch = None

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.cancelled.is_set():          # its client left while it waited
                self.counts["cancelled"] += 1
                continue
            self.running = job
            try:
                finish = self._generate(job)
            except Exception as exc:            # one bad request must not stop the server
                self.counts["failed"] += 1
                self.log(f"generation failed: {traceback.format_exc()}")
                job.events.put(("error", 500, f"generation failed: {type(exc).__name__}: {exc}"))
            else:
                if finish is None:
                    self.counts["cancelled"] += 1
                    why = "the server is shutting down" if self._closing else "the request was cancelled"
                    job.events.put(("error", 503, why))
                else:
                    self.counts["served"] += 1
                    job.events.put(("done", finish))
            finally:
                self.running = None

    # -- generation -----------------------------------------------------------------------
    def _generate(self, job: Job) -> str | None:
        """Generate for one job with a KV cache; returns the finish reason ("stop", "length"),
        or None if it was cancelled."""
        torch = self._torch
        gen = torch.Generator().manual_seed(job.seed if job.seed is not None else secrets.randbits(63))
        stream = TextStream(self.tokenizer, job.stop)
        inputs = torch.tensor([job.prompt_ids], device=self.device)
        past, finish = None, "length"
        with torch.inference_mode():
            for _ in range(job.max_tokens):
                if job.cancelled.is_set():
                    return None
                out = self.model(input_ids=inputs, use_cache=True, **({self._cache_key: past} if past is not None else {}))
                past = out[self._cache_key]
                token = self._pick(out.logits[0, -1].float().cpu(), job, gen)
                job.completion_tokens += 1
                if token in self.eos and not job.ignore_eos:
                    finish = "stop"
                    break
                delta = stream.push(token)
                if delta:
                    job.events.put(("delta", delta))
                if stream.stopped:
                    return "stop"
                inputs = torch.tensor([[token]], device=self.device)
        rest = stream.flush()
        if rest:
            job.events.put(("delta", rest))
        return finish

    def _pick(self, logits, job: Job, gen) -> int:
        torch = self._torch
        if job.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / job.temperature, dim=-1)
        if job.top_p < 1:
            # Nucleus: keep the most likely tokens whose mass before them is below top_p.
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, 0) - sorted_probs < job.top_p
            probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=gen))
