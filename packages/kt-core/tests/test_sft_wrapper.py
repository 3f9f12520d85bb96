"""KTMoEWrapper(mode="sft"): kt-kernel's SFT wrapper API against torch autograd in float64.

Every output of the wrapper (the layer's output, the gradients of the hidden states and of the
routing weights, the six LoRA factors' gradients written into the caller's bf16 buffers, and with
full_weight_grad the expert weights') is held to torch float64 autograd of the same LoRA'd experts
on the weights the layer holds (the method's dequantized weights) and the same bf16 inputs. kt-kernel's
API returns bf16, so the floor is one bf16 step at the largest magnitude (2^-8 = 3.9e-3 of it):
measured 1.0e-3 – 3.3e-3 on every method and backend, at most one bf16 step from float64 rounded to
bf16 (bounds: BF16 4e-3, INT8/INT4 5e-3). The routing weights' gradient returns in float32 and shows
kt's own arithmetic: measured 2e-7 – 3e-7 on BF16 (bound 1e-5), 8e-5 – 9e-5 on avx's INT8/INT4,
whose forward quantizes activations to int8 in two planes (bound 5e-4).
Errors are max |kt - torch| / max |torch| per tensor.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kt_core import KTError, KTMoEWrapper  # noqa: E402
from kt_core.sft import SFTMoEWrapper, sft_methods, ue8m0_to_bf16  # noqa: E402
from kt_core.testing.quantize import (  # noqa: E402
    dequantize_fp8_block,
    dequantize_int4,
    dequantize_int8,
    dequantize_mxfp4,
    dequantize_rawint4,
    pack_rawint4,
    quantize_fp8_block,
    quantize_int4,
    quantize_int8,
    quantize_mxfp4,
    scale_as_torch_bf16,
)

E, K, H, I, T, R, ALPHA = 8, 2, 128, 64, 24, 8, 16.0
LORA = ("gate_lora_a", "gate_lora_b", "up_lora_a", "up_lora_b", "down_lora_a", "down_lora_b")
# method -> (INT4 group, zero point, bound)
METHODS = {
    "AMXBF16_SFT": (0, False, 4e-3),                # bf16 activations and gradients (the default here)
    "AMXBF16_SFT precise": (0, False, 4e-3),        # fast_activations=False: kt's exact planes
    "AMXINT8_SFT": (0, False, 5e-3),
    "AMXINT4_SFT": (64, False, 5e-3),          # kt's INT4 default group: the largest of 128/64/32 dividing H and I
    "AMXINT4_1KGroup_SFT": (32, True, 5e-3),
}


def make(method="AMXBF16_SFT", **kw):
    args = dict(layer_idx=0, num_experts=E, num_experts_per_tok=K, hidden_size=H, moe_intermediate_size=I,
                gpu_experts_mask=None, cpuinfer_threads=None, threadpool_count=1, weight_path=None,
                chunked_prefill_size=64, method=method, mode="sft", lora_rank=R, lora_alpha=ALPHA, group_size=32)
    args.update(kw)
    return KTMoEWrapper(**args)


def base_weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(E, I, H, generator=g) / H**0.5, torch.randn(E, I, H, generator=g) / H**0.5,
            torch.randn(E, H, I, generator=g) / I**0.5)


def held(method: str, w: torch.Tensor) -> torch.Tensor:
    """The weights a layer of `method` holds for bf16(w), dequantized, float64."""
    group, zp, _ = METHODS[method]
    method = method.split()[0]
    a = w.bfloat16().float().numpy()
    if "INT8" in method:
        return torch.from_numpy(dequantize_int8(*quantize_int8(a))).double()
    if "INT4" in method:
        return torch.from_numpy(dequantize_int4(*quantize_int4(a, group, zp))).double()
    return torch.from_numpy(a).double()


def lora_tensors(seed=2, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    shapes = {"gate_lora_a": (E, R, H), "gate_lora_b": (E, I, R), "up_lora_a": (E, R, H), "up_lora_b": (E, I, R),
              "down_lora_a": (E, R, I), "down_lora_b": (E, H, R)}
    values = {n: (torch.randn(s, generator=g) * scale).bfloat16() for n, s in shapes.items()}
    grads = {n: torch.full(s, 7.0, dtype=torch.bfloat16) for n, s in shapes.items()}   # overwritten, never added to
    return values, grads


def batch(seed=1, tokens=T):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, H, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(tokens)])
    ids[3, 1] = -1                                   # a pick computed elsewhere: no row, zero weight gradient
    w = torch.softmax(torch.randn(tokens, K, generator=g), dim=-1)
    dy = torch.randn(tokens, H, generator=g).bfloat16()
    return x, ids, w, dy


def torch_reference(x, ids, w, dy, gate, up, down, lora, limit=0.0):
    """Output and gradients (x, w, each LoRA factor, each expert weight) in float64 autograd; `limit`:
    DeepSeek-V4's clamped SiLU, SiLU(min(gate, limit)) * clamp(up, -limit, limit)."""
    X, W = x.double().requires_grad_(), w.double().requires_grad_()
    P = {n: v.double().requires_grad_() for n, v in lora.items()}
    G, U, D = (t.detach().clone().requires_grad_() for t in (gate, up, down))
    s = ALPHA / R
    out = torch.zeros(X.shape, dtype=torch.float64)
    for t in range(X.shape[0]):
        for j in range(K):
            e = int(ids[t, j])
            if e < 0:
                continue
            xt = X[t]
            gt = G[e] @ xt
            ut = U[e] @ xt
            if P:
                gt = gt + s * (P["gate_lora_b"][e] @ (P["gate_lora_a"][e] @ xt))
                ut = ut + s * (P["up_lora_b"][e] @ (P["up_lora_a"][e] @ xt))
            if limit:
                gt, ut = gt.clamp(max=limit), ut.clamp(-limit, limit)
            h = torch.nn.functional.silu(gt) * ut
            y = D[e] @ h
            if P:
                y = y + s * (P["down_lora_b"][e] @ (P["down_lora_a"][e] @ h))
            out[t] = out[t] + W[t, j] * y
    out.backward(dy.double())
    grads = {"x": X.grad, "w": W.grad, "gate_proj": G.grad, "up_proj": U.grad, "down_proj": D.grad}
    grads.update({n: p.grad for n, p in P.items()})
    return out.detach(), grads


def err(a, b) -> float:
    return float((a.double() - b).abs().max() / b.abs().max())


def step_errors(wrapper, weights, limit=0.0) -> dict:
    """One step of a loaded wrapper (lora_tensors(), batch()) against torch_reference over `weights`
    (float64 gate, up, down): the relative error of the output and of every gradient, by name."""
    lora, grads = lora_tensors()
    wrapper.init_lora_weights(*lora.values(), *grads.values())
    x, ids, w, dy = batch()
    out = wrapper.forward(x, ids, w, save_for_backward=True)
    grad_x, grad_w = wrapper.backward(dy)
    ref, rgrads = torch_reference(x, ids, w, dy, *weights, lora, limit)
    errors = {"out": err(out, ref), "x": err(grad_x, rgrads["x"]), "w": err(grad_w, rgrads["w"])}
    errors.update({n: err(grads[n], rgrads[n]) for n in LORA})
    return errors


@pytest.mark.parametrize("backend", [None, "reference"])
def test_rawint4_experts_from_kt_kernels_tensors(backend):
    """RAWINT4_SFT's load_rawint4_weights (kt-kernel's RAWINT4ExpertWeights: compressed-tensors' int32
    words as uint8 [E, rows, cols / 2], bf16 scales per 32): every output against float64 over the
    dequantized weights; the same words as int32 load the same experts."""
    from types import SimpleNamespace

    packed = {n: pack_rawint4(t.numpy()) for n, t in zip(("gate", "up", "down"), base_weights())}
    tensors = {}
    for n, (words, scale) in packed.items():
        tensors[f"{n}_proj"] = torch.from_numpy(words.copy()).view(torch.uint8)
        tensors[f"{n}_scale"] = scale_as_torch_bf16(scale)
    wrapper = make("RAWINT4_SFT", backend=backend)
    with pytest.raises(KTError, match="use load_rawint4_weights\\(\\) or load_weights\\(\\)"):
        wrapper.load_weights_from_tensors(*(t.bfloat16() for t in base_weights()))
    with pytest.raises(KTError, match="groups of 32, got group_size=64"):
        wrapper.load_rawint4_weights(SimpleNamespace(group_size=64, **tensors))
    bad = dict(tensors, up_proj=tensors["up_proj"][:, :, :-4])
    with pytest.raises(KTError, match=f"up_proj must be uint8 \\[{E}, {I}, {H // 2}\\]"):
        wrapper.load_rawint4_weights(SimpleNamespace(group_size=32, **bad))
    wrapper.load_rawint4_weights(SimpleNamespace(group_size=32, **tensors), torch.arange(E))
    weights = [torch.from_numpy(dequantize_rawint4(*packed[n])).double() for n in ("gate", "up", "down")]
    errors = step_errors(wrapper, weights)
    assert max(errors.values()) < 5e-3 and errors["w"] < 5e-4, errors
    as_words = make("RAWINT4_SFT", backend=backend)
    as_words.load_rawint4_weights(SimpleNamespace(**{k: v.view(torch.int32) if k.endswith("_proj") else v
                                                     for k, v in tensors.items()}))
    as_words.init_lora_weights(*lora_tensors()[0].values(), *lora_tensors()[1].values())
    x, ids, w, _ = batch()
    assert torch.equal(as_words.forward(x, ids, w), wrapper.forward(x, ids, w))


@pytest.mark.parametrize("backend", [None, "reference"])
def test_block_fp8_experts_train_lora(backend):
    """AMXFP8_SFT: LoRA on frozen block-FP8 experts given as kt-kernel gives them (load_block_fp8_weights:
    per-expert float8_e4m3fn codes and f32 128 x 128 block scales), every output and gradient against
    float64 over the dequantized weights (bounds as the other methods': the bf16 outputs' floor, the
    routing weights' float32 gradient 1e-5)."""
    from types import SimpleNamespace

    quantized = {n: quantize_fp8_block(t.numpy()) for n, t in zip(("gate", "up", "down"), base_weights())}
    tensors = {}
    for n, (codes, scale) in quantized.items():
        tensors[f"{n}_proj"] = [torch.from_numpy(c.copy()).view(torch.float8_e4m3fn) for c in codes]
        tensors[f"{n}_scale"] = [torch.from_numpy(np.ascontiguousarray(s, dtype=np.float32)) for s in scale]
    wrapper = make("AMXFP8_SFT", backend=backend)
    assert wrapper._moe.method == "FP8"
    with pytest.raises(KTError, match="use load_block_fp8_weights"):
        wrapper.load_weights_from_tensors(*(t.bfloat16() for t in base_weights()))
    with pytest.raises(KTError, match="128 x 128 scale blocks, got block_size=\\(64, 64\\)"):
        wrapper.load_block_fp8_weights(SimpleNamespace(block_size=(64, 64), **tensors))
    wrapper.load_block_fp8_weights(SimpleNamespace(block_size=(128, 128), **tensors), torch.arange(E))
    weights = [torch.from_numpy(dequantize_fp8_block(*quantized[n])).double() for n in ("gate", "up", "down")]
    errors = step_errors(wrapper, weights)
    assert max(errors.values()) < 4e-3 and errors["w"] < 1e-5, errors


def mxfp4_experts_data(weights):
    """weights as kt-kernel's MXFP4SafeTensorLoader.load_experts() gives a DeepSeek-V4-Flash layer: per
    expert uint8 E2M1 codes and bf16 scales (the UE8M0 exponents as bf16 powers of two)."""
    data = {}
    for name, t in zip(("gate", "up", "down"), weights):
        codes, scales = quantize_mxfp4(t.numpy())
        data[name] = [torch.from_numpy(c.copy()) for c in codes]
        data[name + "_scale"] = [ue8m0_to_bf16(torch.from_numpy(s)) for s in scales]
    return data


def clamp_limit_away_from_the_values(weights, lora, start=1.5, margin=2e-4):
    """A swiglu_limit near `start` that every gate / up value of batch()'s picks (float64, with the
    LoRA) misses by `margin`: a clamp's gradient jumps at the limit, so a value within rounding of it
    would compare two different sides."""
    x, ids, _, _ = batch()
    s = ALPHA / R
    values = []
    for t in range(x.shape[0]):
        for e in (int(i) for i in ids[t] if i >= 0):
            xt = x[t].double()
            for name, wt in (("gate", weights[0]), ("up", weights[1])):
                a, b = lora[f"{name}_lora_a"][e].double(), lora[f"{name}_lora_b"][e].double()
                values.append(wt[e] @ xt + s * (b @ (a @ xt)))
    v = torch.cat(values).abs()
    for limit in np.arange(start, start + 0.5, 0.01):
        if float((v - limit).abs().min()) > margin:
            return float(limit), float((v > limit).double().mean())
    raise AssertionError("no limit clear of the values")


@pytest.mark.parametrize("backend", [None, "reference"])
def test_mxfp4_experts_train_lora_with_the_clamped_silu(backend):
    """MXFP4_SFT: LoRA on frozen E2M1 / UE8M0 experts given as kt-kernel gives them
    (load_mxfp4_weights), with DeepSeek-V4's clamped SiLU (swiglu_limit) at a limit a part of the
    gate and up values cross (15 %): every output and gradient against float64 over the dequantized
    weights (bounds as the other methods': bf16 outputs 5e-3, measured 1.4e-3 – 3.2e-3 on avx and the
    reference; the routing weights' f32 gradient 5e-4, measured 8.7e-5 avx (int8 activations), 1.8e-7
    reference)."""
    data = mxfp4_experts_data(base_weights())
    weights = [torch.from_numpy(dequantize_mxfp4(torch.stack(data[n]).numpy(),
                                                 (torch.stack(data[n + "_scale"]).view(torch.int16).int() >> 7).numpy()))
               for n in ("gate", "up", "down")]
    limit, crossing = clamp_limit_away_from_the_values(weights, lora_tensors()[0])
    assert crossing > 0.05, crossing
    wrapper = make("MXFP4_SFT", backend=backend, swiglu_limit=limit, zero_point=False)
    assert wrapper._moe.method == "MXFP4" and wrapper._moe.swiglu_limit == pytest.approx(limit)
    with pytest.raises(KTError, match="MXFP4_SFT accepts native packed E2M1 weights and UE8M0 scales only"):
        wrapper.load_weights_from_tensors(*(t.bfloat16() for t in base_weights()))
    wrapper.load_mxfp4_weights(data, torch.arange(E))
    with pytest.raises(RuntimeError, match="MXFP4_SFT weights are immutable and already loaded"):
        wrapper.load_mxfp4_weights(data, torch.arange(E))
    errors = step_errors(wrapper, [w.double() for w in weights], limit)
    assert max(errors.values()) < 5e-3 and errors["w"] < 5e-4, errors


def test_mxfp4_sft_contract():
    """kt-kernel's MXFP4_SFT constraints, and its experts' format checked by name."""
    with pytest.raises(ValueError, match="swiglu_limit / swiglu_alpha .* are only supported by MXFP4_SFT"):
        make("AMXBF16_SFT", swiglu_limit=7.0)
    with pytest.raises(ValueError, match="MXFP4_SFT requires swiglu_alpha=0"):
        make("MXFP4_SFT", swiglu_limit=7.0, swiglu_alpha=1.702, zero_point=False)
    with pytest.raises(ValueError, match="MXFP4_SFT requires a finite positive swiglu_limit"):
        make("MXFP4_SFT", zero_point=False)
    with pytest.raises(ValueError, match="MXFP4_SFT requires group_size=32 and zero_point=False"):
        make("MXFP4_SFT", swiglu_limit=7.0)   # zero_point defaults to True, as kt-kernel's
    with pytest.raises(ValueError, match="MXFP4_SFT supports frozen-base LoRA only"):
        make("MXFP4_SFT", swiglu_limit=7.0, zero_point=False, full_weight_grad=True)
    data = mxfp4_experts_data(base_weights())
    wrapper = make("MXFP4_SFT", swiglu_limit=7.0, zero_point=False)
    with pytest.raises(ValueError, match=r"MXFP4 up\[3\] must be a CPU torch.uint8 tensor of shape \(64, 64\), got "
                                         r"torch.int8"):
        wrapper.load_mxfp4_weights({**data, "up": [t.view(torch.int8) if e == 3 else t
                                                   for e, t in enumerate(data["up"])]})
    with pytest.raises(ValueError, match="MXFP4 down_scale must contain 8 expert tensors, got 7"):
        wrapper.load_mxfp4_weights({**data, "down_scale": data["down_scale"][:7]})
    third = [data["gate_scale"][0] * 1.5] + data["gate_scale"][1:]
    with pytest.raises(ValueError, match=r"MXFP4 gate_scale\[0\] must hold UE8M0 scales .*found 0.0[0-9]*"):
        wrapper.load_mxfp4_weights({**data, "gate_scale": third})
    with pytest.raises(KTError, match=r"load_mxfp4_weights\(\) loads MXFP4_SFT's experts; this wrapper is AMXBF16_SFT"):
        make().load_mxfp4_weights(data)


@pytest.mark.parametrize("backend", [None, "reference"])
@pytest.mark.parametrize("method", list(METHODS))
def test_forward_and_every_gradient_match_float64(method, backend):
    gate, up, down = base_weights()
    name, *precise = method.split()
    wrapper = make(name, backend=backend, **({"fast_activations": False} if precise else {}))
    assert isinstance(wrapper, SFTMoEWrapper) and wrapper._moe.fast_activations == (name == "AMXBF16_SFT" and not precise)
    wrapper.load_weights_from_tensors(gate.bfloat16(), up.bfloat16(), down.bfloat16(), torch.arange(E))
    lora, grads = lora_tensors()
    wrapper.init_lora_weights(*lora.values(), *grads.values())
    x, ids, w, dy = batch()
    out = wrapper.forward(x, ids, w, save_for_backward=True)
    grad_x, grad_w = wrapper.backward(dy)
    assert out.dtype == grad_x.dtype == torch.bfloat16 and grad_w.dtype == torch.float32
    assert grad_w.shape == (T, K) and float(grad_w[3, 1]) == 0.0
    ref, rgrads = torch_reference(x, ids, w, dy, *(held(method, t) for t in (gate, up, down)), lora)
    bound = METHODS[method][2]
    errors = {"out": err(out, ref), "x": err(grad_x, rgrads["x"]), "w": err(grad_w, rgrads["w"])}
    errors.update({n: err(grads[n], rgrads[n]) for n in LORA})
    assert max(errors.values()) < bound, errors
    # The routing weights' gradient comes back in float32: kt's own arithmetic, without bf16's rounding.
    assert errors["w"] < (1e-5 if name == "AMXBF16_SFT" else 5e-4), errors


def test_full_weight_gradients_and_update_base_weights():
    """full_weight_grad=True on BF16, with and without LoRA: the expert weights' gradients, and an
    optimizer step on them reaches the kernels through update_base_weights()."""
    gate, up, down = (t.bfloat16() for t in base_weights())
    for rank in (0, R):
        wrapper = make(full_weight_grad=True, lora_rank=rank)
        wrapper.load_weights_from_tensors(gate, up, down, torch.arange(E))
        wrapper.init_full_weight_grad_buffers(gate, up, down)
        lora = {}
        if rank:
            lora, grads = lora_tensors()
            wrapper.init_lora_weights(*lora.values(), *grads.values())
        x, ids, w, dy = batch()
        wrapper.forward(x, ids, w)
        wrapper.backward(dy)
        _, rgrads = torch_reference(x, ids, w, dy, gate.double(), up.double(), down.double(), lora)
        for name in ("gate_proj", "up_proj", "down_proj"):
            param = getattr(wrapper, f"{name}_buf")
            assert param.grad is getattr(wrapper, f"grad_{name}_buf")
            assert err(param.grad, rgrads[name]) < 4e-3, (rank, name, err(param.grad, rgrads[name]))
        # An optimizer step on the Parameters, repacked: the next forward is the new weights'.
        torch.optim.SGD([wrapper.gate_proj_buf, wrapper.up_proj_buf, wrapper.down_proj_buf], lr=0.5).step()
        wrapper.update_base_weights()
        after = wrapper.forward(x, ids, w, save_for_backward=False)
        new = [getattr(wrapper, f"{n}_buf").detach().double() for n in ("gate_proj", "up_proj", "down_proj")]
        ref, _ = torch_reference(x, ids, w, dy, *new, lora)
        assert err(after, ref) < 4e-3


def test_skip_lora_gives_input_and_routing_gradients_only():
    gate, up, down = base_weights()
    wrapper = make("AMXBF16_SFT_SkipLoRA")
    wrapper.load_weights_from_tensors(gate, up, down)
    x, ids, w, dy = batch()
    out = wrapper.forward(x, ids, w)    # no init_lora_weights needed
    grad_x, grad_w = wrapper.backward(dy)
    ref, rgrads = torch_reference(x, ids, w, dy, *(held("AMXBF16_SFT", t) for t in (gate, up, down)), {})
    assert max(err(out, ref), err(grad_x, rgrads["x"]), err(grad_w, rgrads["w"])) < 4e-3


def test_parameters_get_optimizer_owned_gradients_that_accumulate():
    """LoRA factors given as nn.Parameters: backward sets .grad to the caller's buffers, adds into
    them while .grad is set (gradient accumulation) and overwrites after zero_grad(); an optimizer
    step changes what the next forward computes."""
    gate, up, down = base_weights()
    wrapper = make()
    wrapper.load_weights_from_tensors(gate, up, down)
    values, grads = lora_tensors()
    params = {n: torch.nn.Parameter(v) for n, v in values.items()}
    wrapper.init_lora_weights(*params.values(), *grads.values())
    assert wrapper.validate_authoritative_optimizer_grad_state() == "closed"
    x, ids, w, dy = batch()
    x2, ids2, w2, dy2 = batch(seed=5)

    def step(xb, idsb, wb, dyb):
        wrapper.forward(xb, idsb, wb)
        wrapper.backward(dyb)

    step(x, ids, w, dy)
    first = {n: grads[n].float().clone() for n in LORA}
    assert all(params[n].grad is grads[n] for n in LORA)
    step(x2, ids2, w2, dy2)
    both = {n: grads[n].float().clone() for n in LORA}
    wrapper.release_authoritative_optimizer_grads()
    step(x2, ids2, w2, dy2)
    second = {n: grads[n].float().clone() for n in LORA}
    for n in LORA:
        assert err(both[n], (first[n] + second[n]).double()) < 8e-3, n
    # zero_grad(set_to_none=True) closes the window the same way.
    optimizer = torch.optim.SGD(params.values(), lr=10.0)
    optimizer.step()
    optimizer.zero_grad()
    assert wrapper.validate_authoritative_optimizer_grad_state() == "closed"
    after = wrapper.forward(x, ids, w, save_for_backward=False)
    ref, _ = torch_reference(x, ids, w, dy, *(held("AMXBF16_SFT", t) for t in (gate, up, down)),
                             {n: p.detach() for n, p in params.items()})
    assert err(after, ref) < 4e-3
    params["gate_lora_a"].grad = torch.zeros_like(params["gate_lora_a"])
    wrapper.forward(x, ids, w)
    with pytest.raises(RuntimeError, match="gate_lora_a: Parameter.grad was replaced"):
        wrapper.backward(dy)


def test_cached_forwards_are_consumed_newest_first():
    gate, up, down = base_weights()
    lora, _ = lora_tensors()

    def fresh(depth):
        wrapper = make(max_cache_depth=depth)
        wrapper.load_weights_from_tensors(gate, up, down)
        grads = {n: torch.zeros_like(v) for n, v in lora.items()}
        wrapper.init_lora_weights(*lora.values(), *grads.values())
        return wrapper

    a, b = batch(seed=1), batch(seed=5, tokens=9)
    single = fresh(1)
    single.forward(*a[:3])
    expected_a = single.backward(a[3])
    single.forward(*b[:3])
    expected_b = single.backward(b[3])

    deep = fresh(2)
    deep.forward(*a[:3])
    deep.forward(*b[:3])
    got_b = deep.backward(b[3])
    got_a = deep.backward(a[3])
    for got, expected in ((got_a, expected_a), (got_b, expected_b)):
        assert all(torch.equal(g, e) for g, e in zip(got, expected))
    with pytest.raises(RuntimeError, match="No forward cache available"):
        deep.backward(a[3])
    # Past the depth the oldest forward is dropped: its backward finds no cache.
    single.forward(*a[:3])
    single.forward(*b[:3])
    single.backward(b[3])
    with pytest.raises(RuntimeError, match="No forward cache available"):
        single.backward(a[3])
    single.forward(*a[:3])
    with pytest.raises(ValueError, match=r"grad_output shape \(9, 128\) must be the saved forward's output shape"):
        single.backward(b[3])


def test_submitted_forward_and_backward_equal_the_blocking_ones():
    gate, up, down = base_weights()
    lora, _ = lora_tensors()
    results = []
    for asynchronous in (False, True):
        wrapper = make()
        wrapper.load_weights_from_tensors(gate, up, down)
        grads = {n: torch.zeros_like(v) for n, v in lora.items()}
        wrapper.init_lora_weights(*lora.values(), *grads.values())
        x, ids, w, dy = batch()
        if asynchronous:
            with pytest.raises(RuntimeError, match="No pending forward"):
                wrapper.sync_forward()
            wrapper.submit_forward(x, ids, w)
            with pytest.raises(RuntimeError, match="a forward of this layer is in flight"):
                wrapper.backward(dy)
            out = wrapper.sync_forward()
            wrapper.submit_backward_async(dy)
            grad = wrapper.sync_backward()
        else:
            out = wrapper.forward(x, ids, w)
            grad = wrapper.backward(dy)
        results.append((out, *grad, *(grads[n].clone() for n in LORA)))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match=r"Method 'AMXINT4' not supported for SFT mode. Supported methods: \["):
        make("AMXINT4")
    with pytest.raises(KTError, match="full_weight_grad=True trains the expert weights themselves.*AMXFP8_SFT holds"):
        make("AMXFP8_SFT", full_weight_grad=True)
    with pytest.raises(KTError, match="load_block_fp8_weights\\(\\) loads AMXFP8_SFT's experts; this wrapper is AMXBF16"):
        make().load_block_fp8_weights(None)
    with pytest.raises(KTError, match="lora_dropout=0.1: kt's SFT wrapper trains without LoRA dropout"):
        make(lora_dropout=0.1)
    with pytest.raises(ValueError, match="lora_rank must be positive in LoRA mode, got 0"):
        make(lora_rank=0)
    with pytest.raises(KTError, match="lora_rank 33: kt runs the gate and up adapters as one of rank 2 x lora_rank"):
        make(lora_rank=33)
    with pytest.raises(KTError, match="full_weight_grad=True trains the expert weights themselves, which kt does on BF16"):
        make("AMXINT8_SFT", full_weight_grad=True)
    with pytest.raises(KTError, match="num_gpu_experts=2: mode='sft' computes every routed expert on the CPU"):
        make(num_gpu_experts=2)
    with pytest.raises(ValueError, match="max_cache_depth must be positive, got 0"):
        make(max_cache_depth=0)
    with pytest.raises(KTError, match="RAWINT4_SFT reads its int4 experts as a compressed-tensors checkpoint"):
        make("RAWINT4_SFT").load_weights_from_tensors(*base_weights())

    wrapper = make()
    x, ids, w, dy = batch()
    with pytest.raises(RuntimeError, match="Weights not loaded"):
        wrapper.forward(x, ids, w)
    wrapper.load_weights_from_tensors(*base_weights())
    with pytest.raises(RuntimeError, match="LoRA weights not initialized. Call init_lora_weights"):
        wrapper.forward(x, ids, w)
    lora, grads = lora_tensors()
    bad = dict(lora, up_lora_b=lora["up_lora_b"].float())
    with pytest.raises(ValueError, match="up_lora_b must be a CPU torch.bfloat16 tensor for AMXBF16_SFT SFT, got "
                                         "torch.float32"):
        wrapper.init_lora_weights(*bad.values(), *grads.values())
    bad = dict(grads, down_lora_a=torch.zeros(E, R, H, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"grad_down_lora_a shape mismatch: expected \(8, 8, 64\), got \(8, 8, 128\)"):
        wrapper.init_lora_weights(*lora.values(), *bad.values())
    mixed = dict(lora, gate_lora_a=torch.nn.Parameter(lora["gate_lora_a"]))
    with pytest.raises(ValueError, match="all six factors to be nn.Parameter objects, or none"):
        wrapper.init_lora_weights(*mixed.values(), *grads.values())
    wrapper.init_lora_weights(*lora.values(), *grads.values())
    with pytest.raises(RuntimeError, match="No forward cache available"):
        wrapper.backward(dy)
    with pytest.raises(ValueError, match=r"qlen \(65\) exceeds chunked_prefill_size \(64\)"):
        wrapper.forward(torch.zeros(65, H), torch.zeros(65, K, dtype=torch.int64), torch.zeros(65, K))
    with pytest.raises(ValueError, match=r"expert_ids must lie in \[0, 8\) \(-1: no expert\), found -1..8"):
        wrapper.forward(x, ids.clamp(max=7).index_fill(0, torch.tensor([0]), 8), w)
    with pytest.raises(ValueError, match=r"weights shape \(24, 3\) must be \(24, 2\)"):
        wrapper.forward(x, ids, torch.zeros(T, 3))
    wrapper.forward(x, ids, w)
    with pytest.raises(ValueError, match=r"optimizer_grad_scale must be finite and positive, got -1"):
        wrapper.backward(dy, optimizer_grad_scale=-1)


def test_mode_is_kt_kernels_fifteenth_argument_and_names_are_listed():
    wrapper = KTMoEWrapper(0, E, K, H, I, None, None, 1, None, 64, False, None, "AMXINT8_SFT", None, "sft",
                           lora_rank=4)
    assert isinstance(wrapper, SFTMoEWrapper) and wrapper.lora_rank == 4 and wrapper.lora_scaling == 32.0 / 4
    assert "AMXBF16_SFT_SkipLoRA" in sft_methods() and "RAWINT4_SFT" in sft_methods()
    assert np.isclose(make(lora_alpha=8.0).lora_scaling, 1.0)


def test_the_buffer_pool_takes_back_only_its_own_buffers_once():
    from kt_core.training_step import BufferPool

    pool = BufferPool()
    a = pool.take(10, 4)
    foreign = torch.zeros(20, 4)
    pool.give(a, a, foreign[:10], foreign)
    b, c = pool.take(8, 4), pool.take(8, 4)
    assert b._base is a._base and c._base is not a._base and c._base is not foreign
    assert pool.take(30, 4).shape == (30, 4) and pool.take(3, 5).shape == (3, 5)
