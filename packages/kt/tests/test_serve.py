"""kt run's OpenAI-compatible server: the tiny preset served over loopback, driven by the openai
package and plain httpx (and a raw socket where a client must misbehave)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch", reason="kt run needs torch")
pytest.importorskip("transformers", reason="kt run needs transformers")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from serving import tiny_server  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from kt.cli.app import app  # noqa: E402
from kt_core.errors import KTError  # noqa: E402

GREEDY = dict(temperature=0, max_tokens=16)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def server(cache):
    with tiny_server(cache) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url.removesuffix("/v1"), timeout=30) as c:
        yield c


def chat(client, text, **kw):
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}], **{**GREEDY, **kw})


def test_health_and_models(http):
    h = http.get("/health").json()
    assert h["status"] == "ok" and h["model"] == "tiny" and h["running"] == 0
    models = http.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["max_model_len"] == 2048
    assert http.get("/v1/models/tiny").json()["id"] == "tiny"
    r = http.get("/v1/models/gpt-4")
    assert r.status_code == 404 and "'gpt-4' does not exist" in r.json()["error"]["message"]


def test_chat_matches_the_unpatched_models_greedy_generate(client, cache):
    """BF16 runs the preset's own weights: the served reply must be what transformers' generate
    gives with torch's experts, token for token."""
    from kt.integrations.transformers.preset import load_preset

    model, tok = load_preset()
    # One reply that ends at its end-of-sequence token, one cut at max_tokens.
    for text in ("Hello there", "Prompt number 4: eee"):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=16, do_sample=False)
        new = out[0, len(ids):]
        r = chat(client, text)
        assert r.choices[0].message.content == tok.decode(new, skip_special_tokens=True)
        assert r.choices[0].finish_reason == ("stop" if new[-1] == tok.eos_token_id else "length")
        assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(new)
        assert r.usage.total_tokens == len(ids) + len(new)


def test_chat_streaming_gives_the_same_text(client):
    whole = chat(client, "Prompt number 4: eee")
    chunks = list(chat(client, "Prompt number 4: eee", stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len(text) > 0
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.id == chunks[0].id for c in chunks)


def test_completions(client):
    r = client.completions.create(model="tiny", prompt="The quick brown fox", **GREEDY)
    text = r.choices[0].text
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 16 and r.usage.prompt_tokens == 19
    streamed = client.completions.create(model="tiny", prompt="The quick brown fox", stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in streamed) == text
    # Token ids as the prompt: the same continuation.
    ids = [4 + ord(c) - 32 for c in "The quick brown fox"]
    assert client.completions.create(model="tiny", prompt=ids, **GREEDY).choices[0].text == text
    # A stop string cuts the text before it and ends with finish_reason "stop".
    stop = text[5:7]
    cut = client.completions.create(model="tiny", prompt="The quick brown fox", stop=[stop], **GREEDY)
    assert cut.choices[0].text == text[:text.index(stop)] and cut.choices[0].finish_reason == "stop"
    cut = client.completions.create(model="tiny", prompt="The quick brown fox", stop=stop, stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in cut) == text[:text.index(stop)]


def test_sampling_is_seeded(client):
    a, b, c = (chat(client, "Hello there", temperature=1.0, top_p=0.9, seed=s, extra_body={"ignore_eos": True})
               .choices[0].message.content
               for s in (7, 7, 8))
    assert a == b and a != c


def test_concurrent_clients_each_get_their_own_answer(client, server):
    prompts = [f"Prompt number {i}: {'abcdefgh'[i] * 3}" for i in range(6)]
    fixed = dict(max_tokens=12, extra_body={"ignore_eos": True})      # every reply 12 tokens long
    alone = [chat(client, p, **fixed).choices[0].message.content for p in prompts]
    got, errors = [None] * len(prompts), []

    def ask(i):
        try:
            if i % 2:      # half of them streaming, so streams and whole replies interleave
                got[i] = "".join(c.choices[0].delta.content or "" for c in
                                 chat(client, prompts[i], stream=True, **fixed))
            else:
                got[i] = chat(client, prompts[i], **fixed).choices[0].message.content
        except Exception as exc:       # reported below, with the others' results
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and got == alone
    assert len(set(alone)) > 1      # the prompts really lead to different answers


MALFORMED = [
    ("/v1/chat/completions", b"{not json", 400, "not valid JSON", None),
    ("/v1/chat/completions", b"[1, 2]", 400, "must be a JSON object", None),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages must be a non-empty list", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "role system", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "only text parts", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, 400,
     "max_tokens must be an integer >= 1", "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, 400,
     "context is 2048 tokens", "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400,
     "temperature must be a number", "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n must be 1", "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400,
     "stream must be true or false", "stream"),
    ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, 404,
     "'gpt-4' does not exist", "model"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "one prompt per request", "prompt"),
    ("/v1/completions", {"prompt": "x" * 2048}, 400, "the prompt has 2048: no room to generate", "prompt"),
    ("/v1/completions", {"prompt": [1, 10**9]}, 400, "token ids must be in", "prompt"),
    ("/v1/completions", {"prompt": "x", "stop": 5}, 400, "stop must be a string", "stop"),
    ("/v1/embeddings", {"input": "x"}, 404, "no such endpoint", None),
]


@pytest.mark.parametrize("path, body, status, reason, param", MALFORMED)
def test_malformed_requests_get_a_4xx_with_a_reason(http, path, body, status, reason, param):
    r = http.post(path, content=body) if isinstance(body, bytes) else http.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert reason in err["message"] and err["param"] == param and err["type"] == "invalid_request_error"


def test_the_root_lists_the_endpoints_and_unknown_paths_name_them(http):
    root = http.get("/")
    assert root.status_code == 200 and "POST /v1/chat/completions" in root.json()["endpoints"]
    r = http.get("/nope")
    assert r.status_code == 404 and "no such endpoint: GET /nope; this server has GET /health" in r.json()["error"]["message"]


def test_the_server_keeps_serving_after_bad_requests(http, client):
    assert http.get("/v1/completions").status_code == 405
    assert http.post("/health", json={}).status_code == 405
    # No Content-Length: refused with 411, on a raw socket (every HTTP library adds one).
    with socket.create_connection((http.base_url.host, http.base_url.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert b" 411 " in s.recv(4096).split(b"\r\n", 1)[0]
    for path, body, *_ in MALFORMED:
        http.post(path, content=body) if isinstance(body, bytes) else http.post(path, json=body)
    assert chat(client, "Hi", max_tokens=4).usage.completion_tokens >= 1
    assert http.get("/health").json()["failed"] == 0


def test_a_chat_template_that_refuses_the_messages_is_a_400(http, server, monkeypatch):
    monkeypatch.setattr(server.engine.tokenizer, "chat_template",
                        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}x")
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "system", "content": "be brief"}]})
    assert r.status_code == 400 and "the model's chat template refused these messages" in r.json()["error"]["message"]
    assert "no system role" in r.json()["error"]["message"]
    monkeypatch.setattr(server.engine.tokenizer, "chat_template", None)
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "has no chat template; use /v1/completions" in r.json()["error"]["message"]


def wait_idle(http, cancelled_before, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = http.get("/health").json()
        if h["cancelled"] > cancelled_before and h["running"] == 0:
            return h
        time.sleep(0.05)
    raise AssertionError(f"the abandoned request was not cancelled within {timeout} s: {h}")


def test_a_client_that_leaves_mid_stream_is_cancelled(http, client):
    before = http.get("/health").json()["cancelled"]
    body = {"messages": [{"role": "user", "content": "Go on forever"}], "max_tokens": 2000, "temperature": 0,
            "stream": True, "ignore_eos": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
    assert any(line.startswith("data:") for line in got)
    # 2000 tokens would take ~10 s; the worker must stop at once and serve the next request.
    wait_idle(http, before)
    start = time.perf_counter()
    assert chat(client, "Hi", max_tokens=4).usage.completion_tokens >= 1
    assert time.perf_counter() - start < 3


def test_a_client_that_leaves_while_waiting_is_cancelled(http, server):
    """A non-streaming request writes nothing until it is done: the handler notices the closed
    socket while it waits, and the worker stops generating."""
    before = http.get("/health").json()["cancelled"]
    body = json.dumps({"prompt": "x", "max_tokens": 2000, "temperature": 0, "ignore_eos": True}).encode()
    with socket.create_connection((server.host, server.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.3)
    wait_idle(http, before)


def test_a_full_queue_answers_503_and_the_waiting_request_is_served(http, client, server, monkeypatch):
    import dataclasses

    monkeypatch.setattr(server.engine, "settings", dataclasses.replace(server.engine.settings, max_queue=1))
    # 10 ms a token: the long request outlasts a slow start of the waiting client (on a loaded
    # 2-core CI machine it took > 5 s, and the long request had finished by then).
    pick = server.engine._pick
    monkeypatch.setattr(server.engine, "_pick", lambda *a: (time.sleep(0.01), pick(*a))[1])
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2000, "temperature": 0, "stream": True,
            "ignore_eos": True}
    replies = []
    waiting = threading.Thread(target=lambda: replies.append(chat(client, "Hi", max_tokens=4)))
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()       # kept: a discarded iterator closes the stream, which cancels the request
        next(lines)                  # the long request is accepted...
        # ...and running, not still queued behind the previous test's cancelled request (the
        # waiting client would then find the queue full and get the 503 itself).
        deadline = time.monotonic() + 15
        while (h := http.get("/health").json())["queued"] or not h["running"]:
            assert time.monotonic() < deadline, f"the long request never started: {h}"
            time.sleep(0.02)
        waiting.start()
        deadline = time.monotonic() + 15
        while http.get("/health").json()["queued"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert http.get("/health").json()["queued"] == 1, "the waiting request never reached the queue"
        refused = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert refused.status_code == 503 and "1 requests are already waiting (--max-queue 1)" in refused.text
    # Leaving the stream cancels the long request; the one waiting is served next.
    waiting.join(10)
    assert replies and replies[0].usage.completion_tokens >= 1


@pytest.fixture
def never_serve(monkeypatch):
    """For models kt run must refuse: reaching the engine fails the test instead of serving forever."""
    from kt.serve.engine import Engine

    def refuse(*args, **kwargs):
        raise AssertionError("kt run loaded a model it should have refused")

    monkeypatch.setattr(Engine, "__init__", refuse)


def test_unknown_model_family_is_refused_with_the_supported_list(tmp_path, never_serve):
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=64)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    r = CliRunner().invoke(app, ["run", str(tmp_path), "--port", "0"])
    assert r.exit_code == 1
    assert "model_type 'llama' is not an MoE family" in r.output
    assert re.search(r"supported: afmoe, .*deepseek_v2, .*qwen3_moe", r.output, re.S)


def test_a_model_without_moe_layers_is_refused(tmp_path, cache, monkeypatch, never_serve):
    import shutil

    import transformers

    from kt.integrations.transformers.preset import ensure_preset

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    preset = ensure_preset()
    cfg = transformers.Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4,
                                      num_experts_per_tok=2, vocab_size=104, mlp_only_layers=[0, 1])
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    for f in preset.glob("tokenizer*"):
        shutil.copy(f, tmp_path)
    r = CliRunner().invoke(app, ["run", str(tmp_path), "--port", "0"])
    assert r.exit_code == 1 and "has no MoE layers" in r.output, r.output


def test_a_model_folder_without_a_tokenizer_is_refused(tmp_path, never_serve):
    import transformers

    cfg = transformers.Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4,
                                      num_experts_per_tok=2, vocab_size=104)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    r = CliRunner().invoke(app, ["run", str(tmp_path), "--port", "0"])
    assert r.exit_code == 1 and "has no tokenizer (none of tokenizer.json" in r.output, r.output


def test_dry_run_prints_the_transformers_settings():
    r = CliRunner().invoke(app, ["run", "--dry-run", "--kt-method", "int8", "--kt-cpuinfer", "3", "--port", "9000"])
    assert r.exit_code == 0, r.output
    assert "kt's transformers server" in r.output and "experts                INT8" in r.output
    assert "cpuinfer threads       3 (given)" in r.output and "threadpool count       1 (kt doctor:" in r.output
    assert "http://127.0.0.1:9000/v1" in r.output and "one request at a time" in r.output
    assert "activations            f32-exact (two int8 passes; split bf16); GGUF: llama.cpp's activation blocks" \
        in r.output
    r = CliRunner().invoke(app, ["run", "--dry-run", "--fast-activations"])
    assert r.exit_code == 0, r.output
    assert "activations            fast: one int8 pass" in r.output
    r = CliRunner().invoke(app, ["run", "--dry-run", "--precise-activations"])
    assert r.exit_code == 0, r.output
    assert "activations            f32-exact (two int8 passes; split bf16)\n" in r.output


def test_dry_run_checks_the_method_the_folder_and_the_port(tmp_path):
    r = CliRunner().invoke(app, ["run", "--dry-run", "--kt-method", "int5"])
    assert r.exit_code == 1 and "--kt-method int5: not a method of any installed backend" in r.output
    from kt.testing.checkpoints import write_checkpoint
    from kt.weights import convert

    write_checkpoint(tmp_path / "m", "qwen3_moe", hidden=64, intermediate=32, experts=4, layers=1, dense_prefix=0)
    folder = convert(tmp_path / "m", tmp_path / "conv", method="INT8")
    r = CliRunner().invoke(app, ["run", "--dry-run", "--kt-method", "INT4", "--kt-weight-path", str(folder)])
    assert r.exit_code == 1 and "holds INT8 experts" in r.output and "run with --kt-method INT8" in r.output
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = CliRunner().invoke(app, ["run", "--dry-run", "--port", str(port)])
    assert r.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in r.output and "--port" in r.output


def test_fast_activations_reach_the_patched_layers(cache):
    with tiny_server(cache, fast_activations=True) as s:
        layers = list(s.engine.patch.layers.values())
        assert layers and all(layer.moe.fast_activations for layer in layers)
        reply = openai.OpenAI(base_url=s.url, api_key="unused", max_retries=0).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], **GREEDY)
        assert reply.usage.completion_tokens > 0   # it still serves


def test_dry_run_with_sglang_and_a_gpu_prints_the_sglang_command(tmp_path, monkeypatch):
    """Neither SGLang nor a GPU is here: both are faked where kt run looks for them."""
    import importlib.util

    from kt.serve import sglang

    (tmp_path / "config.json").write_text("{}")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "sglang" else
                        real_find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert sglang.available() == (True, "SGLang is installed and torch sees a CUDA GPU")
    r = CliRunner().invoke(app, ["run", str(tmp_path), "--dry-run", "--kt-method", "AMXINT4", "--kt-weight-path", "/w",
                                 "--kt-cpuinfer", "64", "--kt-threadpool-count", "2", "--kt-num-gpu-experts", "32",
                                 "--kt-max-deferred-experts-per-token", "2", "--port", "30000"])
    assert r.exit_code == 0, r.output
    expected = (f"{sys.executable} -m sglang.launch_server --model-path {tmp_path} --served-model-name {tmp_path.name} "
                "--host 127.0.0.1 --port 30000 --kt-method AMXINT4 --kt-weight-path /w --kt-cpuinfer 64 "
                "--kt-threadpool-count 2 --kt-num-gpu-experts 32 --kt-max-deferred-experts-per-token 2")
    assert "SGLang (SGLang is installed and torch sees a CUDA GPU): would run" in r.output
    assert expected in r.output.replace("\n", "")
    # Without --kt-weight-path kt-kernel reads the experts from the model folder; threads from kt doctor.
    r = CliRunner().invoke(app, ["run", str(tmp_path), "--dry-run"])
    assert re.search(rf"--kt-weight-path {re.escape(str(tmp_path))} --kt-cpuinfer \d+ --kt-threadpool-count \d+",
                     r.output.replace("\n", ""))
    # kt-kernel has no such setting (it always runs at that precision): said, not passed on.
    r = CliRunner().invoke(app, ["run", str(tmp_path), "--dry-run", "--fast-activations"])
    assert "fast" not in r.output.split("would run")[1].split("\n")[1]
    assert "--fast-activations: nothing to pass on" in r.output
    # Every other --kt-* flag of SGLang's server_args.py, kt's names in kt-kernel's spelling, and
    # everything after `--` passed on unchanged.
    r = CliRunner().invoke(app, ["run", str(tmp_path), "--dry-run", "--kt-method", "int4", "--kt-threadpool-count", "2",
                                 "--kt-numa-nodes", "0,1", "--kt-gpu-experts-ratio", "0.25",
                                 "--kt-gpu-prefill-token-threshold", "2048", "--kt-expert-placement-strategy",
                                 "frequency", "--kt-enable-dynamic-expert-update", "--record-kt-gpu-expert-distribution",
                                 "--kt-expert-lora-path", "/lora", "--trust-remote-code", "--", "--tp", "2",
                                 "--disable-cuda-graph"])
    assert r.exit_code == 0, r.output
    line = r.output.replace("\n", "")
    assert "--kt-method AMXINT4 " in line
    assert line.rstrip().endswith("--kt-numa-nodes 0 1 --kt-gpu-experts-ratio 0.25 --kt-gpu-prefill-token-threshold 2048 "
                                  "--kt-expert-placement-strategy frequency --kt-expert-lora-path /lora "
                                  "--kt-enable-dynamic-expert-update --record-kt-gpu-expert-distribution "
                                  "--trust-remote-code --tp 2 --disable-cuda-graph"), line
    for args, message in ((["--kt-method", "FP32"], "FP32 has no kt-kernel method"),
                          (["--kt-numa-nodes", "0,1", "--kt-threadpool-count", "1"], "lists 2 node.s., one per thread"),
                          (["--kt-gpu-experts-ratio", "1.5"], r"a fraction of all experts, in \[0, 1\]"),
                          (["--kt-expert-placement-strategy", "hottest"], "choose one of frequency, front-loading")):
        r = CliRunner().invoke(app, ["run", str(tmp_path), "--dry-run", *args])
        assert r.exit_code == 1 and re.search(message, r.output), r.output


def test_kt_run_serves_expert_lora(tmp_path, cache, monkeypatch):
    """--kt-expert-lora-path on kt's own server: the preset served with a PEFT expert adapter (random
    factors, written by kt) generates what patch_model(expert_lora_path=) gives, not what the base
    model gives; a folder that is not an adapter, and deferral with one, are refused before loading."""
    from kt.integrations.transformers import patch_model
    from kt.integrations.transformers.preset import load_preset
    from kt.serve import Engine, ServeSettings

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    model, _ = load_preset()
    patch = patch_model(model, mode="train", lora_rank=4, lora_alpha=8)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in patch.adapter_parameters():
            p.normal_(0.0, 0.05, generator=gen)
    patch.save_adapter(tmp_path / "lora")
    settings = ServeSettings(port=0, expert_lora_path=str(tmp_path / "lora")).resolved()
    assert dict(settings.describe())["expert LoRA"] == (f"{tmp_path / 'lora'} (PEFT adapter: rank 4, alpha 8, on "
                                                        "gate_up, down)")
    with pytest.raises(KTError, match="not a PEFT adapter folder"):
        Engine.load(ServeSettings(port=0, expert_lora_path=str(tmp_path)).resolved())
    with pytest.raises(KTError, match="deferred.*expert-lora-path"):
        Engine.load(ServeSettings(port=0, expert_lora_path=str(tmp_path / "lora"),
                                  max_deferred_experts_per_token=1).resolved())
    logs = []
    engine = Engine.load(settings, log=logs.append)
    try:
        assert f"expert LoRA from {tmp_path / 'lora'}" in logs[-1]
        ids = torch.tensor([engine.text_prompt("The capital of France is")])
        greedy = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
        with torch.no_grad():
            got = engine.model.generate(ids, **greedy)
            want, _ = load_preset()
            patch_model(want, expert_lora_path=tmp_path / "lora")
            assert torch.equal(got, want.generate(ids, **greedy))
            base, _ = load_preset()
            patch_model(base)
            assert not torch.equal(got, base.generate(ids, **greedy))
    finally:
        engine.close()


def test_sglang_only_flags_are_refused_where_kts_server_serves(tmp_path):
    r = CliRunner().invoke(app, ["run", "--dry-run", "--kt-gpu-experts-ratio", "0.5", "--", "--tp", "2"])
    assert r.exit_code == 1
    assert "--kt-gpu-experts-ratio, arguments after --: only SGLang takes these, and it does not serve here" in r.output


def test_sigterm_stops_kt_run_cleanly(tmp_path, cache):
    """kt run in its own process: SIGTERM ends the stream in flight with an error event, stops the
    worker, frees the port and exits 0."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    proc = subprocess.Popen([sys.executable, "-m", "kt_core.cli", "run", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = None
        for line in proc.stdout:
            m = re.search(r"serving tiny at (http://\S+/v1)", line)
            if m:
                url = m.group(1)
                break
        assert url, "kt run did not start"
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2000, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data:")
            proc.send_signal(signal.SIGTERM)
            rest = list(lines)
        assert any("shutting down" in line for line in rest) and "data: [DONE]" in rest
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "SIGTERM: shutting down" in out and "stopped; served 0, cancelled 1" in out
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))       # the port is free again
