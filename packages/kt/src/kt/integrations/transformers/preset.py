"""The built-in tiny MoE model: a Qwen3-MoE-shaped config with seeded random weights and a
character tokenizer, written on first use into the user's cache folder as an ordinary Hugging
Face model folder, so `kt demo` (and `kt run`) work on a fresh machine with no download.

    path = ensure_preset()              # ~/.cache/kt/presets/tiny-qwen3-moe-v1
    model, tokenizer = load_preset()
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

PRESET = "tiny-qwen3-moe"
# Bumped whenever the config, seed or tokenizer below change: a new folder is written then.
VERSION = 1
SEED = 0
CONFIG = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=64, intermediate_size=512, moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4,
              norm_topk_prob=True, max_position_embeddings=2048, initializer_range=0.1, tie_word_embeddings=False)
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
# Printable ASCII and newline, one token per character.
CHARACTERS = tuple(chr(c) for c in range(32, 127)) + ("\n",)
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def cache_root() -> Path:
    """$XDG_CACHE_HOME/kt, or ~/.cache/kt."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kt"


def preset_dir() -> Path:
    return cache_root() / "presets" / f"{PRESET}-v{VERSION}"


def _tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")   # every character alone
    tok.decoder = decoders.Fuse()                                                     # joined without spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _write(folder: Path) -> None:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    specials = {f"{name}_token_id": SPECIAL_TOKENS.index(tok) for name, tok in (("pad", "<pad>"), ("bos", "<s>"),
                                                                                   ("eos", "</s>"))}
    cfg = Qwen3MoeConfig(**CONFIG, vocab_size=len(SPECIAL_TOKENS) + len(CHARACTERS), **specials)
    # Seeded on a private generator state, so materialising the preset leaves the caller's RNG alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(cfg)
    # Stored in bf16: kt's BF16 then runs exactly the weights torch runs, and the file is half the size.
    model.to(torch.bfloat16).save_pretrained(folder)
    _tokenizer().save_pretrained(folder)


def ensure_preset() -> Path:
    """The preset's folder, written first if it is not there yet. Written into a temporary
    folder next to it and renamed, so a run interrupted half-way or a concurrent run never
    leaves (or reads) a partial preset."""
    final = preset_dir()
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        tmp.chmod(0o755)     # mkdtemp's 0700 would become the preset's mode
        _write(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():    # not another process's finished preset
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_preset(dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of the preset, in eval mode, in `dtype` (the stored weights are bf16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_preset()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(folder)
