"""kt-kernel's SFT wrapper API (`KTMoEWrapper(mode="sft")`), driven as kt-kernel's own training loop
drives it: one wrapper per MoE layer built with kt-kernel's SFT keyword arguments, experts loaded
from weight_path (a model folder for AMXBF16_SFT, a kt converted folder for AMXINT8_SFT, a
compressed-tensors int4 checkpoint for RAWINT4_SFT, a block-FP8 checkpoint for AMXFP8_SFT, read as
stored), bf16 LoRA
factors as nn.Parameters with caller-owned gradient buffers (init_lora_weights), then steps of
forward(save_for_backward=True) / backward(grad_output) / optimizer.step() / zero_grad().

Checked: the first step's layer output and input gradient against float64 autograd of the stored
(dequantized) weights (bf16 outputs: ||kt - ref|| / ||ref|| <= 1e-2, bf16's own rounding is ~2e-3),
and that a few AdamW steps on the LoRA factors lower a regression loss on every layer."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from kt.testing.checkpoints import write_checkpoint  # noqa: E402
from kt.weights import Checkpoint  # noqa: E402
from kt.weights.conversion import convert  # noqa: E402
from kt_core.testing import quantize as Q  # noqa: E402
from kt_kernel import KTMoEWrapper  # noqa: E402

H, I, E, TOP_K, T, RANK = 128, 128, 8, 2, 16, 8


def layers_and_truth(tmp_path, method):
    folder = tmp_path / "hf"
    model_type, quant = {"RAWINT4_SFT": ("kimi_k2", "rawint4"), "AMXFP8_SFT": ("qwen3_moe", "fp8")}.get(method,
                                                                                                 ("qwen3_moe", None))
    truth = write_checkpoint(folder, model_type, hidden=H, intermediate=I, experts=E, top_k=TOP_K, layers=2,
                             quant=quant)
    layers = list(Checkpoint(folder).spec.moe_layers)
    if method == "AMXINT8_SFT":
        out = convert(folder, tmp_path / "converted", method="INT8")
        truth = {layer: Q.dequantized_weights("INT8", *(m.astype(np.float32) for m in w)) for layer, w in truth.items()}
        return out, truth, layers
    return folder, truth, layers


def reference(x, ids, w, gate, up, down):
    """(output, d output / d x given dy) of the frozen experts, float64 (the LoRA starts at B = 0)."""
    X = torch.from_numpy(x).requires_grad_()
    out = torch.zeros_like(X)
    for t in range(x.shape[0]):
        for j in range(TOP_K):
            e = int(ids[t, j])
            h = torch.nn.functional.silu(torch.from_numpy(gate[e]) @ X[t]) * (torch.from_numpy(up[e]) @ X[t])
            out[t] = out[t] + float(w[t, j]) * (torch.from_numpy(down[e]) @ h)
    return out, X


@pytest.mark.parametrize("method", ["AMXBF16_SFT", "AMXINT8_SFT", "RAWINT4_SFT", "AMXFP8_SFT"])
def test_kt_kernel_sft_training_loop(tmp_path, method):
    weight_path, truth, layers = layers_and_truth(tmp_path, method)
    g = torch.Generator().manual_seed(0)
    for layer in layers:
        wrapper = KTMoEWrapper(layer_idx=layer, num_experts=E, num_experts_per_tok=TOP_K, hidden_size=H,
                               moe_intermediate_size=I, num_gpu_experts=0, cpuinfer_threads=2, threadpool_count=1,
                               weight_path=str(weight_path), chunked_prefill_size=64, method=method, mode="sft",
                               lora_rank=RANK, lora_alpha=16.0)
        wrapper.load_weights(torch.arange(E, dtype=torch.int64))
        shapes = {"gate": ((E, RANK, H), (E, I, RANK)), "up": ((E, RANK, H), (E, I, RANK)),
                  "down": ((E, RANK, I), (E, H, RANK))}
        params, grads = [], []
        for a_shape, b_shape in shapes.values():   # PEFT's initialisation: A small, B zero
            params += [torch.nn.Parameter((torch.randn(a_shape, generator=g) / H**0.5).bfloat16()),
                       torch.nn.Parameter(torch.zeros(b_shape, dtype=torch.bfloat16))]
            grads += [torch.zeros(a_shape, dtype=torch.bfloat16), torch.zeros(b_shape, dtype=torch.bfloat16)]
        wrapper.init_lora_weights(*params, *grads)
        wrapper.update_lora_weights()
        optimizer = torch.optim.AdamW(params, lr=2e-2)

        x = torch.randn(T, H, generator=g).bfloat16()
        ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(T)])
        w = torch.softmax(torch.randn(T, TOP_K, generator=g), dim=-1)
        target = torch.randn(T, H, generator=g) * 0.1
        losses = []
        for step in range(6):
            out = wrapper.forward(x, ids, w, save_for_backward=True)
            diff = out.float() - target
            losses.append(float((diff**2).mean()))
            dy = 2 * diff / diff.numel()
            grad_x, grad_w = wrapper.backward(dy)
            if step == 0:
                ref, X = reference(x.double().numpy(), ids.numpy(), w.double().numpy(), *truth[layer])
                ref.backward(dy.bfloat16().double())
                assert float((out.double() - ref.detach()).norm() / ref.detach().norm()) < 1e-2
                assert float((grad_x.double() - X.grad).norm() / X.grad.norm()) < 1e-2
                assert grad_w.shape == (T, TOP_K) and all(p.grad is b for p, b in zip(params, grads))
            optimizer.step()
            optimizer.zero_grad()
        assert losses[-1] < losses[0] * 0.95, losses


def test_kt_kernel_module_paths_and_the_direct_sft_class(tmp_path):
    """kt-kernel's other import paths (`kt_kernel.experts`, `kt_kernel.experts_base`, as LLaMA-Factory's
    integration imports them) are kt-core's objects, and `AMXSFTMoEWrapper` built with kt-kernel's
    positional arguments is the wrapper KTMoEWrapper(mode="sft") builds: the same outputs and
    gradients, bit for bit."""
    import kt_core
    from kt_kernel import AMXSFTMoEWrapper
    from kt_kernel.experts import KTMoEWrapper as FromExperts
    from kt_kernel.experts_base import generate_gpu_experts_masks

    assert FromExperts is KTMoEWrapper and generate_gpu_experts_masks is kt_core.generate_gpu_experts_masks
    weight_path, _, layers = layers_and_truth(tmp_path, "AMXBF16_SFT")
    layer = layers[0]
    direct = AMXSFTMoEWrapper(layer, E, TOP_K, H, I, 0, 2, 1, str(weight_path), 64, RANK, 16.0)
    built = KTMoEWrapper(layer_idx=layer, num_experts=E, num_experts_per_tok=TOP_K, hidden_size=H,
                         moe_intermediate_size=I, num_gpu_experts=0, cpuinfer_threads=2, threadpool_count=1,
                         weight_path=str(weight_path), chunked_prefill_size=64, method="AMXBF16_SFT", mode="sft",
                         lora_rank=RANK, lora_alpha=16.0)
    assert type(built) in type(direct).__mro__
    g = torch.Generator().manual_seed(1)
    shapes = ((E, RANK, H), (E, I, RANK), (E, RANK, H), (E, I, RANK), (E, RANK, I), (E, H, RANK))
    factors = [(torch.randn(s, generator=g) * 0.05).bfloat16() for s in shapes]
    x = torch.randn(T, H, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(T)])
    w = torch.softmax(torch.randn(T, TOP_K, generator=g), dim=-1)
    dy = torch.randn(T, H, generator=g) * 0.1
    results = []
    for wrapper in (direct, built):
        wrapper.load_weights(torch.arange(E, dtype=torch.int64))
        params = [torch.nn.Parameter(f.clone()) for f in factors]
        wrapper.init_lora_weights(*params, *(torch.zeros_like(f) for f in factors))
        wrapper.update_lora_weights()
        out = wrapper.forward(x, ids, w, save_for_backward=True)
        results.append((out, *wrapper.backward(dy), *(p.grad.clone() for p in params)))
    for a, b in zip(*results):
        assert torch.equal(a, b)
