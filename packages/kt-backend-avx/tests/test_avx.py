"""kt-backend-avx on every target this host runs: accuracy against FP32 over the same
quantized weights (kernel error) and against the unquantized weights (format error)."""

import subprocess
import sys

import numpy as np
import pytest

import kt_core
from kt_backend_avx import descriptor
from kt_core.backends import selection
from kt_core.testing.reference import bf16_round, moe_reference, random_moe, random_routing, relative_error

VARIANTS = [v.name for v in descriptor.variants]
# Kernel error bound per method (max |Δ| / RMS vs FP32 over the stored weights). The issue
# asks for <= 1e-2 (BF16) and 2e-2 (quantized); these are what the kernels reach, with margin.
KERNEL_TOL = {"BF16": 1e-4}


@pytest.fixture(params=VARIANTS)
def variant(request, monkeypatch):
    v = next(x for x in descriptor.variants if x.name == request.param)
    missing = kt_core.host().missing(v.requires)
    if missing:
        pytest.skip(f"{v.name} needs {', '.join(missing)}, which this host lacks")
    monkeypatch.setenv("KT_CPU_VARIANT", v.name)
    selection.reset()
    return v.name


def test_descriptor_import_is_pure():
    r = subprocess.run([sys.executable, "-c", "import sys, kt_backend_avx; print('kt_backend_avx._native' in sys.modules)"],
                       capture_output=True, text=True)
    assert r.stdout.strip() == "False", r.stderr


def test_best_variant_is_chosen():
    runnable = [v for v in descriptor.variants if not kt_core.host().missing(v.requires)]
    if not runnable:
        pytest.skip("this host runs no AVX variant")
    layer = kt_core.MoE(num_experts=2, top_k=1, hidden_size=32, intermediate_size=32, method="BF16")
    assert layer.backend == f"avx/{max(runnable, key=lambda v: v.rank).name}"


@pytest.mark.parametrize("hidden,intermediate", [(256, 96), (130, 70), (2048, 64)])
@pytest.mark.parametrize("tokens", [1, 5, 64, 200])
def test_bf16_accuracy(variant, hidden, intermediate, tokens):
    rng = np.random.default_rng(hidden + tokens)
    E, K = 8, 2
    w = random_moe(rng, E, hidden, intermediate)
    layer = kt_core.MoE(num_experts=E, top_k=K, hidden_size=hidden, intermediate_size=intermediate, method="BF16")
    assert layer.backend == f"avx/{variant}"
    layer.load(*w)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids, wt = random_routing(rng, tokens, E, K)
    out = layer(x, ids, wt)
    kernel_err = relative_error(out, moe_reference(x, *[bf16_round(a) for a in w], ids, wt))
    format_err = relative_error(out, moe_reference(x, *w, ids, wt))
    assert kernel_err <= KERNEL_TOL["BF16"], kernel_err
    assert format_err <= 4e-2, format_err   # bf16 weights themselves: measured up to 2.9e-2 here


def test_bf16_input_takes_the_single_pass(variant):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    w = random_moe(rng, 4, 128, 64)
    layer = kt_core.MoE(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64, method="BF16")
    layer.load(*w)
    x = torch.from_numpy(bf16_round(rng.standard_normal((9, 128)).astype(np.float32))).bfloat16()
    ids, wt = random_routing(rng, 9, 4, 2)
    out = layer(x, ids, wt)
    assert out.dtype == torch.bfloat16
    want = moe_reference(x.float().numpy(), *[bf16_round(a) for a in w], ids, wt)
    assert relative_error(out.float().numpy(), want) <= 2.0**-8 * np.abs(want).max() / np.sqrt(np.mean(want**2))


def test_bf16_refuses_integer_codes(variant):
    layer = kt_core.MoE(num_experts=2, top_k=1, hidden_size=32, intermediate_size=32, method="BF16")
    codes = np.zeros((32, 32), dtype=np.int8)
    with pytest.raises(ValueError, match="BF16: gate must be floating point .* got int8"):
        layer.load_expert(0, codes, codes, codes)
