"""Where KTMoEWrapper(weight_path=...) gets its experts from files.

Reading model folders, kt converted folders and GGUF files is the application's job (the `kt`
package), not the runtime's: kt-core finds a reader through the entry point group
`kt.weight_sources` instead of importing one, so the runtime depends on nothing above it and a
deployment that loads tensors itself (load_weights_from_tensors) needs no reader at all.

A weight source is an object with two methods:
  layer_settings(path, layer_idx, method) -> dict   settings fixed by the files, any of
      group_size, zero_point (a kt converted folder's), weight_types (a GGUF layer's ggml types),
      swiglu_limit / swiglu_alpha with expert_bias (a model folder whose experts clamp their
      activation: GPT-OSS's SwiGLU with biases, DeepSeek-V4's SiLU)
  load_layer(moe, path, layer_idx, physical_to_logical_map, quantize_at_load) -> None
and, for layerwise prefill (KTMoEWrapper.submit_write_weight_scale_to_buffer), optionally
  write_expert_for_gpu(path, layer_idx, expert, method, intermediate, tp, w13_weight_ptrs,
      w13_scale_ptrs, w2_weight_ptrs, w2_scale_ptrs) -> None
and, for MXFP4_SFT's load_weights (DeepSeek-V4-Flash's expert tensors), optionally
  native_mxfp4_experts(path, layer_idx) -> dict   as kt-kernel's MXFP4SafeTensorLoader.load_experts()
"""

from __future__ import annotations

import functools
from importlib.metadata import entry_points

from .errors import KTError

ENTRY_POINT_GROUP = "kt.weight_sources"


def has_weight_source() -> bool:
    return bool(entry_points(group=ENTRY_POINT_GROUP))


@functools.cache
def weight_source():
    """The installed weight source (the first registered, by name); KTError when none is."""
    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    if not found:
        raise KTError("weight_path= reads experts from model folders, kt converted folders and GGUF files "
                      "through the kt application, which is not installed: pip install kt (or load the "
                      "tensors yourself with load_weights_from_tensors)")
    return found[0].load()
