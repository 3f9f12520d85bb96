"""kt_core.lora: per-expert LoRA over grouped rows against NumPy in float64, on every ISA level
the host runs (the loops are compiled per level and picked after host detection)."""

import numpy as np
import pytest

from kt_core import host
from kt_core.lora import grouped_lora_backward, grouped_lora_forward

from conftest import run_python

CHECK = """
import numpy as np
from kt_core.lora import grouped_lora_backward, grouped_lora_forward
rng = np.random.default_rng(0)
worst = 0.0

def dense(b, blocks):
    # A block-diagonal B [E, N, r/blocks] as the dense [E, N, r] it stands for.
    E, N, rb = b.shape
    d = np.zeros((E, N, rb * blocks), b.dtype)
    nb = N // blocks
    for q in range(blocks):
        d[:, q * nb:(q + 1) * nb, q * rb:(q + 1) * rb] = b[:, q * nb:(q + 1) * nb]
    return d


def blocked(d, blocks):
    E, N, r = d.shape
    nb, rb = N // blocks, r // blocks
    return np.concatenate([d[:, q * nb:(q + 1) * nb, q * rb:(q + 1) * rb] for q in range(blocks)], axis=1)


# (E, K, N, r, blocks, accumulate_dx): blocks=2 aligned to whole vectors and rank blocks (the loops
# skip the zeros: N/2 = 64, r/2 = 8) and not (N/2 = 25, r/2 = 3); three blocks; dx accumulated.
for E, K, N, r, blocks, acc in [(3, 40, 20, 1, 1, False), (4, 64, 128, 8, 1, True), (2, 33, 50, 13, 1, False),
                                (3, 256, 96, 64, 1, False), (4, 72, 128, 16, 2, True), (3, 40, 50, 6, 2, False),
                                (2, 48, 96, 24, 3, True)]:
    counts = np.array([37, 0] + [3] * (E - 2), np.int64)   # 37: whole register tiles of every height, and the rest
    S = int(counts.sum())
    x = rng.standard_normal((S, K)).astype(np.float32)
    a = rng.standard_normal((E, r, K)).astype(np.float32)
    b = rng.standard_normal((E, N, r // blocks)).astype(np.float32)
    base = rng.standard_normal((S, N)).astype(np.float32)
    dy = rng.standard_normal((S, N)).astype(np.float32)
    out, xa = base.copy(), np.empty((S, r), np.float32)
    grouped_lora_forward(x, counts, a, b, 0.5, xa, out, blocks=blocks)
    dx0 = rng.standard_normal(x.shape).astype(np.float32) if acc else np.zeros_like(x)
    dx, da, db = dx0.copy(), np.empty_like(a), np.empty_like(b)
    grouped_lora_backward(dy, x, xa, counts, a, b, 0.5, dx, da, db, blocks=blocks, accumulate_dx=acc)
    e = np.repeat(np.arange(E), counts)
    b_dense = dense(b, blocks)
    x64, a64, b64, dy64 = x.astype(np.float64), a[e].astype(np.float64), b_dense[e].astype(np.float64), dy.astype(np.float64)
    xa64 = np.einsum("sk,srk->sr", x64, a64)
    g = np.einsum("sn,snr->sr", dy64, b64) * 0.5
    want = {
        "out": base + 0.5 * np.einsum("sr,snr->sn", xa64, b64), "xa": xa64,
        "dx": dx0 + np.einsum("sr,srk->sk", g, a64),
        "da": np.stack([np.einsum("sr,sk->rk", g[e == i], x64[e == i]) for i in range(E)]),
        "db": blocked(np.stack([0.5 * np.einsum("sn,sr->nr", dy64[e == i], xa64[e == i]) for i in range(E)]), blocks),
    }
    got = {"out": out, "xa": xa, "dx": dx, "da": da, "db": db}
    for k in got:
        err = np.abs(got[k] - want[k]).max() / max(np.abs(want[k]).max(), 1e-30)
        assert err < 1e-5, (E, K, N, r, blocks, k, err)
        worst = max(worst, err)
    assert not da[1].any() and not db[1].any(), "an expert without rows gets zero gradients"
    # dx left to the base product (g written instead), the rows read from x[token] where they lie.
    token = rng.permutation(S + 3)[:S].astype(np.int64)
    xt = rng.standard_normal((S + 3, K)).astype(np.float32)
    xt[token] = x
    g_out, da2, db2 = np.empty((S, r), np.float32), np.empty_like(a), np.empty_like(b)
    grouped_lora_backward(dy, xt, xa, counts, a, b, 0.5, None, da2, db2, blocks=blocks, g=g_out, token=token)
    g_out2, db3 = np.empty((S, r), np.float32), np.empty_like(b)
    grouped_lora_backward(dy, None, xa, counts, a, b, 0.5, None, None, db3, blocks=blocks, g=g_out2)   # dA left out
    assert np.array_equal(g_out2, g_out) and np.array_equal(db3, db2), (E, K, N, r, blocks, "without x")
    for k, got_k, want_k in (("g", g_out, g), ("da", da2, want["da"]), ("db", db2, want["db"])):
        err = np.abs(got_k - want_k).max() / max(np.abs(want_k).max(), 1e-30)
        assert err < 1e-5, (E, K, N, r, blocks, "token/g", k, err)
        worst = max(worst, err)
print("worst", worst)
"""

LEVELS = ["x86-64", "x86-64-v3", "x86-64-v4"]


@pytest.mark.parametrize("level", LEVELS)
def test_matches_numpy_float64(level):
    """Odd K and N (padded to whole vectors), ranks 1, 8, 13 (padded to blocks of 8) and 64, an expert
    without rows, block-diagonal B (2 and 3 blocks, aligned and not), dx accumulated; max |Δ| / max |ref|
    per output within 1e-5 (f32 accumulation)."""
    h = host()
    if h.arch != "x86_64":
        pytest.skip(f"ISA levels are x86's; this host is {h.arch}")
    missing = [f for f in {"x86-64-v3": ["avx2", "fma"], "x86-64-v4": ["avx512f", "avx512vl"]}.get(level, [])
               if f not in h.features]
    if missing:
        pytest.skip(f"this host lacks {', '.join(missing)} for {level}")
    r = run_python(CHECK, KT_MAX_ISA=level)
    assert r.returncode == 0, r.stderr
    assert "worst" in r.stdout


def test_matches_numpy_float64_in_process():
    """The same check at the level this process picked, in process: how it runs on aarch64 (under
    qemu-aarch64 in `nox -s aarch64`), where the x86 levels above skip."""
    scope: dict = {}
    exec(CHECK, scope)


def test_refuses_bad_arguments():
    x, counts = np.zeros((4, 8), np.float32), np.array([4, 0], np.int64)
    a, b = np.zeros((2, 2, 8), np.float32), np.zeros((2, 6, 2), np.float32)
    xa, out = np.zeros((4, 2), np.float32), np.zeros((4, 6), np.float32)
    with pytest.raises(ValueError, match="counts sum to 3 rows; x holds 4"):
        grouped_lora_forward(x, np.array([3, 0], np.int64), a, b, 1.0, xa, out)
    with pytest.raises(ValueError, match=r"out must have shape \[4, 6\]"):
        grouped_lora_forward(x, counts, a, b, 1.0, xa, np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="LoRA rank 65"):
        grouped_lora_forward(x, counts, np.zeros((2, 65, 8), np.float32), np.zeros((2, 6, 65), np.float32), 1.0,
                             np.zeros((4, 65), np.float32), out)
    with pytest.raises(ValueError, match=r"LoRA blocks=3 must divide the rank \(2\) and N \(6\)"):
        grouped_lora_forward(x, counts, a, b, 1.0, xa, out, blocks=3)
    with pytest.raises(ValueError, match=r"b must have shape \[2, 6, 1\]"):
        grouped_lora_forward(x, counts, a, b, 1.0, xa, out, blocks=2)
    with pytest.raises(TypeError, match="float32"):
        grouped_lora_backward(np.zeros((4, 6)), x, xa, counts, a, b, 1.0, np.zeros_like(x), np.zeros_like(a),
                              np.zeros_like(b))
    grads = (np.zeros_like(a), np.zeros_like(b))
    with pytest.raises(ValueError, match="takes dx or g"):
        grouped_lora_backward(out, x, xa, counts, a, b, 1.0, None, *grads)
    with pytest.raises(ValueError, match=r"token\[2\] = 9 is out of range for x's 4 rows"):
        grouped_lora_backward(out, x, xa, counts, a, b, 1.0, None, *grads, g=np.zeros((4, 2), np.float32),
                              token=np.array([0, 1, 9, 2], np.int64))
    with pytest.raises(ValueError, match="x and da go together"):
        grouped_lora_backward(out, None, xa, counts, a, b, 1.0, None, grads[0], grads[1], g=np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="dx and token need x"):
        grouped_lora_backward(out, None, xa, counts, a, b, 1.0, np.zeros_like(x), None, grads[1])
    with pytest.raises(ValueError, match=r"g must have shape \[4, 2\]"):
        grouped_lora_backward(out, x, xa, counts, a, b, 1.0, None, *grads, g=np.zeros((4, 3), np.float32))
