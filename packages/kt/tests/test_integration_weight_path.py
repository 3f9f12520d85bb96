"""patch_model(weight_path=...): kt's experts read from a `kt convert` folder or a Hugging Face
checkpoint instead of the model's own tensors.

A converted folder holds the codes kt's own quantizers produce from the same bf16 weights, so a
model patched from it must give exactly the logits of the same model quantized at patch time. The
model is loaded in f32 from bf16 files (the preset's dtype), so its in-memory expert weights are
the checkpoint's values exactly and both paths quantize the same numbers.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the transformers integration needs torch")
transformers = pytest.importorskip("transformers", reason="the transformers integration needs transformers")

from kt.integrations.transformers import KTExperts, patch_model  # noqa: E402
from kt.integrations.transformers.preset import CONFIG  # noqa: E402
from kt.testing.checkpoints import write_checkpoint  # noqa: E402
from kt.weights import convert  # noqa: E402
from kt_core import WeightsError  # noqa: E402

IDS = torch.tensor([[1] + list(range(10, 41)), [1] + list(range(60, 91))])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A Qwen3-MoE shaped like the preset, seeded, bf16, saved with save_pretrained (sharded)."""
    cfg = transformers.Qwen3MoeConfig(**{**CONFIG, "num_hidden_layers": 2}, vocab_size=104)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    folder = tmp_path_factory.mktemp("model")
    model.save_pretrained(folder, max_shard_size="2MB")
    return folder


def load(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("method, settings", [("INT8", {}), ("INT4", {"group_size": 32, "zero_point": True})])
def test_converted_folder_gives_the_logits_of_quantizing_at_patch_time(model_dir, tmp_path, method, settings):
    out = convert(model_dir, tmp_path / "converted", method=method, **settings)
    own = load(model_dir)
    patch_model(own, method=method, **settings)
    from_folder = load(model_dir)
    # group_size / zero_point are not passed: the converted folder's own settings are used.
    patch = patch_model(from_folder, method=method, weight_path=out)
    assert torch.equal(logits(from_folder), logits(own))
    # The model's expert tensors are still freed: 2 layers x 16 experts x 3 x 128 x 256 f32.
    assert patch.freed_bytes == 2 * 16 * 3 * 128 * 256 * 4
    assert all(m.moe.method == method for m in patch.layers.values())


def test_converted_folder_of_another_method_is_refused(model_dir, tmp_path):
    out = convert(model_dir, tmp_path / "converted", method="INT8")
    with pytest.raises(WeightsError, match="holds INT8 codes.*asks for INT4"):
        patch_model(load(model_dir), method="INT4", weight_path=out)


def tiny_qwen3(truth):
    cfg = transformers.Qwen3MoeConfig(hidden_size=128, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      intermediate_size=256, vocab_size=64, norm_topk_prob=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for layer, block in enumerate(model.model.layers):
            gate, up, down = truth[layer]
            block.mlp.experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([gate, up], axis=1)))
            block.mlp.experts.down_proj.copy_(torch.from_numpy(down))
    return model


# kt's FP8 and RAWINT4 kernels against torch running the weights the checkpoint's codes stand
# for: the difference is kt's activation rounding (bf16 for FP8, int8 for RAWINT4).
@pytest.mark.parametrize("quant, method, tolerance", [("fp8", "FP8", 1e-4), ("rawint4", "RAWINT4", 2e-3),
                                                      ("gptq", "GPTQ_INT4", 2e-3), ("nvfp4", "NVFP4", 2e-3),
                                                      ("mxfp8", "MXFP8", 1e-4)])
def test_checkpoint_experts_load_as_stored(tmp_path, quant, method, tolerance):
    truth = write_checkpoint(tmp_path, "qwen3_moe", hidden=128, intermediate=64, experts=8, top_k=2, layers=3,
                             quant=quant)
    model = tiny_qwen3(truth)
    ids = IDS[:, :12] % 64
    with torch.no_grad():
        ref = model(ids).logits
        patch_model(model, method=method, weight_path=tmp_path)
        got = model(ids).logits
    assert all(isinstance(b.mlp.experts, KTExperts) for b in model.model.layers)
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert err < tolerance, f"{method}: rel. max error {err:.2e}"


@pytest.mark.parametrize("types", [("Q8_0", "Q8_0", "Q8_0"), ("Q4_0", "Q4_0", "Q8_0")])
def test_gguf_experts_load_as_stored(tmp_path, types):
    # LLAMAFILE: kt reads the ggml blocks; torch runs the weights they dequantize to. With two
    # activation passes (fast_activations=False) measured 1.3e-4 / 1.5e-4 (kt's int8 activation
    # rounding); 2e-3 as for RAWINT4. The default carries llama.cpp's Q8_0 activation blocks: on
    # this tiny random model 0.32 / 0.38 of the largest logit against torch (llama.cpp's numerics,
    # amplified over three layers), and the reference backend's patched model, whose one-pass
    # activations are tested against a model of ggml's quantizer, agrees to 3.4e-7 / 3.6e-7.
    from kt.testing.gguf_files import write_moe_gguf

    path = tmp_path / "tiny.gguf"
    truth = write_moe_gguf(path, hidden=128, intermediate=64, experts=8, top_k=2, layers=3, types=types)
    ids = IDS[:, :12] % 64
    logits = {}
    for name, kw in (("torch", None), ("precise", {"fast_activations": False}), ("default", {}),
                     ("reference", {"backend": "reference"})):
        model = tiny_qwen3(truth)
        with torch.no_grad():
            if kw is not None:
                patch_model(model, method="LLAMAFILE", weight_path=path, **kw)
                assert all(isinstance(b.mlp.experts, KTExperts) for b in model.model.layers)
                assert all(b.mlp.experts.moe.fast_activations == (name != "precise") for b in model.model.layers)
            logits[name] = model(ids).logits

    def err(a, b):
        return ((logits[a] - logits[b]).abs().max() / logits["torch"].abs().max()).item()

    assert err("precise", "torch") < 2e-3, f"LLAMAFILE {types}: rel. max error {err('precise', 'torch'):.2e}"
    assert err("default", "reference") < 1e-4, f"LLAMAFILE {types}: {err('default', 'reference'):.2e}"


def test_gpt_oss_served_from_its_gguf_file(tmp_path):
    """GPT-OSS with its experts read from a GGUF file as llama.cpp's converter writes one: gate and up
    apart (GPT-OSS interleaves them), MXFP4 blocks, F32 biases. Torch runs the weights those blocks
    dequantize to (gguf-py) with the same biases; kt reads the file (method LLAMAFILE: MXFP4's
    kernels, the biases and the clamped SwiGLU from the file's architecture) — measured 6.5e-5 of
    the largest logit (two int8 activation passes)."""
    gguf = pytest.importorskip("gguf")
    from test_integration_transformers import tiny_gpt_oss

    model = tiny_gpt_oss()
    cfg = model.config
    E, H, I = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    w = gguf.GGUFWriter(str(tmp_path / "oss.gguf"), "gpt-oss")
    for key, value in (("add_block_count", cfg.num_hidden_layers), ("add_embedding_length", H),
                       ("add_expert_feed_forward_length", I), ("add_expert_count", E),
                       ("add_expert_used_count", cfg.num_experts_per_tok)):
        getattr(w, key)(value)
    mxfp4 = gguf.GGMLQuantizationType.MXFP4
    with torch.no_grad():
        for L, layer in enumerate(model.model.layers):
            ex = layer.mlp.experts   # gate_up_proj [E, H, 2I] (gate / up interleaved), down_proj [E, I, H]
            mats = {"gate": ex.gate_up_proj[:, :, 0::2].transpose(1, 2), "up": ex.gate_up_proj[:, :, 1::2].transpose(1, 2),
                    "down": ex.down_proj.transpose(1, 2)}   # [E, N, K] each
            dense = {}
            for proj, m in mats.items():
                blocks = gguf.quants.quantize(np.ascontiguousarray(m.float().numpy()), mxfp4)
                w.add_tensor(f"blk.{L}.ffn_{proj}_exps.weight", blocks, raw_dtype=mxfp4)
                dense[proj] = torch.from_numpy(gguf.quants.dequantize(blocks, mxfp4)).float()
            biases = {"gate": ex.gate_up_proj_bias[:, 0::2], "up": ex.gate_up_proj_bias[:, 1::2], "down": ex.down_proj_bias}
            for proj, b in biases.items():
                w.add_tensor(f"blk.{L}.ffn_{proj}_exps.bias", np.ascontiguousarray(b.float().numpy()))
            # torch's model now holds exactly what the file says
            ex.gate_up_proj[:, :, 0::2] = dense["gate"].transpose(1, 2)
            ex.gate_up_proj[:, :, 1::2] = dense["up"].transpose(1, 2)
            ex.down_proj.copy_(dense["down"].transpose(1, 2))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ids = IDS[:, :12] % 128
    with torch.no_grad():
        want = model(ids).logits
        patch = patch_model(model, method="LLAMAFILE", weight_path=tmp_path / "oss.gguf")
        assert all(m.moe.kernel_method == "MXFP4" and m.moe.expert_bias for m in patch.layers.values())
        got = model(ids).logits
    assert ((got - want).abs().max() / want.abs().max()).item() < 2e-3


def test_gguf_needs_the_llamafile_method(tmp_path):
    from kt.testing.gguf_files import write_moe_gguf

    path = tmp_path / "tiny.gguf"
    truth = write_moe_gguf(path, hidden=128, intermediate=64, experts=8, top_k=2, layers=3, types=("Q8_0",) * 3)
    with pytest.raises(WeightsError, match="is a GGUF model; its experts load with method LLAMAFILE"):
        patch_model(tiny_qwen3(truth), method="INT8", weight_path=path)
