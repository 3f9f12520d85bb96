"""Experts with gate, up and down biases (GPT-OSS): kt-core adds them around the backends' raw
gate/up products (plugin ABI 1.4's gate_up_raw_tile) and into the weighted sum."""

import numpy as np
import pytest

import kt_core
from kt_core.errors import WeightsError
from kt_core.testing.reference import moe_reference, random_moe, random_routing, relative_error

E, H, I, K = 6, 64, 32, 2


def biases(rng, experts=E):
    return tuple(rng.standard_normal(s).astype(np.float32) for s in ((experts, I), (experts, I), (experts, H)))


def layer(**kw):
    return kt_core.MoE(num_experts=kw.pop("experts", E), top_k=K, hidden_size=H, intermediate_size=I, method="FP32",
                       backend="reference", expert_bias=True, **kw)


def test_biases_with_a_permutation_and_gpu_experts():
    """Slot p holds logical expert p2l[p] with its biases; GPU-resident slots contribute nothing."""
    rng = np.random.default_rng(0)
    w, b = random_moe(rng, E, H, I), biases(rng)
    p2l = np.array([3, 1, 0, 5, 2, 4, 1])
    mask = [p == 2 for p in range(7)]
    m = layer(experts=7, gpu_experts_mask=mask, swiglu_limit=7.0, swiglu_alpha=1.702)
    m.load(*w, p2l, biases=b)
    x = rng.standard_normal((9, H)).astype(np.float32)
    ids, wt = random_routing(rng, 9, 7, K)
    want = moe_reference(x, *(a[p2l] for a in w), ids, wt, np.array(mask), swiglu_limit=7.0, swiglu_alpha=1.702,
                         biases=tuple(a[p2l] for a in b))
    assert relative_error(m(x, ids, wt), want) < 1e-5


def test_biases_are_required_and_refused_by_name():
    rng = np.random.default_rng(1)
    w, b = random_moe(rng, E, H, I), biases(rng)
    with pytest.raises(WeightsError, match=r"experts carry biases \(expert_bias=True\): pass biases="):
        layer().load(*w)
    plain = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="FP32", backend="reference")
    with pytest.raises(WeightsError, match="made without expert biases; create it with expert_bias=True"):
        plain.load(*w, biases=b)
    with pytest.raises(ValueError, match=r"up bias of expert 0 must be a contiguous float32 \[32\]"):
        layer().load_expert(0, w[0][0], w[1][0], w[2][0], biases=(b[0][0], b[1][0][:5], b[2][0]))
    bad = b[2].copy()
    bad[3, 7] = np.nan
    with pytest.raises(ValueError, match="expert 3's biases hold a non-finite value"):
        layer().load(*w, biases=(b[0], b[1], bad))


def test_backend_without_raw_tile_is_named():
    """A backend whose kernels have no gate_up_raw_tile serves no biased layer (blis runs whole
    GEMMs and keeps none); chosen explicitly, the refusal names it."""
    pytest.importorskip("kt_backend_blis")
    from kt_core.backends.selection import selector

    if not any(c.backend == "blis" and c.runnable for c in selector().candidates):
        pytest.skip("blis is not runnable here (uncalibrated; KT_BLIS_MIN_ROWS unset)")
    with pytest.raises(ValueError, match="has no gate_up_raw_tile"):
        kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="BF16", backend="blis",
                    expert_bias=True)
