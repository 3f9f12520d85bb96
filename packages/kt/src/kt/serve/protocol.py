"""OpenAI's request bodies, checked and turned into Jobs, and its response objects.

Whatever kt run cannot honour is refused with a 400 that names the field, never ignored:
n > 1, logprobs, tools, echo, best_of, suffix, non-text message parts, several prompts.
Fields it does not know are ignored, as OpenAI-compatible servers do; `ignore_eos` (vLLM's and
SGLang's extension) generates exactly max_tokens tokens.
"""

from __future__ import annotations

import secrets
import time

from .engine import Engine, Job


class RequestError(Exception):
    """A request the server refuses: status, a message saying why, the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def _bad(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, param)


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise _bad(f"{key} must be a number in [{lo}, {hi}], got {value!r}", key)
    return float(value)


def _integer(body: dict, key: str, lo: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise _bad(f"{key} must be an integer >= {lo}, got {value!r}", key)
    return value


def _refuse_unsupported(body: dict) -> None:
    if body.get("n", 1) != 1:
        raise _bad(f"n must be 1: kt run returns one choice per request, got {body['n']!r}", "n")
    for key in ("tools", "functions"):
        if body.get(key):
            raise _bad(f"{key} are not supported by kt run", key)
    if body.get("logprobs") not in (None, False, 0):
        raise _bad("logprobs are not supported by kt run", "logprobs")
    if body.get("echo"):
        raise _bad("echo is not supported by kt run", "echo")
    if body.get("best_of", 1) not in (None, 1):
        raise _bad("best_of must be 1", "best_of")
    if body.get("suffix"):
        raise _bad("suffix (insertion) is not supported by kt run", "suffix")


def check_model(body: dict, engine: Engine) -> None:
    model = body.get("model")
    if model is not None and model != engine.name:
        raise RequestError(404, f"the model {model!r} does not exist; this server serves {engine.name!r}", "model",
                           "model_not_found")


def _stream_options(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise _bad(f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad("stream_options must be an object", "stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise _bad(f"stream_options.include_usage must be true or false, got {usage!r}", "stream_options")
    return bool(stream), usage


def _job(body: dict, engine: Engine, prompt_ids: list[int]) -> Job:
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop)):
        raise _bad(f"stop must be a string or a list of up to 4 strings, got {stop!r}", "stop")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key, 1)
    ctx = engine.context_length
    if ctx is not None:
        room = ctx - len(prompt_ids)
        if room < 1:
            raise _bad(f"this model's context is {ctx} tokens and the prompt has {len(prompt_ids)}: no room to "
                       "generate", "messages" if "messages" in body else "prompt")
        if max_tokens is None:
            max_tokens = room
        if max_tokens > room:
            raise _bad(f"this model's context is {ctx} tokens; the prompt has {len(prompt_ids)} and {max_tokens} "
                       "more were asked for", key)
    elif max_tokens is None:
        raise _bad(f"the model's config gives no context length; give {key}", key)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _bad(f"seed must be an integer, got {seed!r}", "seed")
    if not prompt_ids:
        raise _bad("the prompt is empty (no tokens)")
    ignore_eos = body.get("ignore_eos", False)     # vLLM's and SGLang's extension: fixed-length replies
    if not isinstance(ignore_eos, bool):
        raise _bad(f"ignore_eos must be true or false, got {ignore_eos!r}", "ignore_eos")
    # top_p 0 keeps only the most likely token.
    return Job(prompt_ids=prompt_ids, max_tokens=max_tokens, temperature=_number(body, "temperature", 1.0, 0, 2),
               top_p=_number(body, "top_p", 1.0, 0, 1) or 1e-9, seed=None if seed is None else seed % 2**63, stop=stop,
               ignore_eos=ignore_eos)


def _message_text(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"messages[{i}].content: only text parts are supported, got {part!r}", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts, got {content!r}", "messages")


def chat_request(body: dict, engine: Engine) -> tuple[Job, bool, bool]:
    """(job, stream, include_usage) of a /v1/chat/completions body."""
    check_model(body, engine)
    _refuse_unsupported(body)
    stream, usage = _stream_options(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {role, content} objects", "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise _bad(f"messages[{i}] must be an object with role system, developer, user or assistant, got {m!r}",
                       "messages")
        role = "system" if m["role"] == "developer" else m["role"]
        clean.append({"role": role, "content": _message_text(m.get("content"), i)})
    try:
        ids = engine.chat_prompt(clean)
    except ValueError as exc:
        raise _bad(str(exc), "messages") from None
    except Exception as exc:     # the model's own Jinja template may refuse a conversation (roles, order)
        raise _bad(f"the model's chat template refused these messages: {type(exc).__name__}: {exc}", "messages") from None
    return _job(body, engine, ids), stream, usage


def completion_request(body: dict, engine: Engine) -> tuple[Job, bool, bool]:
    """(job, stream, include_usage) of a /v1/completions body: one prompt, text or token ids."""
    check_model(body, engine)
    _refuse_unsupported(body)
    stream, usage = _stream_options(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = engine.text_prompt(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = engine.vocab_size
        if not all(0 <= t < vocab for t in prompt):
            raise _bad(f"prompt token ids must be in [0, {vocab})", "prompt")
        ids = list(prompt)
    else:
        raise _bad(f"prompt must be one string or one list of token ids (kt run serves one prompt per request), got "
                   f"{str(prompt)[:80]!r}", "prompt")
    return _job(body, engine, ids), stream, usage


# -- responses ----------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(job: Job) -> dict:
    return {"prompt_tokens": job.prompt_tokens, "completion_tokens": job.completion_tokens,
            "total_tokens": job.prompt_tokens + job.completion_tokens}


def chat_response(rid: str, model: str, text: str, finish: str, job: Job) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish}],
            "usage": usage(job)}


def chat_chunk(rid: str, model: str, delta: dict, finish: str | None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def completion_response(rid: str, model: str, text: str, finish: str, job: Job) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], "usage": usage(job)}


def completion_chunk(rid: str, model: str, text: str, finish: str | None) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


def usage_chunk(rid: str, model: str, obj: str, job: Job) -> dict:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [], "usage": usage(job)}
