"""load_model: a transformers MoE model loaded without its routed experts, which patch_model then
reads from the checkpoint (weight_path) — the memory of the non-expert weights only.

Each family's tiny model is saved by transformers itself (save_pretrained writes Qwen3-MoE's experts
fused, Mixtral's and DeepSeek-V3's one tensor per expert, as their hub checkpoints are), so the
loader meets the key renames and merges transformers applies to real checkpoints."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the transformers integration needs torch")
transformers = pytest.importorskip("transformers", reason="the transformers integration needs transformers")

from test_integration_transformers import CONFIGS as FAMILY_CONFIGS  # noqa: E402
from test_integration_transformers import experts_modules, tiny_gpt_oss  # noqa: E402

from kt.integrations.transformers import load_model, patch_model  # noqa: E402
from kt.integrations.transformers.loading import experts_unloaded  # noqa: E402
from kt_core.errors import KTError  # noqa: E402

IDS = torch.tensor([[1, 5, 9, 33, 60, 7, 8, 21], [1, 40, 41, 42, 2, 3, 4, 5]])
CONFIGS = {
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        hidden_size=128, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=256, vocab_size=64),
}


def save(folder, config):
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder)
    return folder


def logits(model):
    with torch.no_grad():
        return model.eval()(IDS).logits


def full_model(folder, method, **kw):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    patch_model(model, method=method, **kw)
    return model


def family_folder(tmp_path, family):
    if family == "gpt_oss":   # expert biases, interleaved gate/up, the clamped SwiGLU
        tiny_gpt_oss().to(torch.bfloat16).save_pretrained(tmp_path)
        return tmp_path
    return save(tmp_path, FAMILY_CONFIGS[family]())


@pytest.mark.parametrize("family, method", [(f, "BF16") for f in [*FAMILY_CONFIGS, "gpt_oss"]]
                         + [(f, "INT8") for f in ("qwen3_moe", "mixtral", "deepseek_v3")])
def test_logits_equal_loading_the_whole_model(tmp_path, family, method):
    """Every family: the experts kt reads from the folder are the ones transformers would have
    loaded (save_pretrained writes Qwen3-MoE's fused, Mixtral's and DeepSeek's one tensor per expert,
    as their hub checkpoints are): BF16 packs the same bf16 values, INT8 quantizes the same floats
    (at load instead of at patch time) — equal logits."""
    folder = family_folder(tmp_path, family)
    model = load_model(folder, dtype=torch.float32)
    unloaded = [m for m in model.modules() if experts_unloaded(m)]
    whole = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert len(unloaded) == len(experts_modules(whole))   # one per MoE layer (some families' first is dense)
    assert all(t.is_meta for m in unloaded for t in vars(m).values() if isinstance(t, torch.Tensor))
    assert not any(p.is_meta for p in model.parameters())   # everything else is loaded
    patch = patch_model(model, method=method, weight_path=folder)
    assert patch.freed_bytes == 0   # nothing of the experts was ever in torch
    assert torch.equal(logits(model), logits(full_model(folder, method)))


def test_qwen3_moe_hub_layout_one_tensor_per_expert(tmp_path):
    """Qwen3-MoE's hub checkpoints keep one gate/up/down tensor per expert (transformers 5 merges them
    while loading; its save_pretrained writes them fused): the same folder rewritten that way."""
    from safetensors.torch import load_file, save_file

    folder = save(tmp_path, CONFIGS["qwen3_moe"]())
    split = {}
    for name, t in load_file(folder / "model.safetensors").items():
        prefix = name.rsplit(".", 1)[0]
        if name.endswith("experts.gate_up_proj"):
            for e, w in enumerate(t):
                split[f"{prefix}.{e}.gate_proj.weight"], split[f"{prefix}.{e}.up_proj.weight"] = w.chunk(2)
        elif name.endswith("experts.down_proj"):
            split.update({f"{prefix}.{e}.down_proj.weight": w for e, w in enumerate(t)})
        else:
            split[name] = t
    save_file({n: t.contiguous() for n, t in split.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    model = load_model(folder, dtype=torch.float32)
    patch_model(model, method="BF16", weight_path=folder)
    assert torch.equal(logits(model), logits(full_model(folder, "BF16")))


def test_the_experts_bytes_are_never_read(tmp_path):
    """A model whose experts are 384 MiB of its ~391: loading it without them raises the process's
    peak memory over its resident set before by about what loading it whole does less the experts
    (measured 109 against 941 MiB)."""
    config = transformers.Qwen3MoeConfig(hidden_size=512, moe_intermediate_size=512, num_experts=64,
                                         num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=128, intermediate_size=256, vocab_size=256)
    folder = save(tmp_path, config)
    expert_mib = 4 * 64 * 3 * 512 * 512 * 2 / 2**20

    def grown_mib(load: str) -> float:
        # The peak resident set after loading (VmHWM) over the resident set before it (VmRSS).
        script = (f"import torch, transformers\nfrom kt.integrations.transformers import load_model\n"
                  f"def kib(key): return int(open('/proc/self/status').read().split(key + ':')[1].split()[0])\n"
                  f"transformers.AutoConfig.from_pretrained({str(folder)!r})\n"
                  f"before = kib('VmRSS')\n"
                  f"model = {load}({str(folder)!r}, dtype=torch.bfloat16)\n"
                  f"print(kib('VmHWM') - before)")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1]) / 1024

    without, whole = grown_mib("load_model"), grown_mib("transformers.AutoModelForCausalLM.from_pretrained")
    print(f"peak memory grew {without:.0f} MiB without the experts, {whole:.0f} MiB loading the whole model")
    assert without < whole - 0.75 * expert_mib, (without, whole)


@pytest.fixture(scope="module")
def fp8_folder(tmp_path_factory):
    """A DeepSeek-V3-style FP8 checkpoint (128x128 block scales) of a tiny Qwen3-MoE."""
    from kt.testing.checkpoints import experts_to_fp8

    folder = save(tmp_path_factory.mktemp("fp8"), CONFIGS["qwen3_moe"]())
    experts_to_fp8(folder)
    return folder


def test_fp8_checkpoint_with_gpu_resident_experts(fp8_folder):
    """FP8 experts served as stored, and the GPU-resident ones (here on the CPU device) read from
    the checkpoint and dequantized, against the whole model as transformers loads it (it dequantizes
    FP8 on a CPU): measured 3.7e-7 of the largest logit."""
    want = logits(transformers.AutoModelForCausalLM.from_pretrained(fp8_folder, dtype=torch.float32))
    model = load_model(fp8_folder, dtype=torch.float32)
    patch = patch_model(model, method="FP8", weight_path=fp8_folder, num_gpu_experts=2)
    assert all(sum(mask) == 2 for mask in patch.gpu_masks.values())
    got = logits(model)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5


def test_lora_training_over_the_unloaded_experts(fp8_folder):
    model = load_model(fp8_folder, dtype=torch.float32)
    patch = patch_model(model, mode="train", method="FP8", weight_path=fp8_folder, lora_rank=4, lora_alpha=8)
    params = patch.adapter_parameters()
    opt = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    for _ in range(6):
        loss = model.train()(IDS, labels=IDS).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses


def test_refusals_and_the_class_is_restored(tmp_path, fp8_folder):
    folder = save(tmp_path / "bf16", CONFIGS["qwen3_moe"]())
    with pytest.raises(KTError, match="loaded without its experts.*weight_path"):
        patch_model(load_model(folder))
    # Resident experts come from a BF16/FP8 checkpoint; a converted folder holds only kt's codes.
    from kt.weights import convert

    converted = convert(folder, tmp_path / "int8", method="INT8")
    with pytest.raises(KTError, match="GPU-resident experts.*BF16 or FP8 checkpoint"):
        patch_model(load_model(folder), method="INT8", weight_path=converted, num_gpu_experts=2)
    # Outside load_model the experts classes build their parameters again.
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert not any(experts_unloaded(m) for m in model.modules())
    assert model.model.layers[0].mlp.experts.gate_up_proj.shape == (8, 128, 128)


def test_kt_run_serves_a_folder_loaded_without_its_experts(tmp_path, monkeypatch):
    """kt run on a model folder: transformers loads the non-expert weights only, kt reads the experts
    from the folder; the served model generates what the whole model, patched, generates."""
    from kt.integrations.transformers.preset import ensure_preset
    from kt.serve import Engine, ServeSettings

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = ensure_preset()   # a bf16 Qwen3-MoE folder with a tokenizer
    logs = []
    settings = ServeSettings(model=str(folder), port=0).resolved()
    assert dict(settings.describe())["experts"] == "BF16 read from the model's files (transformers loads the rest of " \
                                                   "the model only)"   # the banner and --dry-run
    engine = Engine.load(settings, log=logs.append)
    try:
        assert f"read its experts from {folder} into kt" in logs[-1], logs
        assert sum(experts_unloaded(m) for m in engine.model.modules()) == 0   # replaced by kt's modules
        ids = torch.tensor([engine.text_prompt("The capital of France is")])
        greedy = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
        with torch.no_grad():
            got = engine.model.generate(ids, **greedy)
            whole = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype="auto").eval()
            patch_model(whole)
            assert torch.equal(got, whole.generate(ids, **greedy))
    finally:
        engine.close()


def test_qwen3_5_moe_multimodal_checkpoint(tmp_path):
    """Qwen3.5-MoE's own checkpoints are its multimodal model (model_type qwen3_5_moe, the text model
    under text_config, experts under model.language_model.layers, one tensor per expert), which
    AutoModelForCausalLM loads as the text model alone (qwen3_5_moe_text): patched, and loaded
    without its experts read from that folder, the logits of torch's (measured 3.2e-6)."""
    common = {k: v for k, v in FAMILY_CONFIGS["qwen3_moe"]().to_dict().items()
              if k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size", "initializer_range",
                       "pad_token_id", "bos_token_id", "eos_token_id")}
    text = dict(common, head_dim=16, num_hidden_layers=4, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                num_experts=8, num_experts_per_tok=2)
    config = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=dict(depth=1, hidden_size=32, num_heads=2,
                                                                                  intermediate_size=64, out_hidden_size=64))
    torch.manual_seed(0)
    transformers.Qwen3_5MoeForConditionalGeneration(config).to(torch.bfloat16).save_pretrained(tmp_path)
    whole = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert whole.config.model_type == "qwen3_5_moe_text"
    want = logits(whole)
    patch_model(whole, method="BF16")
    got = logits(whole)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5
    model = load_model(tmp_path, dtype=torch.float32)
    assert sum(experts_unloaded(m) for m in model.modules()) == 4
    patch_model(model, method="BF16", weight_path=tmp_path)
    assert torch.equal(logits(model), got)
