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
