"""`kt chat`: a terminal client for any OpenAI-compatible endpoint (kt run's, SGLang's, ...).

Replies stream as they are generated; the conversation is kept and sent with every turn;
`/clear` forgets it, `/exit` (or end of input) quits. After each reply: its token counts, from
the server's usage when it sends one, otherwise the streamed chunks counted (marked "~").
Reads lines from stdin when stdin is not a terminal, so it can be scripted and tested.
"""

from __future__ import annotations

import json
import sys
import time

from rich.console import Console
from rich.markup import escape

HELP = "/clear forgets the conversation, /exit quits"


class ChatError(Exception):
    pass


def _error_text(response) -> str:
    try:
        return response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response.text[:500] or response.reason_phrase


def _first_model(client) -> str:
    import httpx

    try:
        r = client.get("/models")
    except httpx.HTTPError as exc:
        raise ChatError(f"cannot reach {client.base_url}: {exc}") from None
    if r.status_code != 200:
        raise ChatError(f"{client.base_url}/models answered {r.status_code}: {_error_text(r)}")
    data = r.json().get("data") or []
    if not data:
        raise ChatError(f"{client.base_url} lists no models; give --model")
    return data[0]["id"]


def _read_line(console: Console, stdin) -> str | None:
    if stdin.isatty():
        try:
            return console.input("[bold cyan]you>[/bold cyan] ")
        except EOFError:
            return None
    line = stdin.readline()
    return None if line == "" else line.rstrip("\n")


def _reply(console: Console, client, body: dict) -> tuple[str, dict | None, int, float]:
    """Stream one reply to the console; (text, server usage or None, chunks with text, seconds)."""
    parts, usage, chunks = [], None, 0
    start = time.perf_counter()
    with client.stream("POST", "/chat/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            raise ChatError(f"the server answered {r.status_code}: {_error_text(r)}")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise ChatError(f"the server stopped the reply: {event['error'].get('message')}")
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    chunks += 1
                    parts.append(text)
                    console.out(text, end="", highlight=False)
                    console.file.flush()
    return "".join(parts), usage, chunks, time.perf_counter() - start


def run(console: Console, *, url: str, model: str | None, max_tokens: int, temperature: float,
        system: str | None, stdin=None) -> None:
    import httpx

    stdin = stdin or sys.stdin
    # No read timeout: a reply may wait behind other clients' requests in the server's queue.
    client = httpx.Client(base_url=url.rstrip("/"), timeout=httpx.Timeout(10.0, read=None))
    start = [{"role": "system", "content": system}] if system else []
    with client:
        model = model or _first_model(client)
        console.print(f"chatting with [bold]{escape(model)}[/bold] at {escape(url)}; {HELP}", highlight=False)
        history = list(start)
        while True:
            line = _read_line(console, stdin)
            if line is None or line.strip() == "/exit":
                break
            text = line.strip()
            if not text:
                continue
            if text == "/clear":
                history = list(start)
                console.print("[dim](conversation cleared)[/dim]")
                continue
            if text.startswith("/"):
                console.print(f"[yellow]unknown command {escape(text)}; {HELP}[/yellow]")
                continue
            history.append({"role": "user", "content": text})
            body = {"model": model, "messages": history, "stream": True, "stream_options": {"include_usage": True},
                    "max_tokens": max_tokens, "temperature": temperature}
            console.print("[bold green]assistant>[/bold green] ", end="")
            try:
                reply, usage, chunks, seconds = _reply(console, client, body)
            except KeyboardInterrupt:
                console.print("\n[yellow](reply interrupted; it is not kept)[/yellow]")
                history.pop()
                continue
            except (ChatError, httpx.HTTPError) as exc:
                console.print(f"\n[red]{escape(str(exc))}[/red]", soft_wrap=True)
                history.pop()
                continue
            history.append({"role": "assistant", "content": reply})
            if usage:
                counts = (f"{usage.get('prompt_tokens')} prompt + {usage.get('completion_tokens')} completion tokens")
                rate = (usage.get("completion_tokens") or 0) / seconds if seconds > 0 else 0
            else:
                counts = f"~{chunks} completion tokens (counted chunks; the server sent no usage)"
                rate = chunks / seconds if seconds > 0 else 0
            turns = sum(m["role"] == "user" for m in history)
            console.print(f"\n[dim][{counts}, {rate:.1f} tokens/s, {turns} turn(s) in history][/dim]",
                          highlight=False)
