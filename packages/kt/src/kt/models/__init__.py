"""The MoE model families kt knows: config keys and checkpoint tensor names, as data."""

from .registry import ACTIVATIONS, FAMILIES, ExpertNames, Family, FusedExperts, TransformersExperts, family_for
from .spec import ModelSpec, Quantization, read_config, spec_from_config

__all__ = ["ACTIVATIONS", "FAMILIES", "ExpertNames", "Family", "FusedExperts", "ModelSpec", "Quantization",
           "TransformersExperts", "family_for", "read_config", "spec_from_config"]
