"""`kt run`: SGLang with --kt-* flags where it can run, otherwise kt's own server; --dry-run
prints what would run. Ctrl-C or SIGTERM stops the server cleanly."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import threading

from rich.console import Console
from rich.markup import escape

from kt_core.errors import KTError

from . import sglang
from .settings import ServeSettings


def run(settings: ServeSettings, console: Console, *, dry_run: bool = False) -> None:
    from ..integrations.transformers.preset import ensure_preset, preset_dir

    s = settings.resolved()
    use_sglang, why = sglang.available()
    if use_sglang:
        model_path = str(preset_dir() if dry_run and s.is_preset else ensure_preset() if s.is_preset else s.model)
        cmd = sglang.command(s, model_path)
        console.print(f"SGLang ({why}): {'would run' if dry_run else 'running'}", highlight=False)
        console.print(escape(shlex.join(cmd)), soft_wrap=True, highlight=False)
        if s.fast_activations:
            console.print("--fast-activations: nothing to pass on, kt-kernel's kernels always run at that precision",
                          highlight=False)
        elif s.fast_activations is False:
            console.print("--precise-activations: SGLang has no such argument; its layers run at their own default",
                          highlight=False)
        if not dry_run:
            # Replaced by SGLang: its own signal handling and exit status are kt run's.
            os.execv(cmd[0], cmd)
        return
    sglang_only = s.sglang_only()
    if sglang_only:
        raise KTError(f"{', '.join(sglang_only)}: only SGLang takes these, and it does not serve here ({why}); "
                      "kt's transformers server would ignore them")
    s.check_expert_lora()
    check_port(s.host, s.port)
    console.print(f"kt's transformers server ({why})", highlight=False)
    for key, value in s.describe():
        console.print(f"  {key:<22} {escape(value)}", soft_wrap=True, highlight=False)
    if dry_run:
        return
    serve(s, console)


def check_port(host: str, port: int) -> None:
    """Refuse a port already in use before the model loads (minutes on a real model), binding
    as the server will (address reuse on, so a port in TIME_WAIT is not "in use")."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise KTError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another with --port "
                          "(0: any free port) or --host") from None


def serve(s: ServeSettings, console: Console) -> None:
    from .engine import Engine
    from .http import Server

    def log(message: str) -> None:
        console.print(escape(message), soft_wrap=True, highlight=False)

    engine = Engine.load(s, log=log)
    try:
        server = Server(engine, s.host, s.port, log=log)
    except OSError as exc:
        engine.close()
        raise SystemExit(f"kt run: cannot listen on {s.host}:{s.port}: {exc.strerror or exc}") from None
    stop = threading.Event()
    received = []

    def on_signal(signum, _frame):
        received.append(signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    server.start()
    console.print(f"serving {s.served_model_name} at {server.url} (Ctrl-C to stop)", highlight=False)
    try:
        while not stop.wait(0.5):     # a timed wait, so signals are handled promptly on every platform
            pass
    finally:
        console.print(f"{received[0] if received else 'stop'}: shutting down ({engine.status()['queued']} waiting, "
                      f"{engine.status()['running']} running request(s) ended)", highlight=False)
        server.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        console.print(f"stopped; served {engine.counts['served']}, cancelled {engine.counts['cancelled']}, "
                      f"failed {engine.counts['failed']}", highlight=False)
