"""The application's `kt` commands, registered with kt-core's `kt` script (entry point group
`kt.cli`). COMMANDS is read to list them, so this module imports nothing heavy."""

from __future__ import annotations

COMMANDS = {
    "demo": "generate with a built-in tiny MoE model, torch's experts vs kt's",
    "run": "serve a model over an OpenAI-compatible API with its routed experts on kt",
    "chat": "chat with an OpenAI-compatible server",
    "convert": "quantize a model's routed experts into a kt converted folder",
    "bench": "benchmark one MoE layer against this host's bandwidth and compute peak",
    "config": "user-level defaults of run, bench and convert (~/.config/kt/config.yaml)",
    "sft": "LoRA fine-tuning with the routed experts on kt: train, export, chat",
}


def main(argv: list[str]) -> int:
    from .app import main as run

    return run(argv)
