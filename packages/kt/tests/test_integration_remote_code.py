"""Models whose modeling code ships beside their checkpoint (trust_remote_code=True): DeepSeek's and
Kimi-K2's MoE blocks hold one MLP module per expert and loop over them in their own moe_infer.
kt.testing.remote_code writes a tiny model of that kind (model_type kimi_k2, a noaux_tc router with
groups, shared experts, a dense first layer); kt takes the experts and answers moe_infer, the
block's routing, shared experts and scaling stay the model's code."""

import pytest

torch = pytest.importorskip("torch", reason="the transformers integration needs torch")
transformers = pytest.importorskip("transformers", reason="the transformers integration needs transformers")

from kt.integrations.transformers import KTExperts, load_model, patch_model  # noqa: E402
from kt.integrations.transformers.loading import experts_unloaded  # noqa: E402
from kt.testing.remote_code import write_remote_model  # noqa: E402
from kt_core.errors import KTError  # noqa: E402

IDS = torch.tensor([[1, 5, 9, 33, 60, 7, 8, 21, 90, 100, 3, 4], [1, 40, 41, 42, 2, 3, 4, 5, 6, 7, 8, 127]])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_remote_model(tmp_path_factory.mktemp("kimi"))


def whole(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


def rel_max(got, want):
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("method, tol", [("BF16", 1e-5), ("INT8", 2e-2), ("INT4", 8e-2)])
def test_logits_against_the_models_own_loop(folder, method, tol):
    """The block's own moe_infer (fp32 sums over torch Linear layers) against kt's: BF16 packs the
    checkpoint's bf16 values (measured 1.7e-6 of the largest logit), INT8 / INT4 quantize them."""
    want = logits(whole(folder))
    model = whole(folder)
    patch = patch_model(model, method=method)
    assert sorted(patch.layers) == [1, 2]   # layer 0 is dense (first_k_dense_replace)
    block = model.model.layers[1].mlp
    assert isinstance(block.experts, KTExperts) and hasattr(block, "shared_experts")
    assert patch.freed_bytes == 2 * 3 * 8 * 32 * 64 * 4   # layers x projections x experts x I x H x fp32
    assert rel_max(logits(model), want) < tol


def test_gpu_resident_experts(folder):
    """Three experts per layer stay torch's (computed as the model's own experts are), kt the rest."""
    want = logits(whole(folder))
    model = whole(folder)
    patch = patch_model(model, method="BF16", num_gpu_experts=3)
    assert all(sum(m) == 3 for m in patch.gpu_masks.values())
    assert rel_max(logits(model), want) < 1e-5


def test_load_model_leaves_the_experts_to_kt(folder):
    """load_model(trust_remote_code=True): the per-expert modules hold meta tensors (their class is
    the shared experts' and the dense MLP's too: those load), kt reads the experts from the folder —
    the logits of the whole model patched."""
    model = load_model(folder, dtype=torch.float32, trust_remote_code=True)
    unloaded = [m for m in model.modules() if experts_unloaded(m)]
    assert len(unloaded) == 2 and all(isinstance(m, torch.nn.ModuleList) for m in unloaded)
    assert all(e.gate_proj.weight.is_meta for m in unloaded for e in m)
    assert not any(p.is_meta for p in model.parameters())   # shared experts, dense MLP, router: loaded
    with pytest.raises(KTError, match="loaded without its experts.*weight_path"):
        patch_model(model)
    patch = patch_model(model, method="BF16", weight_path=folder)
    assert patch.freed_bytes == 0
    full = whole(folder)
    patch_model(full, method="BF16")
    assert torch.equal(logits(model.eval()), logits(full))
    # Outside load_model the block builds its experts' parameters again.
    assert whole(folder).model.layers[1].mlp.experts[0].gate_proj.weight.shape == (32, 64)


def test_fp8_checkpoint_as_deepseek_and_kimi_store_it(tmp_path):
    """Every projection in FP8 blocks (attention, shared experts, dense MLP, experts), as DeepSeek-V3's
    and Kimi-K2's checkpoints are: transformers dequantizes the non-expert ones on a CPU, kt serves the
    experts' FP8 codes as stored — against the whole model transformers loads (dequantized): measured
    1.5e-6 of the largest logit."""
    from kt.testing.checkpoints import experts_to_fp8

    fp8 = write_remote_model(tmp_path)
    experts_to_fp8(fp8, every_projection=True)
    want = logits(whole(fp8))
    model = load_model(fp8, dtype=torch.float32, trust_remote_code=True)
    assert not any(p.is_meta for p in model.parameters())
    patch_model(model, method="FP8", weight_path=fp8)
    assert rel_max(logits(model.eval()), want) < 1e-5


def test_refusals(folder):
    model = whole(folder)
    block = model.model.layers[1].mlp
    w = block.experts[3].up_proj.weight   # as a quantized Linear holds its codes
    block.experts[3].up_proj.weight = torch.nn.Parameter(w.detach().to(torch.int8), requires_grad=False)
    with pytest.raises(KTError, match="expert 3's up_proj holds torch.int8 weights.*weight_path"):
        patch_model(model)
    model = whole(folder)
    model.model.layers[2].mlp.experts[5] = None
    with pytest.raises(KTError, match="layer 2: expert 5 is None.*ep_size"):
        patch_model(model)
    model = whole(folder)
    model.model.layers[1].mlp.experts[0].down_proj = torch.nn.Linear(32, 64, bias=True)
    with pytest.raises(KTError, match="expert 0's down_proj has a bias"):
        patch_model(model)
    model = whole(folder)
    patch_model(model)
    with pytest.raises(KTError, match="already patched"):
        patch_model(model)


# Training: LoRA on each expert's Linear layers, as PEFT puts it on such a model.

RANK, ALPHA = 4, 8.0


def peft_twin(folder):
    """The model in torch with PEFT's LoRA on the routed experts' Linear layers, its blocks' moe_infer
    the model's own loop without its no_grad (the reference run's autograd goes through it), in eval
    mode (the model's router has no training branch)."""
    import types

    peft = pytest.importorskip("peft")
    model = whole(folder)
    for layer in model.model.layers:
        if hasattr(layer.mlp, "moe_infer"):
            layer.mlp.moe_infer = types.MethodType(type(layer.mlp).moe_infer.__wrapped__, layer.mlp)
    cfg = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=r".*\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)")
    return peft.get_peft_model(model, cfg).eval()


def randomize(params, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.normal_(0.0, 0.1, generator=gen)


@pytest.mark.parametrize("num_gpu_experts", [0, 3])
def test_lora_training_matches_peft(folder, num_gpu_experts):
    """kt's separate gate / up / down adapters (the default for such a model) are PEFT's per-module
    LoRA exactly: from the same factors, every adapter gradient agrees with PEFT's (measured 2.6e-6 -
    3.9e-6 relative, BF16 experts: the checkpoint's own values) and SGD steps on the same batches give
    the same losses; with three experts per layer torch's (GPU-resident, here on the CPU) too. (AdamW's
    first steps move each element by ±lr whatever its gradient's size, so an element whose gradient is
    rounding noise on both sides decides the trajectory: not compared.)"""
    peft = pytest.importorskip("peft")
    from test_training_transformers import batches, train

    from kt.training import adapter_state_dict

    model = whole(folder)
    patch = patch_model(model, mode="train", method="BF16", lora_rank=RANK, lora_alpha=ALPHA,
                        num_gpu_experts=num_gpu_experts)
    assert patch.layers[1].targets == ("gate", "up", "down")
    assert all(sum(m) == num_gpu_experts for m in patch.gpu_masks.values())
    randomize([p for n, p in patch.layers[1].named_parameters() if n.endswith("_B")])   # B = 0 would hide A's path
    twin = peft_twin(folder)
    tensors, config = adapter_state_dict(patch.modules)
    assert not peft.set_peft_model_state_dict(twin, {k: v.clone() for k, v in tensors.items()}).unexpected_keys
    assert len(tensors) == 2 * 2 * 3 * 8   # layers x (A, B) x projections x experts

    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    model.train()(input_ids=ids, labels=ids).loss.backward()
    twin(input_ids=ids, labels=ids).loss.backward()
    theirs = dict(twin.named_parameters())
    for path, m in patch.modules.items():
        for t in m.targets:
            for ab in "AB":
                ps = [theirs[f"base_model.model.{path}.{e}.{t}_proj.lora_{ab}.default.weight"] for e in range(8)]
                want = torch.stack([p.grad if p.grad is not None else torch.zeros_like(p) for p in ps])
                got = getattr(m, f"{t}_{ab}").grad
                assert (got - want).norm() <= 1e-4 * want.norm() + 1e-12, (path, t, ab)
    model.zero_grad()
    twin.zero_grad()

    data = batches(8, seed=1)
    kt_losses = train(model, patch.adapter_parameters(), data, lr=0.5, optimizer=torch.optim.SGD)
    peft_losses = train(twin, [p for p in twin.parameters() if p.requires_grad], data, lr=0.5,
                        optimizer=torch.optim.SGD)
    for step, (a, b) in enumerate(zip(kt_losses, peft_losses)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: kt {a:.6f}, PEFT {b:.6f}"
    assert kt_losses[-1] < kt_losses[0] - 0.05, kt_losses


def test_adapters_round_trip_through_peft_and_merge(folder, tmp_path):
    """An adapter PEFT wrote for the model (random factors) serves on kt with PEFT's logits; what kt
    saves PEFT loads into the unpatched model with the same logits; merged into the expert Linear
    layers (kt sft export --merge) it gives them too. A fused gate_up adapter is written as gate_proj
    and up_proj sharing A."""
    peft = pytest.importorskip("peft")
    from kt.training.peft_format import merge_expert_adapter

    twin = peft_twin(folder)
    randomize([p for n, p in twin.named_parameters() if "lora_" in n])
    twin.save_pretrained(tmp_path / "peft")
    want = logits(twin)
    served = whole(folder)
    patch = patch_model(served, method="BF16", expert_lora_path=tmp_path / "peft")
    assert patch.layers[1].targets == ("gate", "up", "down")
    assert rel_max(logits(served), want) < 1e-5
    merged = whole(folder)
    assert merge_expert_adapter(merged, tmp_path / "peft") == 2 * 3 * 8
    assert rel_max(logits(merged), want) < 1e-5

    patch.save_adapter(tmp_path / "kt")
    again = peft.PeftModel.from_pretrained(whole(folder), tmp_path / "kt").eval()
    assert rel_max(logits(again), want) < 1e-5

    fused = whole(folder)
    fused_patch = patch_model(fused, mode="train", method="BF16", lora_rank=RANK, lora_alpha=ALPHA,
                              target=("gate_up", "down"))
    randomize(fused_patch.adapter_parameters())
    fused_patch.save_adapter(tmp_path / "fused")
    from_fused = peft.PeftModel.from_pretrained(whole(folder), tmp_path / "fused").eval()
    assert rel_max(logits(from_fused), logits(fused.eval())) < 1e-5
    with pytest.raises(KTError, match="fused gate_up adapter.*target=\\('gate', 'up', 'down'\\)"):
        fused_patch.load_adapter(tmp_path / "kt")


def test_lora_over_experts_left_unloaded_and_refusals(folder):
    model = load_model(folder, dtype=torch.float32, trust_remote_code=True)
    patch = patch_model(model, mode="train", method="INT8", weight_path=folder, lora_rank=RANK, lora_alpha=ALPHA)
    opt = torch.optim.AdamW(patch.adapter_parameters(), lr=1e-2)
    losses = []
    for _ in range(6):   # one batch, again and again: its loss falls
        loss = model.train()(input_ids=IDS, labels=IDS).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses
    with pytest.raises(KTError, match="train_experts.*one module per expert"):
        patch_model(whole(folder), mode="train", method="BF16", train_experts=True)


def test_kt_run_serves_it_with_trust_remote_code(folder, tmp_path, monkeypatch):
    """kt run MODEL --trust-remote-code: transformers runs the folder's modeling code, loads all but the
    experts (load_model), kt reads them from the folder; greedy tokens equal the whole model's, patched.
    Without the flag transformers refuses the folder by naming it."""
    import shutil

    from kt.integrations.transformers.preset import _tokenizer
    from kt.serve import Engine, ServeSettings

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    served = shutil.copytree(folder, tmp_path / "kimi")
    _tokenizer().save_pretrained(served)
    with pytest.raises(ValueError, match="trust_remote_code"):
        Engine.load(ServeSettings(model=str(served), port=0).resolved(), log=lambda _: None)
    settings = ServeSettings(model=str(served), port=0, trust_remote_code=True).resolved()
    assert ("modeling code", "the model folder's own (--trust-remote-code)") in settings.describe()
    logs = []
    engine = Engine.load(settings, log=logs.append)
    try:
        assert f"read its experts from {served} into kt" in logs[-1], logs
        ids = torch.tensor([engine.text_prompt("MoE on a CPU")])
        greedy = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
        with torch.no_grad():
            got = engine.model.generate(ids, **greedy)
            full = transformers.AutoModelForCausalLM.from_pretrained(served, dtype="auto", trust_remote_code=True).eval()
            patch_model(full)
            assert torch.equal(got, full.generate(ids, **greedy))
    finally:
        engine.close()


def test_deepseek_v2_routers_balance_loss_is_kept_in_training(tmp_path):
    """DeepSeek-V2's form (greedy softmax routing, aux_loss_alpha > 0): its router returns a balance loss
    in training, which the block's eval branch (the one kt's training runs) drops — kt keeps the router
    in training mode and adds the loss as DeepSeek-V2's training branch does. The routers' gradients
    against torch running the model's own loop with the losses added by hand (measured 1.4e-7 and
    1.8e-7 relative), and against them without the losses: different (by ~100 %)."""
    import types

    v2 = write_remote_model(tmp_path, model_type="deepseek_v2", topk_method="greedy", scoring_func="softmax",
                            aux_loss_alpha=0.5, routed_scaling_factor=1.0)

    def router_grads(model):
        return [layer.mlp.gate.weight.grad.clone() for layer in model.model.layers if hasattr(layer.mlp, "gate")]

    model = whole(v2)
    patch_model(model, mode="train", method="BF16", lora_rank=RANK, lora_alpha=ALPHA)
    for layer in model.model.layers[1:]:
        layer.mlp.gate.weight.requires_grad_(True)
    model.train()(input_ids=IDS, labels=IDS).loss.backward()
    got = router_grads(model)

    def reference(with_aux):
        twin = whole(v2)   # eval: the blocks take their eval branch, torch's loop made differentiable
        losses = []
        for layer in twin.model.layers[1:]:
            block = layer.mlp
            block.moe_infer = types.MethodType(type(block).moe_infer.__wrapped__, block)
            block.gate.train()
            block.gate.register_forward_hook(lambda m, i, o: losses.append(o[2]))
        loss = twin(input_ids=IDS, labels=IDS).loss
        (loss + sum(losses) if with_aux else loss).backward()
        return router_grads(twin)

    want, without = reference(True), reference(False)
    for g, w, n in zip(got, want, without):
        assert (g - w).norm() <= 1e-4 * w.norm()
        assert (n - w).norm() > 1e-2 * w.norm()   # the balance loss matters to these gradients
