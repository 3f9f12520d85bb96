"""`kt demo`: the built-in tiny MoE model generating with torch's experts, then with kt's."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape

# Methods whose weights are the model's own (the preset's are bf16): their text must equal torch's.
EXACT = ("BF16", "FP32")


def _generate(model, ids, tokens: int):
    """Greedy continuation of exactly `tokens` tokens and its tokens/s (after a short warm-up,
    so one-time allocation is not timed)."""
    mask = ids.new_ones(ids.shape)
    model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False)
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    return out[0, ids.shape[1]:], tokens / (time.perf_counter() - start)


def run(console: Console, *, method: str, tokens: int, prompt: str, backend: str | None) -> None:
    try:
        import torch
        from transformers.utils import logging as transformers_logging

        from ..integrations.transformers import patch_model
        from ..integrations.transformers.preset import ensure_preset, load_preset, preset_dir
    except ImportError as exc:
        raise SystemExit(f"kt demo: {exc}") from None
    transformers_logging.disable_progress_bar()     # a 14 MB model: its load bars are only noise

    fresh = not (preset_dir() / "config.json").is_file()
    start = time.perf_counter()
    folder = ensure_preset()
    model, tokenizer = load_preset()
    cfg = model.config
    console.print(f"{'wrote' if fresh else 'loaded'} the tiny Qwen3-MoE preset ({folder}) in "
                  f"{time.perf_counter() - start:.1f} s: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
                  f"{cfg.num_experts} experts of {cfg.moe_intermediate_size}, top-{cfg.num_experts_per_tok}, "
                  "seeded random weights")
    ids = torch.tensor([[tokenizer.bos_token_id] + tokenizer(prompt).input_ids])

    with torch.no_grad():
        torch_tokens, torch_rate = _generate(model, ids, tokens)
        patch = patch_model(model, method=method, backend=backend)
        kt_tokens, kt_rate = _generate(model, ids, tokens)
    console.print(f"experts: {patch.method} on [bold]{', '.join(patch.backends)}[/bold], "
                  f"{patch.freed_bytes / 2**20:.1f} MiB of torch expert weights freed")

    def text(t):
        return escape(repr(prompt + tokenizer.decode(t, skip_special_tokens=True)))

    # soft_wrap: one line per text however long, so the two can be compared (and parsed)
    console.print(f"torch experts: {text(torch_tokens)}  [{torch_rate:.1f} tokens/s]", soft_wrap=True)
    console.print(f"kt experts:    {text(kt_tokens)}  [{kt_rate:.1f} tokens/s]", soft_wrap=True)
    same = int((torch_tokens == kt_tokens).long().cumprod(0).sum())
    if same == tokens:
        console.print(f"[green]the texts agree: all {tokens} generated tokens are the same[/green]")
    elif patch.method in EXACT:
        raise SystemExit(f"kt demo: {patch.method} runs the model's own weights, yet the texts differ from token "
                         f"{same + 1} of {tokens}")
    else:
        console.print(f"[yellow]the texts agree for {same} of {tokens} tokens ({patch.method} quantizes the "
                      "experts; a different pick then changes everything after it)[/yellow]")
    console.print("(a tiny model: tokens/s here measure per-token overhead, not expert throughput; see `kt bench`)")
