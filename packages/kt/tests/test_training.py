"""kt.training: the routed experts' autograd node against torch autograd in float64.

Every gradient (hidden states, routing weights, the four LoRA factors) of kt's LoRAExperts is held
to the same LoRA'd experts computed by torch in float64 on the weights kt holds — the method's
dequantized weights, so the comparison measures kt's kernels and plumbing, not the format. The
tolerances are per method: FP32 and BF16 carry activations (near-)exactly (measured: <= 6e-7 on
the reference backend, 2.1e-6 on avx's BF16), INT8/INT4 quantize the forward's activations to int8
(two planes), which moves the gate values and through them every gradient (measured on avx: up to
1.2e-4 of each tensor's largest magnitude); the transposed products (backward) use the gradients as
given. Errors are max |kt - torch| / max |torch| per tensor.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kt_core
from kt.training import LoRAExperts, Routing, lora_targets
from kt_core.errors import KTError
from kt_core.testing.quantize import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8

E, K, H, I, T = 8, 2, 128, 64, 24
# method -> (MoE keyword arguments, relative tolerance of every output and gradient)
METHODS = {
    "FP32": ({}, 2e-6),
    "BF16": ({}, 1e-5),
    "INT8": ({}, 5e-4),
    "INT4": ({"group_size": 32}, 5e-4),
    "INT4-zp": ({"group_size": 64, "zero_point": True}, 5e-4),
}


def _held_weights(method: str, kwargs: dict, w: torch.Tensor) -> torch.Tensor:
    """The weights a layer of `method` holds for w, dequantized (float64)."""
    a = w.numpy()
    if method == "BF16":
        return w.bfloat16().double()
    if method == "INT8":
        return torch.from_numpy(dequantize_int8(*quantize_int8(a))).double()
    if method.startswith("INT4"):
        codes = quantize_int4(a, kwargs["group_size"], kwargs.get("zero_point", False))
        return torch.from_numpy(dequantize_int4(*codes)).double()
    return w.double()


def _torch_experts(x, ids, w, gate, up, down, lora, scaling, biases=None, swiglu=None):
    """The LoRA'd experts, one (token, pick) at a time, in float64; with biases (gate [E, I], up [E, I],
    down [E, H]) and swiglu=(limit, alpha), GPT-OSS's experts (transformers' GptOssExperts)."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            gu = torch.cat([gate[e] @ x[t], up[e] @ x[t]])
            if "gate_up_A" in lora:
                gu = gu + scaling * (lora["gate_up_B"][e] @ (lora["gate_up_A"][e] @ x[t]))
            for half, t_ in enumerate(("gate", "up")):   # separate adapters (kt-kernel's layout)
                if f"{t_}_A" in lora:
                    delta = scaling * (lora[f"{t_}_B"][e] @ (lora[f"{t_}_A"][e] @ x[t]))
                    gu = gu + torch.cat([delta, torch.zeros_like(delta)] if half == 0 else [torch.zeros_like(delta), delta])
            if biases is not None:
                gu = gu + torch.cat([biases[0][e], biases[1][e]])
            if swiglu is not None:
                g, u = gu[:I].clamp(max=swiglu[0]), gu[I:].clamp(-swiglu[0], swiglu[0])
                h = (u + 1) * g * torch.sigmoid(swiglu[1] * g)
            else:
                h = torch.nn.functional.silu(gu[:I]) * gu[I:]
            y = down[e] @ h
            if "down_A" in lora:
                y = y + scaling * (lora["down_B"][e] @ (lora["down_A"][e] @ h))
            if biases is not None:
                y = y + biases[2][e]
            out[t] += w[t, j] * y
    return out


def _routing(gen):
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    ids[3, 1] = -1          # a pick another device computes
    ids[5] = -1             # a token with no kt expert at all
    return ids, torch.rand(T, K, generator=gen)


def _layer(method: str, backend: str | None, gate, up, down, target=("gate_up", "down"), recompute=False,
           biases=None, swiglu=(0.0, 0.0), rank=4, train_weights=False):
    """train_weights: the expert weights train too, as parameters holding the method's values (so
    torch's float64 reference differentiates the weights kt computes with)."""
    kwargs = METHODS[method][0]
    moe = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method=method.split("-")[0],
                      backend=backend, trainable=True, expert_bias=biases is not None, swiglu_limit=swiglu[0],
                      swiglu_alpha=swiglu[1], **kwargs)
    moe.load(gate, up, down, biases=biases)
    weights = None
    if train_weights:
        held = [_held_weights(method, kwargs, w).float() for w in (gate, up, down)]
        weights = (torch.nn.Parameter(torch.cat(held[:2], dim=1)), torch.nn.Parameter(held[2]))
    layer = LoRAExperts(moe, rank=rank, alpha=8.0, target=target, recompute=recompute, expert_weights=weights)
    with torch.no_grad():   # B starts at zero (PEFT's init); nonzero here so every path carries a gradient
        for name, p in layer.named_parameters():
            if name.endswith("_B"):
                p.normal_(0.0, 0.5)
    return layer


def _check_against_torch(method: str, layer, weights, gen, biases=None, swiglu=None):
    """Run `layer` forward and backward on random inputs from `gen` and hold the output and every
    gradient to torch float64 over the method's held weights; (x, ids, held weights, float64 factors)."""
    x = torch.randn(T, H, generator=gen).requires_grad_()
    ids, w = _routing(gen)
    w.requires_grad_()
    upstream = torch.randn(T, H, generator=gen)
    out = layer(x, ids, w)
    out.backward(upstream)

    held = [_held_weights(method, METHODS[method][0], m) for m in weights]
    ref = {n: p.detach().double().requires_grad_() for n, p in layer.named_parameters()}
    if "gate_up_proj" in ref:   # the expert weights train: differentiate torch's through them too
        held = [ref["gate_up_proj"][:, :I], ref["gate_up_proj"][:, I:], ref["down_proj"]]
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = _torch_experts(x64, ids, w64, *held, ref, layer.scaling,
                          None if biases is None else tuple(b.double() for b in biases), swiglu)
    want.backward(upstream.double())
    tol = METHODS[method][1]
    pairs = {"output": (out, want), "d hidden": (x.grad, x64.grad), "d routing weights": (w.grad, w64.grad)}
    pairs.update({f"d {n}": (p.grad, ref[n].grad) for n, p in layer.named_parameters()})
    for what, (got, exp) in pairs.items():
        err = float((got.detach().double() - exp.detach()).abs().max() / exp.detach().abs().max())
        assert err <= tol, f"{method} on {layer.moe.backend}: {what} differs from torch float64 by {err:.2e} > {tol:.0e}"
    return x, ids, held, ref


@pytest.mark.parametrize("target", [("gate_up", "down"), ("gate", "up", "down"), ("up",)])
@pytest.mark.parametrize("backend", ["reference", None])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_gradients_match_torch_float64(method, backend, target):
    gen = torch.Generator().manual_seed(1)
    gate, up = torch.randn(E, I, H, generator=gen) * H**-0.5, torch.randn(E, I, H, generator=gen) * H**-0.5
    down = torch.randn(E, H, I, generator=gen) * I**-0.5
    layer = _layer(method, backend, gate, up, down, target=target)
    x, *_ = _check_against_torch(method, layer, (gate, up, down), gen)
    assert torch.all(x.grad[5] == 0), "a token routed to no kt expert gets no gradient"


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("rank", [0, 4])
@pytest.mark.parametrize("backend", ["reference", None])
@pytest.mark.parametrize("method", ["FP32", "BF16"])
def test_expert_weight_gradients_match_torch_float64(method, backend, rank, recompute):
    """Full fine-tuning: the expert weights' gradients (with and without adapters) against torch
    float64 through the same weights, at the method's tolerance; an expert no token picks gets zero."""
    gen = torch.Generator().manual_seed(2)
    gate, up = torch.randn(E, I, H, generator=gen) * H**-0.5, torch.randn(E, I, H, generator=gen) * H**-0.5
    down = torch.randn(E, H, I, generator=gen) * I**-0.5
    layer = _layer(method, backend, gate, up, down, rank=rank, recompute=recompute, train_weights=True)
    names = {n for n, _ in layer.named_parameters()}
    assert {"gate_up_proj", "down_proj"} <= names and (rank > 0) == ("gate_up_A" in names), names
    x, ids, *_ = _check_against_torch(method, layer, (gate, up, down), gen)
    unpicked = sorted(set(range(E)) - set(ids[ids >= 0].tolist()))
    for e in unpicked:
        assert not layer.gate_up_proj.grad[e].any() and not layer.down_proj.grad[e].any()


def test_trained_expert_weights_are_packed_again_after_each_change():
    """kt re-packs the weights whenever their parameters change (optimizer steps of every kind, an
    in-place edit, load_state_dict): its output follows torch's on the new values, step after step."""
    gen = torch.Generator().manual_seed(3)
    gate, up = torch.randn(E, I, H, generator=gen) * H**-0.5, torch.randn(E, I, H, generator=gen) * H**-0.5
    down = torch.randn(E, H, I, generator=gen) * I**-0.5
    layer = _layer("FP32", None, gate, up, down, rank=0, train_weights=True)
    x, (ids, w) = torch.randn(T, H, generator=gen), _routing(gen)

    def expected():
        gu, d = layer.gate_up_proj.detach().double(), layer.down_proj.detach().double()
        return _torch_experts(x.double(), ids, w.double(), gu[:, :I], gu[:, I:], d, {}, 1.0)

    def check(what):
        got = layer(x, ids, w).detach().double()
        err = float((got - expected()).abs().max() / expected().abs().max())
        assert err < 2e-6, f"after {what}: kt's output is {err:.1e} from torch's on the new weights"

    for opt in (torch.optim.SGD(layer.parameters(), lr=1e-2), torch.optim.AdamW(layer.parameters(), lr=1e-2),
                torch.optim.AdamW(layer.parameters(), lr=1e-2, foreach=False),
                torch.optim.AdamW(layer.parameters(), lr=1e-2, fused=True)):
        for _ in range(2):
            layer(x, ids, w).square().sum().backward()
            opt.step()
            opt.zero_grad()
            check(type(opt).__name__)
    with torch.no_grad():
        layer.down_proj.mul_(0.5)
    check("an in-place edit")
    state = {k: v.clone() * 1.5 for k, v in layer.state_dict().items()}
    layer.load_state_dict(state)
    check("load_state_dict")


def test_expert_weights_train_only_on_float_methods():
    gen = torch.Generator().manual_seed(4)
    gate, up, down = torch.randn(E, I, H, generator=gen), torch.randn(E, I, H, generator=gen), torch.randn(E, H, I, generator=gen)
    moe = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="INT8", trainable=True)
    moe.load(gate, up, down)
    weights = (torch.nn.Parameter(torch.cat([gate, up], dim=1)), torch.nn.Parameter(down))
    with pytest.raises(KTError, match=r"needs a float method \(BF16 or FP32\).*got INT8"):
        LoRAExperts(moe, rank=0, alpha=8.0, expert_weights=weights)
    with pytest.raises(KTError, match=r"lora_rank must be an integer in \[1, 64\], got 0 \(0, no adapters"):
        LoRAExperts(moe, rank=0, alpha=8.0)


# GPT-OSS's clamp for the test below, chosen in a gap of its pre-activation values (2.5e-3 from the
# nearest with FP32's, BF16's and INT8's weights); a fifth of them lie beyond it, on both sides.
LIMIT = 3.878


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("backend", ["reference", None])
@pytest.mark.parametrize("method", ["FP32", "BF16", "INT8"])
def test_gpt_oss_experts_biases_and_clamped_swiglu(method, backend, recompute):
    """Experts with gate/up/down biases and GPT-OSS's clamped SwiGLU: every gradient against torch
    float64 of the same experts. The limit (LIMIT) is small enough that gate and up values cross it
    (the clamps zero those gradients) and the biases are as large as the products (so the routing
    weights' gradient carries down's bias). Measured (largest over the tensors): FP32 2.8e-7, BF16
    3.5e-6 (avx), INT8 7.1e-5 (avx), 2.5e-7 to 3e-7 on the reference backend; the METHODS tolerances."""
    gen = torch.Generator().manual_seed(3)
    gate, up = (torch.randn(E, I, H, generator=gen) * H**-0.5 * 2 for _ in range(2))
    down = torch.randn(E, H, I, generator=gen) * I**-0.5
    biases = (torch.randn(E, I, generator=gen), torch.randn(E, I, generator=gen), torch.randn(E, H, generator=gen))
    biases = tuple(b.bfloat16().float() for b in biases)
    swiglu = (LIMIT, 1.702)
    layer = _layer(method, backend, gate, up, down, recompute=recompute, biases=biases, swiglu=swiglu)
    with torch.no_grad():   # the adapters from this test's generator: the margin below depends on them
        for name, p in layer.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if name.endswith("_B") else 0.1))
    x, ids, held, ref = _check_against_torch(method, layer, (gate, up, down), gen, biases, swiglu)
    x64 = x.detach().double()
    # A clamp's gradient jumps at the limit: the test's values keep a margin from ±limit that INT8's
    # activation rounding (~1e-4 here) cannot cross, while many lie beyond it on both sides.
    pre = torch.cat([torch.cat([held[0][e] @ x64[t] + biases[0][e], held[1][e] @ x64[t] + biases[1][e]])
                     + layer.scaling * (ref["gate_up_B"][e] @ (ref["gate_up_A"][e] @ x64[t]))
                     for t in range(T) for e in ids[t].tolist() if e >= 0]).detach()
    margin = float((pre.abs() - swiglu[0]).abs().min())
    assert margin > 1e-3, margin
    assert (pre > swiglu[0]).sum() > 100 and (pre < -swiglu[0]).sum() > 100, "the clamps are exercised"


def test_recompute_gives_the_same_gradients():
    gen = torch.Generator().manual_seed(2)
    weights = [torch.randn(E, I, H, generator=gen), torch.randn(E, I, H, generator=gen), torch.randn(E, H, I, generator=gen)]
    x = torch.randn(T, H, generator=gen)
    ids, w = _routing(gen)
    grads = []
    for recompute in (False, True):
        layer = _layer("BF16", None, *weights, recompute=recompute)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.linspace(-1, 1, p.numel()).reshape(p.shape))
        xi = x.clone().requires_grad_()
        layer(xi, ids, w).square().sum().backward()
        grads.append([xi.grad] + [p.grad for p in layer.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_second_backward_through_the_experts_is_refused():
    """The step's activations live in reused buffers: a retained graph's second backward would read
    another step's values, so it is an error, named."""
    gen = torch.Generator().manual_seed(3)
    layer = _layer("BF16", None, torch.randn(E, I, H, generator=gen), torch.randn(E, I, H, generator=gen),
                   torch.randn(E, H, I, generator=gen))
    ids, w = _routing(gen)
    out = layer(torch.randn(T, H, generator=gen).requires_grad_(), ids, w)
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=r"backward through kt experts a second time \(retain_graph\)"):
        out.sum().backward()


def test_fresh_adapters_leave_the_forward_unchanged():
    """B starts at zero (PEFT's init): before the first step the layer computes the frozen experts."""
    gen = torch.Generator().manual_seed(3)
    weights = [torch.randn(E, I, H, generator=gen), torch.randn(E, I, H, generator=gen), torch.randn(E, H, I, generator=gen)]
    moe = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="BF16", trainable=True)
    moe.load(*weights)
    layer = LoRAExperts(moe, rank=8, alpha=16)
    x = torch.randn(T, H, generator=gen)
    ids, w = _routing(gen)
    ids[ids < 0] = 0
    with torch.no_grad():
        got, want = layer(x, ids, w), moe(x, ids, w)
    # Same weights, the activation in torch rather than the kernel's epilogue: 1e-6 of the output scale.
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5


def test_targets():
    assert lora_targets(("down", "gate_up")) == ("gate_up", "down")
    assert lora_targets(("down", "up", "gate")) == ("gate", "up", "down")
    assert lora_targets(("gate",)) == ("gate",)
    with pytest.raises(KTError, match="are alternatives"):
        lora_targets(("gate_up", "gate"))
    with pytest.raises(KTError, match="not one of"):
        lora_targets(("q_proj",))
    with pytest.raises(KTError, match="empty"):
        lora_targets(())
    moe = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="BF16", trainable=True)
    with pytest.raises(KTError, match="rank 66 on the fused projection"):
        LoRAExperts(moe, rank=33, alpha=8, target=("gate", "up"))


def test_only_down_adapter_trains_only_down():
    gen = torch.Generator().manual_seed(4)
    weights = [torch.randn(E, I, H, generator=gen), torch.randn(E, I, H, generator=gen), torch.randn(E, H, I, generator=gen)]
    layer = _layer("FP32", "reference", *weights, target=("down",))
    assert sorted(n for n, _ in layer.named_parameters()) == ["down_A", "down_B"]
    x = torch.randn(T, H, generator=gen)
    ids, w = _routing(gen)
    layer(x, ids, w).sum().backward()
    assert layer.down_A.grad is not None and layer.down_A.grad.abs().sum() > 0


def test_refusals():
    moe = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="BF16")
    with pytest.raises(KTError, match="trainable=True"):
        LoRAExperts(moe, rank=4, alpha=8)
    moe = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="BF16", trainable=True)
    for bad in (0, -1, 2.5, True, 65):
        with pytest.raises(KTError, match="lora_rank"):
            LoRAExperts(moe, rank=bad, alpha=8)
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(KTError, match="lora_alpha"):
            LoRAExperts(moe, rank=4, alpha=bad)


def test_grouped_products_refuse_bad_groupings():
    moe = kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="FP32", backend="reference",
                      trainable=True)
    rng = np.random.default_rng(0)
    moe.load(rng.standard_normal((4, 32, 64)).astype(np.float32), rng.standard_normal((4, 32, 64)).astype(np.float32),
             rng.standard_normal((4, 64, 32)).astype(np.float32))
    x = np.zeros((6, 64), np.float32)
    with pytest.raises(ValueError, match="counts sum to 5 rows; the arrays hold 6"):
        moe.grouped_gate_up(x, np.array([1, 1, 1, 2], np.int64))
    with pytest.raises(ValueError, match="negative"):
        moe.grouped_gate_up(x, np.array([7, -1, 0, 0], np.int64))
    with pytest.raises(ValueError, match=r"counts must have shape \[4\]"):
        moe.grouped_gate_up(x, np.array([6], np.int64))
    with pytest.raises(ValueError, match=r"x must have shape \[6, 64\]"):
        moe.grouped_gate_up(np.zeros((6, 63), np.float32), np.array([6, 0, 0, 0], np.int64))
    with pytest.raises(TypeError, match="float32"):
        moe.grouped_down(np.zeros((6, 32), np.float64), np.array([6, 0, 0, 0], np.int64))
    empty = kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="FP32", backend="reference",
                        trainable=True)
    with pytest.raises(ValueError, match="expert 0 has 6 rows but no weights"):
        empty.grouped_down_transposed(x, np.array([6, 0, 0, 0], np.int64))
    # Rows gathered by token and adapters riding on the products (kt_core.lora.ProductLora*).
    from kt_core.lora import ProductLora, ProductLoraGrad

    six = np.array([6, 0, 0, 0], np.int64)
    with pytest.raises(ValueError, match=r"token\[1\] = 3 is out of range for x's 3 rows"):
        moe.grouped_gate_up(np.zeros((3, 64), np.float32), six, token=np.array([0, 3, 1, 1, 2, 0], np.int64))
    with pytest.raises(ValueError, match="counts sum to 6 rows; the arrays hold 5"):
        moe.grouped_gate_up(x, six, token=np.zeros(5, np.int64))
    a, bt, xa = np.zeros((4, 2, 64), np.float32), np.zeros((4, 1, 64), np.float32), np.zeros((6, 2), np.float32)
    with pytest.raises(ValueError, match="blocks must be 1 or 2, got 3"):
        moe.grouped_gate_up(x, six, lora=ProductLora(np.zeros((4, 3, 64), np.float32), bt, 1.0, np.zeros((6, 3), np.float32), 3))
    with pytest.raises(ValueError, match=r"lora_bt must have shape \[4, 2, 64\]"):
        moe.grouped_gate_up(x, six, lora=ProductLora(a, bt, 1.0, xa))
    with pytest.raises(ValueError, match="blocks must be 1, got 2"):
        moe.grouped_down(np.zeros((6, 32), np.float32), six, lora=ProductLora(a, bt, 1.0, xa, 2))
    with pytest.raises(ValueError, match=r"lora_a must have shape \[4, 2, 32\]"):
        moe.grouped_down_transposed(x, six, lora=ProductLoraGrad(xa, a))


def test_a_backend_without_transposed_tiles_is_refused_for_training():
    with pytest.raises(kt_core.errors.BackendError, match="transposed tiles"):
        kt_core.MoE(num_experts=4, top_k=2, hidden_size=256, intermediate_size=256, method="LLAMAFILE", backend="avx",
                    weight_types=("Q8_0", "Q8_0", "Q8_0"), trainable=True)


def test_routing_groups_rows_by_expert():
    ids = torch.tensor([[2, 0], [-1, 2], [1, -1]])
    r = Routing.of(ids, 4)
    assert r.counts.tolist() == [1, 1, 2, 0]
    assert r.slot.tolist() == [1, 4, 0, 3]
    assert r.token.tolist() == [0, 2, 0, 1]
    assert r.offsets.tolist() == [1, 2, 4, 4]
    assert r.row_of_slot.tolist() == [[2, 0], [-1, 3], [1, -1]]


def test_fast_activations_gradients():
    """fast_activations=True: bf16 activations forward and, for BF16 experts on an AVX512_BF16 host, bf16
    gradients through vdpbf16ps backward; every gradient stays within 2e-2 of float64 (bf16's rounding
    of activations and gradients; measured ~3e-3 here), and a host without the faster path is exact."""
    gen = torch.Generator().manual_seed(6)
    gate, up = torch.randn(E, I, H, generator=gen) * H**-0.5, torch.randn(E, I, H, generator=gen) * H**-0.5
    down = torch.randn(E, H, I, generator=gen) * I**-0.5
    moe = kt_core.MoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, method="BF16", trainable=True,
                      fast_activations=True)
    moe.load(gate, up, down)
    layer = LoRAExperts(moe, rank=4, alpha=8.0)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.5, generator=gen)
    x = torch.randn(T, H, generator=gen).requires_grad_()
    ids, w = _routing(gen)
    upstream = torch.randn(T, H, generator=gen)
    layer(x, ids, w).backward(upstream)
    ref = {n: p.detach().double().requires_grad_() for n, p in layer.named_parameters()}
    x64 = x.detach().double().requires_grad_()
    held = [m.bfloat16().double() for m in (gate, up, down)]
    _torch_experts(x64, ids, w.double(), *held, ref, layer.scaling).backward(upstream.double())
    for got, want in [(x.grad, x64.grad)] + [(p.grad, ref[n].grad) for n, p in layer.named_parameters()]:
        assert float((got.double() - want).abs().max() / want.abs().max()) < 2e-2
