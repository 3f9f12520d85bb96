"""The tiny preset served over loopback for test_serve.py and test_chat.py: kt run's engine and
HTTP server in this process, on a free port, the preset written into a temporary cache."""

from __future__ import annotations

import contextlib
import os

from kt.serve import Engine, Server, ServeSettings


@contextlib.contextmanager
def tiny_server(cache_dir, **settings):
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache_dir)
    try:
        s = ServeSettings(model="tiny", port=0, **settings).resolved()
        server = Server(Engine.load(s, log=lambda _: None), s.host, 0).start()
        try:
            yield server
        finally:
            server.close()
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old
