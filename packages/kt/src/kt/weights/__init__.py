"""Expert weights: Hugging Face checkpoints, kt converted folders, `kt convert`, loading."""

from .checkpoint import Checkpoint
from .conversion import convert
from .converted import ConvertedFolder
from .loader import load_layer, open_weights
from .packing import add_packed

__all__ = ["add_packed", "Checkpoint", "ConvertedFolder", "convert", "load_layer", "open_weights"]
