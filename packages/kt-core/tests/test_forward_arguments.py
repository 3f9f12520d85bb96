"""How forward arguments reach the native layer: CPU torch tensors already in the kernels' dtypes
and layout go as addresses (_arrays.direct_forward_args), everything else through the checked
DLPack path. Both must give the same numbers, and the checked path must still explain bad input."""

import numpy as np
import pytest

import kt_core
from kt_core import _arrays
from kt_core.testing.reference import random_moe, random_routing

torch = pytest.importorskip("torch")

E, H, I, K = 8, 64, 32, 3


@pytest.fixture(scope="module")
def layer():
    rng = np.random.default_rng(0)
    m = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="BF16", backend="reference",
                    max_tokens=16)
    m.load(*random_moe(rng, E, H, I))
    return m


def inputs(tokens: int, dtype, seed: int = 1):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((tokens, H)).astype(np.float32)).to(dtype)
    ids, w = random_routing(rng, tokens, E, K)
    return x, torch.from_numpy(ids), torch.from_numpy(w)


def strided(t):
    """The same values in a non-contiguous view (every other column of a wider tensor)."""
    wide = torch.zeros((t.shape[0], 2 * t.shape[1]), dtype=t.dtype)
    view = wide[:, ::2]
    view.copy_(t)
    return view


def direct(layer, x, ids, w):
    return _arrays.direct_forward_args(x, ids, w, layer.hidden_size, layer.top_k, layer.max_tokens)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 5, 16])
def test_direct_path_equals_checked_path(layer, dtype, tokens):
    x, ids, w = inputs(tokens, dtype)
    assert direct(layer, x, ids, w) is not None
    out = layer(x, ids, w)
    # A non-contiguous view of the same values takes the checked path (copy, then DLPack).
    x_view = strided(x)
    assert not x_view.is_contiguous() and direct(layer, x_view, ids, w) is None
    checked = layer(x_view, ids, w)
    assert out.dtype == dtype and out.shape == (tokens, H)
    assert torch.equal(out, checked)
    # And NumPy, which never takes the direct path, agrees for float32.
    if dtype == torch.float32:
        np.testing.assert_array_equal(out.numpy(), layer(x.numpy(), ids.numpy(), w.numpy()))


def test_submit_sync_direct_path_keeps_its_arguments_alive(layer):
    x, ids, w = inputs(5, torch.bfloat16)
    expected = layer(x, ids, w)
    layer.submit(x.clone(), ids.clone(), w.clone())   # the only references are the pool's
    assert torch.equal(layer.sync(), expected)


def test_ineligible_tensors_take_the_checked_path(layer):
    x, ids, w = inputs(4, torch.bfloat16)
    expected = layer(x, ids, w).float()
    cases = {
        "int32 ids": (x, ids.to(torch.int32), w),
        "float16 hidden states": (x.to(torch.float16), ids, w),
        "float64 weights": (x, ids, w.double()),
        "a tensor subclass": (torch.nn.Parameter(x, requires_grad=False), ids, w),
        "non-contiguous ids": (x, strided(ids), w),
    }
    for name, args in cases.items():
        assert direct(layer, *args) is None, name
        got = layer(*args).float()
        tol = 1e-2 if name == "float16 hidden states" else 0
        assert torch.allclose(got, expected, rtol=tol, atol=tol * float(expected.abs().max())), name


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda x, ids, w: (x[:, :-1], ids, w), "hidden_states must have shape"),
        (lambda x, ids, w: (x, ids[:, :-1], w), "topk_ids must have shape"),
        (lambda x, ids, w: (x, ids, w[:-1]), "topk_weights must have shape"),
        (lambda x, ids, w: (torch.cat([x] * 5), torch.cat([ids] * 5), torch.cat([w] * 5)), "chunked_prefill_size"),
        (lambda x, ids, w: (x, ids + E, w), "outside"),
    ],
)
def test_bad_input_still_explained(layer, make, message):
    args = make(*inputs(4, torch.bfloat16))
    with pytest.raises(ValueError, match=message):
        layer(*args)


def test_forward_at_rejects_what_it_cannot_take(layer):
    x, ids, w = inputs(1, torch.bfloat16)
    out = torch.empty((1, H), dtype=torch.bfloat16)
    ptrs = dict(hidden=x.data_ptr(), topk_ids=ids.data_ptr(), topk_weights=w.data_ptr(), out=out.data_ptr())
    native = layer._layer
    with pytest.raises(ValueError, match="dtype code 7"):
        native.forward_at(ptrs["hidden"], 7, 1, ptrs["topk_ids"], ptrs["topk_weights"], ptrs["out"], 1)
    with pytest.raises(ValueError, match="-1 tokens"):
        native.forward_at(ptrs["hidden"], 1, -1, ptrs["topk_ids"], ptrs["topk_weights"], ptrs["out"], 1)
    with pytest.raises(ValueError, match="null address"):
        native.forward_at(0, 1, 1, ptrs["topk_ids"], ptrs["topk_weights"], ptrs["out"], 1)
