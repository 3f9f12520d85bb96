"""kt's stored INT8/INT4 codes (what `kt convert` writes) load to exactly the experts online
quantization builds, on every installed backend: same packed bytes' behaviour, same output."""

import numpy as np
import pytest
import torch

import kt_core
from kt_core.backends.selection import selector
from kt_core.formats import codes as kc

H, I, E, K = 256, 128, 4, 2
BACKENDS = sorted({c.backend for c in selector().candidates if c.runnable and "INT8" in c.methods})


def experts(seed=0):
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(E, I, H, generator=g).to(torch.bfloat16)
    up = torch.randn(E, I, H, generator=g).to(torch.bfloat16)
    down = torch.randn(E, H, I, generator=g).to(torch.bfloat16)
    return gate, up, down


def run(layer):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, H, generator=g)
    ids = torch.randint(0, E, (5, K), generator=g)
    w = torch.rand(5, K, generator=g)
    return layer(x, ids, w)


def quantize(method, m, group, zp):
    return kc.quantize_int8(m) if method == "INT8" else kc.quantize_int4(m, group, zp)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("method", "group", "zp"), [("INT8", 0, False), ("INT4", 32, False), ("INT4", 128, False),
                                                     ("INT4", 64, True)])
def test_codes_load_like_online_quantization(backend, method, group, zp):
    gate, up, down = experts()
    opts = dict(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method, backend=backend,
                group_size=group, zero_point=zp)
    online = kt_core.MoE(**opts)
    online.load(gate, up, down)
    stored = kt_core.MoE(**opts)
    batch = {}
    for e in range(E):
        q = [quantize(method, m[e], group or 128, zp) for m in (gate, up, down)]
        batch[e] = (*(p["codes"] for p in q), tuple(p["scales"] for p in q),
                    tuple(p["zeros"] for p in q) if zp else None)
    stored.load_experts(batch)
    assert torch.equal(run(online), run(stored))


def test_int8_codes_match_the_documented_rule():
    w = torch.tensor([[1.0, -2.0, 0.5, 254.0 / 127 * 0.25], [0.0, 0.0, 0.0, 0.0]])
    q = kc.quantize_int8(w)
    s = np.float32(2.0) / np.float32(127.0)
    assert q["scales"][0, 0] == s and q["scales"][1, 0] == 0
    expect = [int(np.sign(v) * np.floor(abs(np.float64(np.float32(v) / s)) + 0.5)) for v in w[0].tolist()]
    assert q["codes"][0].tolist() == expect and q["codes"][1].tolist() == [0, 0, 0, 0]


def test_int4_codes_pack_two_per_byte():
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1] = 3.5, -7.0          # s = 7 / 7 = 1: q = 4 (3.5 rounds away from zero) and -7
    q = kc.quantize_int4(w, 32, False)
    assert q["scales"][0, 0] == 1.0
    assert q["codes"][0, 0] == (4 + 8) | ((-7 + 8) << 4)
    assert (q["codes"][0, 1:] == 0x88).all()      # zeros are q = 0, stored u = 8 in both nibbles


def test_codes_refuse_bad_input():
    with pytest.raises(ValueError, match="group size must be one of"):
        kc.quantize_int4(torch.zeros(2, 64), 48, False)
    with pytest.raises(ValueError, match="group size 128 does not divide K = 64"):
        kc.quantize_int4(torch.zeros(2, 64), 128, False)
    layer = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="INT8", backend="reference")
    bad = np.zeros((I, H), np.int8)
    bad[3, 5] = -128
    ok_down = np.zeros((H, I), np.int8)
    with pytest.raises(ValueError, match=r"gate codes hold -128 at \[3, 5\]"):
        layer.load_expert(0, bad, bad.copy(), ok_down, scales=(np.ones((I, 1), np.float32),) * 2 + (np.ones((H, 1), np.float32),))
    floats = (np.zeros((I, H), np.float32),) * 2 + (np.zeros((H, I), np.float32),) + (None,) * 6
    with pytest.raises(ValueError, match="got expert 1 twice"):
        layer._layer.load_experts([1, 1], [floats, floats])
    nan = np.zeros((I, H), np.float32)
    nan[2, 2] = np.nan
    with pytest.raises(ValueError, match=r"expert 3 up hold NaN or Inf at \[2, 2\]"):
        layer.load_experts({2: floats[:3], 3: (floats[0], nan, floats[2])})
    assert not layer._layer.expert_loaded(2), "a failed batch installs nothing"
