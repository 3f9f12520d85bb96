"""Backend discovery and selection (see docs/plugin-abi.md)."""

from .descriptor import BackendDescriptor, Tier, Variant
from .discovery import ENTRY_POINT_GROUP, discover
from .selection import Candidate, canonical_method, reset, selector


def explain() -> list[dict]:
    """Every discovered backend variant with its score and why it won or lost."""
    return selector().explain()


__all__ = ["BackendDescriptor", "Candidate", "ENTRY_POINT_GROUP", "Tier", "Variant", "canonical_method",
           "discover", "explain", "reset", "selector"]
