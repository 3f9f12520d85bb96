"""Expert weights: Hugging Face checkpoints, kt converted folders, kt-kernel's folders, `kt convert`, loading."""

from .checkpoint import Checkpoint
from .conversion import convert
from .converted import ConvertedFolder
from .kt_kernel_folder import KtKernelFolder
from .loader import load_layer, open_weights
from .packing import add_packed

__all__ = ["add_packed", "Checkpoint", "ConvertedFolder", "KtKernelFolder", "convert", "load_layer", "open_weights"]
