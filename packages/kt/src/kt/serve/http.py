"""The HTTP side of `kt run`: the standard library's threading server, one thread per connection
(HTTP/1.1 keep-alive), handing generation to the engine's single worker.

The standard library, not an ASGI stack: a server that runs one request at a time needs no event
loop, and `kt run` then needs nothing beyond torch and transformers. Streams are Server-Sent
Events in chunked transfer encoding. A client that goes away is noticed when a write fails or,
while its request waits or prefills, by polling its socket; its job is cancelled either way.
"""

from __future__ import annotations

import json
import queue
import select
import socket
import threading
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import protocol as P
from .engine import Engine, Unavailable

MAX_BODY = 8 * 2**20
POLL_S = 0.1      # how often a waiting handler checks whether its client is still there


class _Disconnected(Exception):
    pass


ENDPOINTS = ("GET /health", "GET /v1/models", "POST /v1/chat/completions", "POST /v1/completions")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kt"
    engine: Engine
    log_fn: Callable[[str], None] | None
    _check_at = 0.0      # when _next_event next polls the client's socket

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        if self.log_fn is not None:
            self.log_fn(f"{self.address_string()} {format % args}")

    # -- routing --------------------------------------------------------------------------
    def do_GET(self):
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        engine = self.engine
        if path == "/":
            return self._json(200, {"object": "server", "model": engine.name, "endpoints": list(ENDPOINTS)})
        if path == "/health":
            status = engine.status()
            if engine.closing:
                return self._json(503, {"status": "shutting down", **status})
            return self._json(200, {"status": "ok", "model": engine.name, **status})
        if path == "/v1/models":
            return self._json(200, {"object": "list", "data": [self._model_card()]})
        if path == f"/v1/models/{engine.name}":
            return self._json(200, self._model_card())
        if path.startswith("/v1/models/"):
            return self._error(P.RequestError(404, f"the model {path[len('/v1/models/'):]!r} does not exist; this "
                                                   f"server serves {engine.name!r}", code="model_not_found"))
        if path in ("/v1/chat/completions", "/v1/completions"):
            return self._error(P.RequestError(405, f"{path} takes POST"))
        return self._error(P.RequestError(404, f"no such endpoint: GET {path}; this server has {', '.join(ENDPOINTS)}"))

    def do_POST(self):
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            # Read first, whatever the path: an unread body would be parsed as the next request.
            body = self._body()
            if path not in ("/v1/chat/completions", "/v1/completions"):
                if path in ("/health", "/v1/models"):
                    raise P.RequestError(405, f"{path} takes GET")
                raise P.RequestError(404, f"no such endpoint: POST {path}; this server has POST /v1/chat/completions "
                                          "and POST /v1/completions")
            chat = path == "/v1/chat/completions"
            job, stream, include_usage = (P.chat_request if chat else P.completion_request)(body, self.engine)
            self.engine.submit(job)
        except P.RequestError as exc:
            return self._error(exc)
        except Unavailable as exc:
            return self._error(P.RequestError(503, str(exc)))
        except Exception as exc:       # a bug, not the client's fault: answer 500 rather than drop the connection
            if self.log_fn is not None:
                self.log_fn(f"request failed: {traceback.format_exc()}")
            return self._error(P.RequestError(500, f"internal error: {type(exc).__name__}: {exc}"))
        with self.in_flight:
            try:
                if stream:
                    self._stream(job, chat, include_usage)
                else:
                    self._complete(job, chat)
            except _Disconnected:
                job.cancel()
                self.close_connection = True

    # -- request and response plumbing ------------------------------------------------------
    def _body(self) -> dict:
        length = self.headers.get("Content-Length")
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower() or length is None or not length.isdigit():
            self.close_connection = True      # where this body ends is unknown: the connection cannot be reused
            raise P.RequestError(411, "a JSON body with a Content-Length header is required (not chunked)")
        if int(length) > MAX_BODY:
            self.close_connection = True      # the body is not read, so the connection cannot be reused
            raise P.RequestError(413, f"the body is {length} bytes; at most {MAX_BODY} are accepted")
        raw = self.rfile.read(int(length))
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise P.RequestError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise P.RequestError(400, f"the body must be a JSON object, got {type(body).__name__}")
        return body

    def _model_card(self) -> dict:
        e = self.engine
        return {"id": e.name, "object": "model", "created": e.created, "owned_by": "kt", "max_model_len": e.context_length}

    def _json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, exc: P.RequestError) -> None:
        self._json(exc.status, exc.body())

    def _peer_closed(self) -> bool:
        """Whether the client closed its end (readable with nothing to read)."""
        conn = self.connection
        try:
            readable, _, _ = select.select([conn], [], [], 0)
            return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def _next_event(self, job) -> tuple:
        # Checked by the clock, not only when no event comes: a non-streaming reply's tokens keep
        # arriving while its client may be gone.
        while True:
            now = time.monotonic()
            if now >= self._check_at:
                if self._peer_closed():
                    raise _Disconnected
                self._check_at = now + POLL_S
            try:
                return job.events.get(timeout=POLL_S)
            except queue.Empty:
                pass

    def _complete(self, job, chat: bool) -> None:
        parts = []
        while True:
            event = self._next_event(job)
            if event[0] == "delta":
                parts.append(event[1])
            elif event[0] == "error":
                return self._error(P.RequestError(event[1], event[2]))
            else:
                rid = P.new_id("chatcmpl" if chat else "cmpl")
                make = P.chat_response if chat else P.completion_response
                return self._json(200, make(rid, self.engine.name, "".join(parts), event[1], job))

    def _send_chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except OSError:          # BrokenPipeError, ConnectionResetError: the client left
            raise _Disconnected from None

    def _sse(self, obj) -> None:
        self._send_chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

    def _stream(self, job, chat: bool, include_usage: bool) -> None:
        rid, name = P.new_id("chatcmpl" if chat else "cmpl"), self.engine.name
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if chat:
            self._sse(P.chat_chunk(rid, name, {"role": "assistant", "content": ""}, None))
        while True:
            event = self._next_event(job)
            if event[0] == "delta":
                self._sse(P.chat_chunk(rid, name, {"content": event[1]}, None) if chat else
                          P.completion_chunk(rid, name, event[1], None))
            elif event[0] == "error":
                # The status line is sent already: the error travels as an event, as OpenAI's does.
                self._sse(P.RequestError(event[1], event[2]).body())
                break
            else:
                self._sse(P.chat_chunk(rid, name, {}, event[1]) if chat else P.completion_chunk(rid, name, "", event[1]))
                if include_usage:
                    self._sse(P.usage_chunk(rid, name, "chat.completion.chunk" if chat else "text_completion", job))
                break
        self._sse(b"[DONE]")
        self._send_chunk(b"")


class _InFlight:
    """Counts the responses being written (a context manager around each), so close() can wait
    for them to be finished before the process exits."""

    def __init__(self):
        self._count = 0
        self._idle = threading.Condition()

    def __enter__(self):
        with self._idle:
            self._count += 1

    def __exit__(self, *exc):
        with self._idle:
            self._count -= 1
            if self._count == 0:
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._count == 0, timeout)


class Server:
    """The HTTP server on (host, port) in front of an engine; port 0 takes any free port."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 8000,
                 log: Callable[[str], None] | None = None):
        # staticmethod: a plain function stored on the class would be bound to the handler.
        self.in_flight = _InFlight()
        handler = type("Handler", (_Handler,), {"engine": engine, "log_fn": None if log is None else staticmethod(log),
                                                "in_flight": self.in_flight})
        self.engine = engine
        self.httpd = ThreadingHTTPServer((host, port), handler)
        # Connection threads are daemons: an idle keep-alive connection must not hold up exit;
        # every request in flight is ended by engine.close(), and close() waits until its handler
        # has written that ending (a loaded host used to exit mid-chunk).
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self._thread: threading.Thread | None = None
        self._serving = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def serve_forever(self) -> None:
        self._serving = True
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> Server:
        """Serve from a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, name="kt-http", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting, end every request in flight (waiting ones get 503, the running one is
        cancelled), stop the worker, release the port."""
        if self._serving:        # shutdown() waits for serve_forever, so only after it started
            self.httpd.shutdown()
        self.engine.close()
        self.in_flight.wait_idle(timeout=10.0)
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()

