"""`kt sft`: LoRA fine-tuning of MoE models with the routed experts on kt, from a YAML config.

config.py reads and checks the run's settings, data.py turns JSONL records into token sequences
with labels, trainer.py trains (resumable), saves PEFT-format adapters and merges them.
"""

from .config import SFTConfig, load_config
from .data import load_examples
from .trainer import merge_adapter, train

__all__ = ["SFTConfig", "load_config", "load_examples", "merge_adapter", "train"]
