"""patch_model(mode="train", weight_path=...): LoRA over frozen experts read as stored — a
checkpoint's own FP8 / INT4 / NVFP4 / MXFP8 codes, a `kt convert` folder, a GGUF file — against
PEFT training the same adapters in torch over the weights those codes stand for.

Both sides start from the same adapter factors and take the same AdamW steps; the losses differ
by kt's activation rounding on the quantized formats (bf16 for the FP8 family, int8 for the INT4
family, as in inference: test_integration_weight_path), which the tolerance below states per
format as measured, with margin.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
from test_integration_weight_path import tiny_qwen3  # noqa: E402
from test_training_transformers import ALPHA, RANK, copy_adapters_into_peft, peft_twin, train  # noqa: E402

from kt.integrations.transformers import patch_model  # noqa: E402
from kt.testing.checkpoints import write_checkpoint  # noqa: E402
from kt_core import KTError  # noqa: E402


def batches(seed=0):
    """Two batches, three times over: six steps in which the loss must fall."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 64, (2, 12), generator=gen) for _ in range(2)] * 3


def rel_max(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def compare_with_peft(truth, **patch_kw):
    """kt's patched model against PEFT over `truth`: the same non-zero adapter factors, one
    forward and backward each; returns (patch, loss error, largest adapter-gradient error), errors
    relative to PEFT's. The factors hold the gradients afterwards: the patched model is spent."""
    model = tiny_qwen3(truth)
    twin = peft_twin(model)
    patch = patch_model(model, mode="train", lora_rank=RANK, lora_alpha=ALPHA, **patch_kw)
    torch.manual_seed(1)
    with torch.no_grad():   # B is zero at initialisation: non-zero factors so every gradient flows
        for p in patch.adapter_parameters():
            p.normal_(0.0, 0.05)
    copy_adapters_into_peft(patch, twin)
    ids = batches()[0]
    losses = []
    for m in (model.train(), twin.train()):
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    with torch.no_grad():   # each side's gradients in its adapter factors' place, read out in PEFT's names
        for p in patch.adapter_parameters() + [p for p in twin.parameters() if p.requires_grad]:
            p.data = p.grad.clone()
    from kt.training import adapter_state_dict

    kt_grads, _ = adapter_state_dict(patch.modules)
    peft_grads = peft.get_peft_model_state_dict(twin)
    assert kt_grads.keys() == peft_grads.keys()
    grad_err = max(rel_max(kt_grads[k], peft_grads[k]) for k in kt_grads)
    return patch, abs(losses[0] - losses[1]) / abs(losses[1]), grad_err


# (loss, adapter-gradient) tolerances, relative to PEFT's. Measured on the AMX host
# (avx/x86-64-v4-vnni-bf16): fp8 0 / 1.6e-5, mxfp8 1.1e-7 / 1.9e-5 (bf16 activations), rawint4
# 4.6e-7 / 3.5e-4, gptq 2.6e-6 / 3.4e-4, nvfp4 4.1e-6 / 4.1e-4 (int8 activations).
@pytest.mark.parametrize("quant, method, tol", [("fp8", "FP8", (1e-5, 1e-4)), ("mxfp8", "MXFP8", (1e-5, 1e-4)),
                                                ("rawint4", "RAWINT4", (2e-5, 2e-3)),
                                                ("gptq", "GPTQ_INT4", (2e-5, 2e-3)), ("nvfp4", "NVFP4", (2e-5, 2e-3))])
def test_lora_over_checkpoint_codes_matches_peft_over_their_weights(tmp_path, quant, method, tol):
    truth = write_checkpoint(tmp_path, "qwen3_moe", hidden=128, intermediate=64, experts=8, top_k=2, layers=3,
                             quant=quant)
    patch, loss_err, grad_err = compare_with_peft(truth, method=method, weight_path=tmp_path)
    assert patch.method == method and len(patch.layers) == 3
    # The model's own expert tensors are freed as without weight_path: 3 layers x 8 x 3 x 64 x 128 f32.
    assert patch.freed_bytes == 3 * 8 * 3 * 64 * 128 * 4
    assert loss_err < tol[0] and grad_err < tol[1], f"{method}: loss error {loss_err:.2e}, gradients {grad_err:.2e}"
    model = tiny_qwen3(truth)
    patch = patch_model(model, method=method, weight_path=tmp_path, mode="train", lora_rank=RANK, lora_alpha=ALPHA)
    losses = train(model.train(), patch.adapter_parameters(), batches())
    assert losses[-1] < losses[0] - 0.05, losses


def test_lora_over_a_converted_folder_equals_quantizing_at_patch_time(tmp_path):
    """A `kt convert` folder holds the codes kt's quantizer makes from the same weights: the
    training run over it is the run that quantizes at patch time, loss for loss."""
    from kt.weights import convert

    truth = write_checkpoint(tmp_path / "model", "qwen3_moe", hidden=128, intermediate=64, experts=8, top_k=2,
                             layers=3)
    out = convert(tmp_path / "model", tmp_path / "converted", method="INT4", group_size=32, zero_point=True)
    runs = []
    for kw in ({"group_size": 32, "zero_point": True}, {"weight_path": out}):
        model = tiny_qwen3(truth)
        # The checkpoint is bf16 and the converted codes come from its bf16 values: quantize the same.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        patch = patch_model(model, method="INT4", mode="train", lora_rank=RANK, lora_alpha=ALPHA, **kw)
        torch.manual_seed(1)
        with torch.no_grad():   # the same non-zero B factors on both runs
            for p in patch.adapter_parameters():
                p.normal_(0.0, 0.05)
        runs.append(train(model.train(), patch.adapter_parameters(), batches()))
    assert runs[0] == runs[1], runs


@pytest.mark.parametrize("fast_activations, tol", [(None, (1e-3, 1e-1)), (False, (1e-5, 1e-4))])
def test_lora_over_gguf_experts(tmp_path, fast_activations, tol):
    """LLAMAFILE has no transposed ggml products in the backends yet: the frozen GGUF experts train on
    kt-core's reference backend (said by patch.backends). Against PEFT over the dequantized blocks,
    with llama.cpp's Q8_0 activation rounding (LLAMAFILE's default) measured 7.9e-5 (loss) / 2.7e-2
    (gradients), with the precise activations (fast_activations=False) 1.2e-7 / 1.5e-6."""
    from kt.testing.gguf_files import write_moe_gguf

    path = tmp_path / "tiny.gguf"
    truth = write_moe_gguf(path, hidden=128, intermediate=64, experts=8, top_k=2, layers=3, types=("Q8_0",) * 3)
    patch, loss_err, grad_err = compare_with_peft(truth, method="LLAMAFILE", weight_path=path,
                                                  fast_activations=fast_activations)
    assert patch.backends == ("reference/baseline",)
    assert loss_err < tol[0] and grad_err < tol[1], f"loss error {loss_err:.2e}, gradients {grad_err:.2e}"


def test_weight_path_refusals(tmp_path):
    truth = write_checkpoint(tmp_path, "qwen3_moe", hidden=128, intermediate=64, experts=8, top_k=2, layers=3,
                             quant="fp8")
    with pytest.raises(KTError, match=r"train_experts: the expert weights that train are the model's own"):
        patch_model(tiny_qwen3(truth), method="BF16", mode="train", train_experts=True, weight_path=tmp_path)
    with pytest.raises(KTError, match="stores FP8 experts; INT8 needs a converted folder"):
        patch_model(tiny_qwen3(truth), method="INT8", mode="train", weight_path=tmp_path)


def test_an_fp8_model_folder_as_transformers_loads_it(tmp_path):
    """The flow for a DeepSeek-V3-style FP8 checkpoint: transformers loads the folder (on a CPU it
    dequantizes the E4M3 blocks), patch_model(mode="train", method="FP8", weight_path=the folder)
    gives kt the stored codes instead and frees the dequantized experts; the patched model's logits
    match the loaded model's (bf16 activations: measured 4.7e-7) and LoRA over them trains."""
    from kt.testing.checkpoints import experts_to_fp8

    cfg = transformers.Qwen3MoeConfig(hidden_size=128, moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      intermediate_size=256, vocab_size=64)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    experts_to_fp8(tmp_path)   # the per-expert weights as saved, now E4M3 blocks

    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = batches()[0]
    with torch.no_grad():
        want = model(ids).logits
    patch = patch_model(model, method="FP8", mode="train", lora_rank=RANK, lora_alpha=ALPHA, weight_path=tmp_path)
    assert patch.method == "FP8" and patch.freed_bytes == 2 * 8 * 3 * 128 * 128 * 4
    with torch.no_grad():
        got = model.eval()(ids).logits
    assert rel_max(got, want) < 1e-4, rel_max(got, want)
    losses = train(model.train(), patch.adapter_parameters(), batches())
    assert losses[-1] < losses[0] - 0.05, losses
