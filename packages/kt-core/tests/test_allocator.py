import gc

import numpy as np

import kt_core
from kt_core import _native
from kt_core.testing.reference import random_moe


def _live() -> int:
    return sum(u["bytes_live"] for u in kt_core.pool.numa_usage())


def test_weights_are_accounted_and_freed_with_their_layer():
    kt_core.clear_buffer_cache()
    gc.collect()     # layers of earlier tests still in reference cycles would be freed mid-test
    before = _live()
    rng = np.random.default_rng(0)
    m = kt_core.MoE(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128, method="BF16", backend="reference")
    m.load(*random_moe(rng, 4, 256, 128))
    assert m.packed_bytes == 4 * 3 * 256 * 128 * 2
    assert _live() - before >= m.packed_bytes
    node_rows = [u for u in kt_core.pool.numa_usage() if u["node"] >= 0]
    assert node_rows, "weights are placed on a NUMA node"
    del m
    gc.collect()
    assert _live() == before


def test_scratch_is_reused_and_cleared():
    rng = np.random.default_rng(1)
    m = kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="FP32", backend="reference")
    m.load(*random_moe(rng, 4, 64, 32))
    x = rng.standard_normal((8, 64)).astype(np.float32)
    ids = np.zeros((8, 2), dtype=np.int64)
    w = np.ones((8, 2), dtype=np.float32)
    m(x, ids, w)
    size = _native.forward_scratch_bytes()
    assert size > 0
    m(x[:2], ids[:2], w[:2])
    assert _native.forward_scratch_bytes() == size, "a smaller forward reuses the scratch"
    kt_core.clear_buffer_cache()
    assert _native.forward_scratch_bytes() == 0
    m(x, ids, w)                              # and it comes back on demand


def test_grouped_products_keep_their_activation_rows_in_the_scratch():
    """Training's grouped products quantize their rows into the forwards' kept scratch (a fresh
    buffer per call cost page faults and zero-filling), and clear_sft_buffer_cache frees it."""
    from kt_core.sft import SFTMoEWrapper

    rng = np.random.default_rng(2)
    m = kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="BF16", backend="reference",
                    trainable=True)
    m.load(*random_moe(rng, 4, 64, 32))
    kt_core.clear_buffer_cache()
    counts = np.array([3, 0, 5, 2], np.int64)
    x = rng.standard_normal((10, 64)).astype(np.float32)
    m.grouped_gate_up(x, counts)
    size = _native.forward_scratch_bytes()
    assert size > 0
    m.grouped_gate_up(x[:4], np.array([1, 0, 2, 1], np.int64))
    m.grouped_down(rng.standard_normal((10, 32)).astype(np.float32), counts)
    assert _native.forward_scratch_bytes() == size, "smaller passes reuse the scratch"
    SFTMoEWrapper.clear_sft_buffer_cache()
    assert _native.forward_scratch_bytes() == 0
