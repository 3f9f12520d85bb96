"""kt chat: lines from stdin against kt run's server (the tiny preset on loopback), and against a
minimal stand-in endpoint that sends no usage."""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("torch", reason="kt run needs torch")
pytest.importorskip("transformers", reason="kt run needs transformers")
httpx = pytest.importorskip("httpx")

from serving import tiny_server  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from kt.cli.app import app  # noqa: E402

COUNTS = re.compile(r"\[(\d+) prompt \+ (\d+) completion tokens, [\d.]+ tokens/s, (\d+) turn\(s\) in history\]")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with tiny_server(tmp_path_factory.mktemp("cache")) as s:
        yield s


def kt_chat(url, lines, *args):
    return CliRunner().invoke(app, ["chat", "--url", url, "--temperature", "0", "--max-tokens", "8", *args],
                              input="".join(f"{line}\n" for line in lines))


def served(server) -> int:
    return httpx.get(server.url.removesuffix("/v1") + "/health").json()["served"]


def test_history_clear_and_exit(server):
    before = served(server)
    r = kt_chat(server.url, ["Prompt number 4: eee", "and then?", "", "/clear", "Prompt number 4: eee", "/bogus",
                             "/exit", "never sent"])
    assert r.exit_code == 0, r.output
    assert "chatting with tiny at" in r.output and "/clear forgets the conversation" in r.output
    counts = [tuple(map(int, m)) for m in COUNTS.findall(r.output)]
    assert len(counts) == 3
    (p1, c1, t1), (p2, c2, t2), (p3, c3, t3) = counts
    # The second turn sends the first exchange along; after /clear the conversation starts over.
    assert t1 == 1 and t2 == 2 and t3 == 1
    assert p2 > p1 + c1 and (p3, c3) == (p1, c1)
    assert "(conversation cleared)" in r.output and "unknown command /bogus" in r.output
    assert served(server) == before + 3        # nothing after /exit was sent

    # Each streamed reply is the server's whole reply to the same conversation.
    whole = httpx.post(f"{server.url}/chat/completions", timeout=30, json={
        "model": "tiny", "messages": [{"role": "user", "content": "Prompt number 4: eee"}], "max_tokens": 8,
        "temperature": 0}).json()["choices"][0]["message"]["content"]
    assert len(whole) > 0 and r.output.count(f"assistant> {whole}\n") == 2


def test_end_of_input_quits_and_errors_keep_the_session(server):
    r = kt_chat(server.url, ["Hi"], "--model", "not-served")
    assert r.exit_code == 0
    assert "the server answered 404: the model 'not-served' does not exist" in r.output
    r = kt_chat(server.url, ["Hi"], "--max-tokens", "100000")
    assert "the server answered 400: this model's context is 2048 tokens" in r.output and r.exit_code == 0


def test_an_unreachable_server_is_reported():
    r = kt_chat("http://127.0.0.1:9/v1", ["Hi"])
    assert r.exit_code == 1 and "kt chat: cannot reach http://127.0.0.1:9/v1" in r.output


class NoUsage(BaseHTTPRequestHandler):
    """An OpenAI-style endpoint that streams three chunks and never sends usage."""
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = json.dumps({"data": [{"id": "stand-in"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in ("one ", "two ", "three"):
            self.wfile.write(f"data: {json.dumps({'choices': [{'delta': {'content': piece}}]})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


def test_tokens_are_counted_when_the_server_sends_no_usage():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), NoUsage)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        r = kt_chat(f"http://127.0.0.1:{httpd.server_address[1]}/v1", ["Hi"])
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert r.exit_code == 0, r.output
    assert "chatting with stand-in" in r.output and "one two three" in r.output
    assert "~3 completion tokens (counted chunks; the server sent no usage)" in r.output
