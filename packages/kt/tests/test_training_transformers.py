"""patch_model(mode="train") on tiny transformers MoE models, against PEFT doing the same in torch.

PEFT (target_parameters on the experts' fused gate_up_proj / down_proj) is the pure-torch LoRA run:
both start from the same adapter factors, take the same AdamW steps on the same batches, and the
losses must agree step by step; adapters kt saves load into PEFT (and the other way) with the same
logits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
from test_integration_transformers import copy_of, experts_modules, prompt, rel_max, tiny_gpt_oss, tiny_model  # noqa: E402

from kt.integrations.transformers import patch_model  # noqa: E402
from kt.training import KTTrainPatch, LoRAExperts  # noqa: E402
from kt.training.peft_format import merge_expert_adapter  # noqa: E402
from kt_core import KTError  # noqa: E402

RANK, ALPHA = 4, 8.0
TARGET_PARAMETERS = ["experts.gate_up_proj", "experts.down_proj"]   # mlp.experts, Llama 4: feed_forward.experts


def peft_twin(model):
    """A PEFT LoRA model on a copy of `model` (before patching) with kt's expert adapters."""
    cfg = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=[], target_parameters=TARGET_PARAMETERS)
    return peft.get_peft_model(copy_of(model), cfg)


def copy_adapters_into_peft(patch: KTTrainPatch, twin) -> None:
    """kt's adapter factors into PEFT's modules (through PEFT's own state-dict loader)."""
    from kt.training import adapter_state_dict

    tensors, _ = adapter_state_dict(patch.modules)
    missing = peft.set_peft_model_state_dict(twin, {k: v.clone() for k, v in tensors.items()})
    assert not missing.unexpected_keys, missing.unexpected_keys


def batches(steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (2, 12), generator=gen) for _ in range(steps)]


def train(model, params, data, lr=1e-2, optimizer=torch.optim.AdamW):
    opt = optimizer(params, lr=lr)
    losses = []
    for ids in data:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    return losses


def assert_losses_match(kt_losses, reference_losses, tol, reference):
    """kt's loss within tol (relative) of the reference run's at every step."""
    for step, (a, b) in enumerate(zip(kt_losses, reference_losses)):
        assert abs(a - b) <= tol * abs(b), f"step {step}: kt loss {a:.6f}, {reference} {b:.6f}"


def tiny(model_type):
    return tiny_gpt_oss() if model_type == "gpt_oss" else tiny_model(model_type)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "deepseek_v2", "deepseek_v3",
                                        "glm4_moe", "gpt_oss", "minimax_m2", "deepseek_v32", "glm4_moe_lite",
                                        "qwen3_next", "llama4_text", "deepseek_v4", "hy_v4", "mimo_v2_flash",
                                        "bailing_hybrid", "gemma4_text", "phimoe", "granitemoehybrid", "jamba", "lfm2_moe",
                                        "aria_text", "zaya"])
def test_training_matches_peft_step_for_step_and_reduces_the_loss(model_type):
    """gpt_oss: expert biases, the clamped SwiGLU, gate and up interleaved in gate_up_proj [E, H, 2I]."""
    model = tiny(model_type)
    blocks = len(experts_modules(model))
    twin = peft_twin(model)
    patch = patch_model(model, method="BF16", mode="train", lora_rank=RANK, lora_alpha=ALPHA)
    assert isinstance(patch, KTTrainPatch) and len(patch.layers) == blocks
    assert all(isinstance(m, LoRAExperts) for m in patch.layers.values())
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("_A" in n or "_B" in n for n in trainable), trainable
    copy_adapters_into_peft(patch, twin)
    data = batches(6) * 2
    torch.manual_seed(0)   # Phi-MoE's sparsemixer samples its routing in training: the same draws for both
    kt_losses = train(model.train(), patch.adapter_parameters(), data)
    torch.manual_seed(0)
    peft_losses = train(twin.train(), [p for p in twin.parameters() if p.requires_grad], data)
    assert_losses_match(kt_losses, peft_losses, 1e-4, "PEFT")
    assert kt_losses[-1] < kt_losses[0] - 0.05, kt_losses


@pytest.mark.parametrize("model_type", ["gpt_oss", "llama4_text"])
def test_input_first_adapters_from_peft_serve_and_merge(tmp_path, model_type):
    """GPT-OSS keeps gate and up interleaved in gate_up_proj [E, H, 2I] (and tells PEFT it is
    [E, in, out]); Llama 4 keeps them as halves and does not (PEFT's A then acts on the output side):
    an adapter PEFT wrote (random factors) serves on kt with PEFT's logits (kt reorders B's rows,
    swaps the factors), and merges into the model's [E, in, out] parameters with the same logits
    (kt sft export --merge)."""
    twin = peft_twin(tiny(model_type))
    with torch.no_grad():
        for n, p in twin.named_parameters():
            if "lora_" in n:
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(len(n)))
    twin.eval().save_pretrained(tmp_path / "peft")
    ids = prompt()
    with torch.no_grad():
        want = twin(ids).logits
        served = tiny(model_type)
        patch_model(served, method="BF16", expert_lora_path=tmp_path / "peft")
        assert rel_max(served(ids).logits, want) < 1e-4
        merged = tiny(model_type)
        assert merge_expert_adapter(merged, tmp_path / "peft") == 2 * len(experts_modules(merged))
        assert rel_max(merged.eval()(ids).logits, want) < 1e-4


@pytest.mark.parametrize("model_type, target", [("qwen3_moe", ("gate_up", "down")), ("qwen3_moe", ("gate", "up", "down")),
                                                ("gpt_oss", ("gate_up", "down"))])
def test_gpu_resident_experts_train_with_their_adapters(model_type, target):
    """num_gpu_experts with mode="train": those experts are torch's (here on the CPU device, in the
    model's float32), with their rows of the same adapters (GPT-OSS's: with their biases and the
    clamped SwiGLU); kt computes the others. Against PEFT step for step, as the all-kt run (gate/up
    apart: against kt with every expert on kt, PEFT having no form for separate adapters on the
    fused projection)."""
    model = tiny(model_type)
    reference = copy_of(model)
    patch = patch_model(model, method="BF16", mode="train", lora_rank=RANK, lora_alpha=ALPHA, target=target,
                        num_gpu_experts=3, placement="random")
    resident = {layer: sum(m) for layer, m in patch.gpu_masks.items()}
    assert sum(resident.values()) == 3 * len(resident) and all(
        m.resident_experts.numel() == resident[layer] for layer, m in patch.layers.items())
    if target == ("gate_up", "down"):
        twin = peft_twin(reference)
        copy_adapters_into_peft(patch, twin)
        twin_params = [p for p in twin.parameters() if p.requires_grad]
    else:
        twin = reference
        twin_patch = patch_model(twin, method="BF16", mode="train", lora_rank=RANK, lora_alpha=ALPHA, target=target)
        with torch.no_grad():
            for a, b in zip(twin_patch.adapter_parameters(), patch.adapter_parameters()):
                a.copy_(b)
        twin_params = twin_patch.adapter_parameters()
    data = batches(6)
    kt_losses = train(model.train(), patch.adapter_parameters(), data)
    twin_losses = train(twin.train(), twin_params, data)
    assert_losses_match(kt_losses, twin_losses, 1e-4, "reference")
    assert kt_losses[-1] < kt_losses[0], kt_losses


def test_moving_the_model_leaves_the_adapters_on_the_cpu_for_kt():
    """model.to(device / dtype) after patching: the torch parts and the GPU-resident experts move (here
    to bfloat16, the one move a CPU host can show), the adapters stay float32 on the CPU where kt
    computes with them, and the moved model trains (the same step as kt_sft's device setting takes)."""
    model = tiny_model("qwen3_moe")
    patch = patch_model(model, method="BF16", mode="train", lora_rank=RANK, lora_alpha=ALPHA, num_gpu_experts=2)
    model.to(torch.bfloat16)
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in patch.adapter_parameters())
    layer = next(iter(patch.layers.values()))
    assert layer.resident_gate_up.dtype == torch.bfloat16 and layer.resident_slot.dtype == torch.int64
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    before = [p.detach().clone() for p in patch.adapter_parameters()]
    losses = train(model.train(), patch.adapter_parameters(), batches(2) * 3)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, patch.adapter_parameters()))


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "deepseek_v3", "gpt_oss"])
def test_saved_adapter_loads_into_peft_with_the_same_logits(tmp_path, model_type):
    model = tiny(model_type)
    fresh = copy_of(model)
    patch = patch_model(model, method="BF16", mode="train", lora_rank=RANK, lora_alpha=ALPHA)
    with torch.no_grad():
        for p in patch.adapter_parameters():
            p.normal_(0.0, 0.2)
    model.eval()
    path = patch.save_adapter(tmp_path / "adapter", base_model_name_or_path="tiny")
    config = json.loads((path / "adapter_config.json").read_text())
    assert config["r"] == RANK and config["lora_alpha"] == ALPHA and config["base_model_name_or_path"] == "tiny"
    loaded = peft.PeftModel.from_pretrained(fresh, str(path)).eval()
    ids = prompt()
    with torch.no_grad():
        want, got = loaded(ids).logits, model(ids).logits
    assert rel_max(got, want) < 1e-4


def test_separate_gate_and_up_adapters_export_to_peft(tmp_path):
    """kt-kernel's layout (one adapter on gate, one on up) has no PEFT form of its own: it is written as
    one fused gate_up adapter of rank 2r (A's stacked, B block-diagonal) with down padded to 2r and
    alpha doubled — the same deltas, so PEFT computes the same logits; loading it back into separate
    adapters is refused by name."""
    model = tiny_model("qwen3_moe")
    fresh = copy_of(model)
    patch = patch_model(model, method="BF16", mode="train", lora_rank=RANK, lora_alpha=ALPHA,
                        target=("gate", "up", "down"))
    assert sorted(n for n, _ in patch.layers[0].named_parameters()) == [
        "down_A", "down_B", "gate_A", "gate_B", "up_A", "up_B"]
    with torch.no_grad():
        for p in patch.adapter_parameters():
            p.normal_(0.0, 0.2)
    path = patch.save_adapter(tmp_path / "adapter")
    config = json.loads((path / "adapter_config.json").read_text())
    assert config["r"] == 2 * RANK and config["lora_alpha"] == 2 * ALPHA
    loaded = peft.PeftModel.from_pretrained(fresh, str(path)).eval()
    ids = prompt()
    with torch.no_grad():
        assert rel_max(model.eval()(ids).logits, loaded(ids).logits) < 1e-4
    with pytest.raises(KTError, match="patched with separate ones"):
        patch.load_adapter(path)


def test_peft_adapter_serves_on_kt(tmp_path):
    """An adapter PEFT trained and saved, served by kt (SGLang's --kt-expert-lora-path)."""
    model = tiny_model("qwen3_moe")
    twin = peft_twin(model)
    with torch.no_grad():
        for n, p in twin.named_parameters():
            if "lora_" in n:
                p.normal_(0.0, 0.2)
    twin.save_pretrained(tmp_path / "peft")
    patch = patch_model(model, method="BF16", expert_lora_path=tmp_path / "peft")
    assert not any(p.requires_grad for p in patch.adapter_parameters())
    ids = prompt()
    with torch.no_grad():
        assert rel_max(model.eval()(ids).logits, twin.eval()(ids).logits) < 1e-4


def test_quantized_base_trains(tmp_path):
    """QLoRA-style: INT4 frozen experts, adapters trained on top; the loss falls."""
    model = tiny_model("qwen3_moe")
    patch = patch_model(model, method="INT4", group_size=32, mode="train", lora_rank=RANK, lora_alpha=ALPHA,
                        recompute=True)
    losses = train(model.train(), patch.adapter_parameters(), batches(4) * 3)
    assert losses[-1] < losses[0] - 0.05, losses


def test_training_refusals(tmp_path):
    with pytest.raises(KTError, match="mode must be"):
        patch_model(tiny_model(), mode="sft")
    with pytest.raises(KTError, match="max_deferred_experts_per_token: not available with expert LoRA"):
        patch_model(tiny_model(), mode="train", max_deferred_experts_per_token=1)
    with pytest.raises(KTError, match="every expert of this layer is GPU-resident: nothing is left for kt"):
        patch_model(tiny_model(), mode="train", num_gpu_experts=8)
    with pytest.raises(KTError, match="are alternatives"):
        patch_model(tiny_model(), mode="train", target=("gate_up", "up"))
    with pytest.raises(KTError, match="is not a PEFT adapter folder"):
        patch_model(tiny_model(), expert_lora_path=tmp_path)
    model = tiny_model()
    patch = patch_model(model, mode="train", lora_rank=RANK, lora_alpha=ALPHA)
    patch.save_adapter(tmp_path / "a")
    with pytest.raises(KTError, match="rank 4 / alpha 8"):
        patch_model(tiny_model(), expert_lora_path=tmp_path / "a", lora_rank=8)
    with pytest.raises(KTError, match="target_parameters on down_proj "):
        patch_model(tiny_model(), expert_lora_path=tmp_path / "a", lora_rank=RANK, lora_alpha=ALPHA, target=("down",))


def test_transformers_trainer_trains_the_expert_adapters(tmp_path):
    """The patched model under transformers' Trainer: only the expert adapters train, the loss falls."""
    model = tiny_model("qwen3_moe")
    patch = patch_model(model, method="BF16", mode="train", lora_rank=RANK, lora_alpha=ALPHA)
    before = [p.detach().clone() for p in patch.adapter_parameters()]
    rows = torch.randint(3, 128, (16, 12), generator=torch.Generator().manual_seed(5))
    data = [{"input_ids": ids, "labels": ids} for ids in rows]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=12,
                                          learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no",
                                          use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 12 and losses[-1] < losses[0], losses
    assert all(not torch.equal(a, b.detach()) for a, b in zip(before, patch.adapter_parameters()))


def torch_expert_twin(model):
    """A copy of `model` (before patching) whose routed experts' weights (and biases) alone train, in torch."""
    twin = copy_of(model)
    twin.requires_grad_(False)
    for m in experts_modules(twin):
        for name in ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"):
            if hasattr(m, name):
                getattr(m, name).requires_grad_(True)
    return twin


# FP32: kt computes with the parameters' values (same losses as torch to float32 rounding). BF16:
# kt computes with a bf16 copy of the float32 parameters each step, which torch does not (measured:
# up to 1.8e-3 of the loss by step 8 on qwen3_moe).
@pytest.mark.parametrize("method, model_type, tol", [("FP32", "qwen3_moe", 1e-4), ("FP32", "deepseek_v3", 1e-4),
                                                      ("FP32", "mixtral", 1e-4), ("BF16", "qwen3_moe", 5e-3),
                                                      ("FP32", "gpt_oss", 1e-4)])
def test_full_fine_tuning_matches_torch_step_for_step(method, model_type, tol):
    """train_experts=True, no adapters: the experts' own weights train on kt, step for step with torch
    training the same weights; the other parameters stay frozen. GPT-OSS: its input-first gate_up with
    gate and up interleaved, the clamped SwiGLU, and its two biases training too."""
    model = tiny(model_type)
    twin = torch_expert_twin(model)
    patch = patch_model(model, method=method, mode="train", train_experts=True)
    per_layer = 4 if model_type == "gpt_oss" else 2
    assert patch.adapter_parameters() == [] and len(patch.expert_weight_parameters()) == per_layer * len(patch.layers)
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == sorted(n for n, p in twin.named_parameters() if p.requires_grad), trainable
    data = batches(4) * 2
    kt_losses = train(model.train(), patch.trainable_parameters(), data)
    torch_losses = train(twin.train(), [p for p in twin.parameters() if p.requires_grad], data)
    assert_losses_match(kt_losses, torch_losses, tol, "torch")
    assert kt_losses[-1] < kt_losses[0] - 0.5, kt_losses


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_oss"])
def test_full_fine_tuning_with_gpu_resident_experts(tmp_path, model_type):
    """train_experts with num_gpu_experts: the resident experts' weights (GPT-OSS: and biases) train as
    parameters of their own on the model's device (the CPU device here), the others on kt — step for
    step with torch training every expert's weights (FP32). The model's state dict holds every expert
    as trained, under the model's names only: save_pretrained loads into an unpatched model with the
    logits of kt's and of torch's trained model; a state dict loaded into the patched model reaches
    the resident parameters."""
    model = tiny(model_type)
    original = copy_of(model)
    twin = torch_expert_twin(model)
    patch = patch_model(model, method="FP32", mode="train", train_experts=True, num_gpu_experts=2, placement="random")
    per_layer = 4 if model_type == "gpt_oss" else 2
    layers = patch.layers.values()
    assert all(len(m.resident_weights()) == per_layer and m.resident_experts.numel() == 2 for m in layers)
    assert len(patch.expert_weight_parameters()) == 2 * per_layer * len(patch.layers)
    assert not any("resident" in k for k in model.state_dict())
    data = batches(4) * 2
    kt_losses = train(model.train(), patch.trainable_parameters(), data)
    torch_losses = train(twin.train(), [p for p in twin.parameters() if p.requires_grad], data)
    assert_losses_match(kt_losses, torch_losses, 1e-4, "torch")
    assert kt_losses[-1] < kt_losses[0] - 0.5, kt_losses

    model.save_pretrained(tmp_path / "model")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    ids = prompt()
    with torch.no_grad():
        got, want, torch_trained = model.eval()(ids).logits, loaded(ids).logits, twin.eval()(ids).logits
    assert rel_max(got, want) < 1e-5 and rel_max(want, torch_trained) < 1e-4

    missing = model.load_state_dict(original.state_dict(), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    with torch.no_grad():
        assert rel_max(model(ids).logits, original.eval()(ids).logits) < 1e-5


@pytest.mark.parametrize("model_type, rank", [("qwen3_moe", 0), ("qwen3_moe", RANK), ("gpt_oss", RANK)])
def test_fully_fine_tuned_experts_save_as_an_ordinary_checkpoint(tmp_path, model_type, rank):
    """save_pretrained writes the trained experts under the model's own names (GPT-OSS: in its own
    layout, biases included): the folder loads into an unpatched transformers model (and, with
    adapters trained beside them, PEFT loads the adapter saved with save_adapter on top) whose logits
    match kt's (FP32)."""
    model = tiny(model_type)
    patch = patch_model(model, method="FP32", mode="train", train_experts=True, lora_rank=rank, lora_alpha=ALPHA)
    before = [p.detach().clone() for p in patch.trainable_parameters()]
    losses = train(model.train(), patch.trainable_parameters(), batches(3) * 2)
    assert losses[-1] < losses[0], losses
    assert all(not torch.equal(a, b.detach()) for a, b in zip(before, patch.trainable_parameters()))
    model.save_pretrained(tmp_path / "model")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    if rank:
        patch.save_adapter(tmp_path / "adapter")
        loaded = peft.PeftModel.from_pretrained(loaded, tmp_path / "adapter").eval()
    else:
        with pytest.raises(KTError, match=r"no adapters \(lora_rank=0.*model.save_pretrained"):
            patch.save_adapter(tmp_path / "adapter")
    ids = prompt()
    with torch.no_grad():
        want, got = loaded(ids).logits, model.eval()(ids).logits
    assert rel_max(got, want) < 1e-5


def test_full_fine_tuning_refusals():
    with pytest.raises(KTError, match="train_experts=True trains the expert weights: it needs mode='train'"):
        patch_model(tiny_model(), train_experts=True)
    model = tiny_model()
    with pytest.raises(KTError, match=r"needs a float method \(BF16 or FP32\).*got INT8"):
        patch_model(model, method="INT8", mode="train", train_experts=True)
    assert all(p.requires_grad for p in model.parameters()), "a refused patch leaves the model as it was"
