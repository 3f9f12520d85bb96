"""kt-core: run the routed experts of Mixture-of-Experts models on the CPU.

Importing kt_core does no discovery and loads no backend: that happens at first use.
"""

from __future__ import annotations

from pathlib import Path

from . import backends, pool
from .errors import BackendError, BackendSelectionError, KTError, SettingError, WeightsError
from .host import Host, host
from .hybrid import generate_gpu_experts_masks, select_deferred_experts
from .moe import MoE, clear_buffer_cache
from .wrapper import KTMoEWrapper

__version__ = "0.1.0"


def get_include() -> str:
    """Directory holding kt/plugin.h, for building backends against this kt-core."""
    return str(Path(__file__).parent / "include")


def get_cmake_dir() -> str:
    """Directory holding ktcoreConfig.cmake (find_package(ktcore CONFIG))."""
    return str(Path(__file__).parent / "cmake")


def abi_version() -> tuple[int, int]:
    from . import _native

    return (_native.ABI_MAJOR, _native.ABI_MINOR)


__all__ = ["BackendError", "BackendSelectionError", "Host", "KTError", "KTMoEWrapper", "MoE", "SettingError", "WeightsError",
           "__version__", "abi_version", "backends", "clear_buffer_cache", "generate_gpu_experts_masks", "get_cmake_dir",
           "get_include", "host", "pool", "select_deferred_experts"]
