"""The MoE model families kt knows: config keys and checkpoint tensor names, as data."""

from .registry import FAMILIES, ExpertNames, Family, FusedExperts, family_for
from .spec import ModelSpec, Quantization, read_config, spec_from_config

__all__ = ["FAMILIES", "ExpertNames", "Family", "FusedExperts", "ModelSpec", "Quantization", "family_for", "read_config",
           "spec_from_config"]
