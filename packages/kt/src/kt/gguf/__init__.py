"""GGUF models for method LLAMAFILE: the reader and the ggml block types kt runs."""

from kt_core.formats.ggml import GGML_TYPES, GgmlType, ggml_type

from .reader import GGUFModel, LayerExperts, is_gguf, open_gguf, split_files

__all__ = ["GGML_TYPES", "GGUFModel", "GgmlType", "LayerExperts", "ggml_type", "is_gguf", "open_gguf", "split_files"]
