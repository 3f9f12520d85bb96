"""kt_core.rows: training's row passes against NumPy in float64, the gated activation on every ISA
level the host runs (its exponential is kt-core's own, compiled per level)."""

import numpy as np
import pytest

from kt_core import host
from kt_core.rows import gated_rows_forward, gather_rows, sum_rows

from conftest import run_python

CHECK = """
import numpy as np
from kt_core.rows import gated_rows_backward, gated_rows_forward
rng = np.random.default_rng(0)
for S, I in [(37, 50), (5, 16), (64, 768)]:
    gu = (rng.standard_normal((S, 2 * I)) * 6).astype(np.float32)
    gu[0, :3] = [100.0, -100.0, 0.0]   # saturated sigmoid both ways, and zero
    w = rng.random(S).astype(np.float32)
    h = np.empty((S, I), np.float32)
    gated_rows_forward(gu, w, h)
    g, u, w64 = gu[:, :I].astype(np.float64), gu[:, I:].astype(np.float64), w.astype(np.float64)
    s = 1 / (1 + np.exp(-g))
    want = g * s * u * w64[:, None]
    assert np.abs(h - want).max() <= 1e-5 * np.abs(want).max(), ("h", S, I)
    dh = rng.standard_normal((S, I)).astype(np.float32)
    dgu, dw = np.empty_like(gu), np.empty_like(w)
    gated_rows_backward(dh, gu, w, dgu, dw)
    d64 = dh.astype(np.float64)
    wants = {"dgate": d64 * u * w64[:, None] * s * (1 + g * (1 - s)), "dup": d64 * g * s * w64[:, None],
             "dw": (d64 * g * s * u).sum(axis=1)}
    for name, got in (("dgate", dgu[:, :I]), ("dup", dgu[:, I:]), ("dw", dw)):
        assert np.abs(got - wants[name]).max() <= 1e-5 * np.abs(wants[name]).max(), (name, S, I)
    # With rows grouped by expert, the down adapter's dA_e = sum of g[i]ᵀ h[i] over e's rows from the
    # same pass (h recomputed in chunks of rows): the same gradients, and dA (zero for an empty expert).
    counts = np.array([S - S // 3, 0, S // 3], np.int64)
    rank = 3
    gl = rng.standard_normal((S, rank)).astype(np.float32)
    da = np.full((3, rank, I), np.nan, np.float32)
    dgu2, dw2 = np.empty_like(gu), np.empty_like(w)
    gated_rows_backward(dh, gu, w, dgu2, dw2, counts=counts, g=gl, da=da)
    assert np.array_equal(dgu2, dgu) and np.array_equal(dw2, dw), ("gradients with dA", S, I)
    e_of = np.repeat(np.arange(3), counts)
    want_da = np.stack([gl[e_of == e].astype(np.float64).T @ want[e_of == e] for e in range(3)])
    assert np.abs(da - want_da).max() <= 1e-5 * np.abs(want_da).max(), ("dA", S, I)
    assert not da[1].any()

    # The shaped activations: GPT-OSS's clamped SwiGLU (limit, alpha), DeepSeek-V4's clamped SiLU
    # (limit, 0), a sigmoid slope without clamps (0, alpha). Inputs across both limits, and exactly on
    # them (the clamps pass the gradient there, as torch's clamp does).
    L = 7.0
    gu[1, :4] = [L, 2 * L, -L, -2 * L]
    gu[1, I:I + 4] = [L, 2 * L, -L, -2 * L]
    g, u = gu[:, :I].astype(np.float64), gu[:, I:].astype(np.float64)
    for limit, A in ((L, 1.702), (L, 0.0), (0.0, 1.702)):
        bound = limit or np.inf
        slope, shift = (A, 1.0) if A else (1.0, 0.0)
        gated_rows_forward(gu, w, h, (limit, A))
        gc, uc = np.minimum(g, bound), np.clip(u, -bound, bound)
        sc = 1 / (1 + np.exp(-slope * gc))
        want = (uc + shift) * gc * sc * w64[:, None]
        assert np.abs(h - want).max() <= 1e-5 * np.abs(want).max(), ("shaped h", limit, A, S, I)
        gated_rows_backward(dh, gu, w, dgu, dw, (limit, A))
        wants = {"dgate": np.where(g <= bound, d64 * (uc + shift) * w64[:, None] * sc * (1 + slope * gc * (1 - sc)), 0),
                 "dup": np.where(np.abs(u) <= bound, d64 * gc * sc * w64[:, None], 0.0),
                 "dw": (d64 * (uc + shift) * gc * sc).sum(axis=1)}
        for name, got in (("dgate", dgu[:, :I]), ("dup", dgu[:, I:]), ("dw", dw)):
            assert np.abs(got - wants[name]).max() <= 1e-5 * np.abs(wants[name]).max(), (name, limit, A, S, I)
    # The limit after SiLU (Step-3.5, Ling-2.5): min(SiLU(g), limit) * clamp(u), the gate's gradient
    # passing where SiLU(g) <= limit. Inputs whose SiLU crosses the limit and lands exactly on it.
    gu[2, :2] = [L + 1.0, 3.0]
    gated_rows_forward(gu, w, h, (L, 0.0, True))
    g, u = gu[:, :I].astype(np.float64), gu[:, I:].astype(np.float64)
    s = 1 / (1 + np.exp(-g))
    silu, uc = g * s, np.clip(u, -L, L)
    want = np.minimum(silu, L) * uc * w64[:, None]
    assert np.abs(h - want).max() <= 1e-5 * np.abs(want).max(), ("after h", S, I)
    assert (silu > L).any() and (silu < L).any()
    for lora in (False, True):   # the plain pass, and the one giving the down adapter's dA
        extra = dict(counts=counts, g=gl, da=da) if lora else {}
        gated_rows_backward(dh, gu, w, dgu, dw, (L, 0.0, True), **extra)
        wants = {"dgate": np.where(silu <= L, d64 * uc * w64[:, None] * s * (1 + g * (1 - s)), 0),
                 "dup": np.where(np.abs(u) <= L, d64 * np.minimum(silu, L) * w64[:, None], 0.0),
                 "dw": (d64 * np.minimum(silu, L) * uc).sum(axis=1)}
        for name, got in (("dgate", dgu[:, :I]), ("dup", dgu[:, I:]), ("dw", dw)):
            assert np.abs(got - wants[name]).max() <= 1e-5 * np.abs(wants[name]).max(), ("after", name, S, I, lora)
        if lora:
            want_da = np.stack([gl[e_of == e].astype(np.float64).T @ want[e_of == e] for e in range(3)])
            assert np.abs(da - want_da).max() <= 1e-5 * np.abs(want_da).max(), ("after dA", S, I)
    # GELU-tanh (Gemma 4): GELU's tanh form of g, times u; against tanh's own formula, as torch's
    # gelu(approximate="tanh") writes it (kt computes it as g * sigmoid(2z)).
    c = np.sqrt(2 / np.pi)
    z = c * (g + 0.044715 * g ** 3)
    t = np.tanh(z)
    gelu = 0.5 * g * (1 + t)
    dgelu = 0.5 * (1 + t) + 0.5 * g * (1 - t ** 2) * c * (1 + 3 * 0.044715 * g ** 2)
    gated_rows_forward(gu, w, h, (0.0, 0.0, False, "gelu_tanh"))
    want = gelu * u * w64[:, None]
    assert np.abs(h - want).max() <= 1e-5 * np.abs(want).max(), ("gelu h", S, I)
    for lora in (False, True):
        extra = dict(counts=counts, g=gl, da=da) if lora else {}
        gated_rows_backward(dh, gu, w, dgu, dw, (0.0, 0.0, False, "gelu_tanh"), **extra)
        wants = {"dgate": d64 * u * w64[:, None] * dgelu, "dup": d64 * gelu * w64[:, None],
                 "dw": (d64 * gelu * u).sum(axis=1)}
        for name, got in (("dgate", dgu[:, :I]), ("dup", dgu[:, I:]), ("dw", dw)):
            assert np.abs(got - wants[name]).max() <= 1e-5 * np.abs(wants[name]).max(), ("gelu", name, S, I, lora)
        if lora:
            want_da = np.stack([gl[e_of == e].astype(np.float64).T @ want[e_of == e] for e in range(3)])
            assert np.abs(da - want_da).max() <= 1e-5 * np.abs(want_da).max(), ("gelu dA", S, I)
    A = 1.702
    after = "a limit after SiLU needs swiglu_limit > 0 and swiglu_alpha 0"
    gelu_bad = "GELU-tanh takes no limit, alpha or limit after SiLU"
    for bad, message in (((0.0, 0.0, True), after), ((L, A, True), after), ((-1.0, A), "finite swiglu_limit >= 0"),
                         ((L, 0.0, False, "gelu_tanh"), gelu_bad), ((0.0, 0.0, True, "gelu_tanh"), after),
                         ((0.0, 0.0, False, "gelu"), "gate_activation is 'silu' or 'gelu_tanh'"),
                         ((float("nan"), A), "finite swiglu_limit >= 0"), ((L, float("inf")), "finite swiglu_limit >= 0")):
        try:
            gated_rows_forward(gu, w, h, bad)
        except ValueError as e:
            assert message in str(e), e
        else:
            raise AssertionError(bad)
print("ok")
"""


@pytest.mark.parametrize("level", ["x86-64", "x86-64-v3", "x86-64-v4"])
def test_gated_rows_match_numpy_float64(level):
    """Forward and backward within 1e-5 of the largest magnitude per output (f32 arithmetic and the
    polynomial exponential), widths with and without a vector remainder, saturated inputs included."""
    h = host()
    if h.arch != "x86_64":
        pytest.skip(f"ISA levels are x86's; this host is {h.arch}")
    missing = [f for f in {"x86-64-v3": ["avx2", "fma"], "x86-64-v4": ["avx512f", "avx512vl"]}.get(level, [])
               if f not in h.features]
    if missing:
        pytest.skip(f"this host lacks {', '.join(missing)} for {level}")
    r = run_python(CHECK, KT_MAX_ISA=level)
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_gated_backward_with_an_adapter_refuses_bad_arguments():
    from kt_core.rows import gated_rows_backward

    S, I = 6, 16
    gu, dh, w = np.zeros((S, 2 * I), np.float32), np.zeros((S, I), np.float32), np.zeros(S, np.float32)
    out = (np.zeros_like(gu), np.zeros_like(w))
    g, da = np.zeros((S, 2), np.float32), np.zeros((2, 2, I), np.float32)
    with pytest.raises(ValueError, match="needs counts, g and da together"):
        gated_rows_backward(dh, gu, w, *out, g=g, da=da)
    with pytest.raises(ValueError, match="counts sum to 5 rows; gate_up holds 6"):
        gated_rows_backward(dh, gu, w, *out, counts=np.array([5, 0], np.int64), g=g, da=da)
    with pytest.raises(ValueError, match=r"g must have shape \[6, 2\]"):
        gated_rows_backward(dh, gu, w, *out, counts=np.array([6, 0], np.int64), g=np.zeros((S, 3), np.float32), da=da)


def test_gather_and_sum_are_each_others_adjoint():
    rng = np.random.default_rng(1)
    T, K, W = 50, 4, 300
    ids = np.stack([rng.permutation(8)[:K] for _ in range(T)]).reshape(-1)
    ids[::7] = -1
    slot = np.argsort(np.where(ids >= 0, ids, 99), kind="stable")[: int((ids >= 0).sum())]
    token = (slot // K).astype(np.int64)
    row_of_slot = np.full(T * K, -1, np.int64)
    row_of_slot[slot] = np.arange(slot.size)
    x = rng.standard_normal((T, W)).astype(np.float32)
    rows = np.empty((slot.size, W), np.float32)
    gather_rows(x, token, rows)
    np.testing.assert_array_equal(rows, x[token])
    out = np.empty((T, W), np.float32)
    sum_rows(rows, row_of_slot.reshape(T, K), out)
    want = np.zeros((T, W), np.float64)
    np.add.at(want, token, rows.astype(np.float64))
    assert np.abs(out - want).max() <= 1e-5 * np.abs(want).max()


def test_refuses_bad_indices():
    x, rows, out = np.zeros((4, 8), np.float32), np.zeros((3, 8), np.float32), np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match=r"token\[1\] = 4 is outside \[0, 4\)"):
        gather_rows(x, np.array([0, 4, 1], np.int64), rows)
    with pytest.raises(ValueError, match=r"row_of_slot holds 3, outside \[-1, 3\)"):
        sum_rows(rows, np.array([[0, 3], [1, -1], [2, -1], [-1, -1]], np.int64), out)
    with pytest.raises(ValueError, match=r"gate_up must be \[rows, 2 \* intermediate\]"):
        gated_rows_forward(np.zeros((3, 5), np.float32), np.zeros(3, np.float32), np.zeros((3, 2), np.float32))
