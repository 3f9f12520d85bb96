"""Loading experts from Hugging Face checkpoints of every registered family and format:
what the files hold reaches the kernels unchanged (bit-identical to loading the same weights
from tensors), routing through physical_to_logical_map, and a clear error for each kind of
bad input."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from kt.models import FAMILIES, family_for, spec_from_config  # noqa: E402
from kt.testing.checkpoints import make_config, write_checkpoint  # noqa: E402
from kt.weights import Checkpoint, load_layer  # noqa: E402
from kt_core import KTError, KTMoEWrapper, MoE, WeightsError  # noqa: E402
from kt_core.testing import quantize as Q  # noqa: E402
from kt_core.testing.reference import moe_reference, relative_error  # noqa: E402

H, I, E, TOP_K = 128, 64, 8, 2
RUNNABLE = [f.model_types[0] for f in FAMILIES if f.activation == "silu"] + ["kimi_k2", "minimax_m2", "qwen2_moe"]


def wrapper(path, layer, method="BF16", **kw):
    return KTMoEWrapper(layer_idx=layer, num_experts=kw.pop("num_experts", E), num_experts_per_tok=TOP_K, hidden_size=H,
                        moe_intermediate_size=I, weight_path=str(path), chunked_prefill_size=16, method=method,
                        backend=kw.pop("backend", "reference"), **kw)


def routing(tokens=6, experts=E, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, H, generator=g)
    ids = torch.stack([torch.randperm(experts, generator=g)[:TOP_K] for _ in range(tokens)])
    return x, ids, torch.rand(tokens, TOP_K, generator=g)


def reference(truth, x, ids, w, mask=None):
    return moe_reference(x.double().numpy(), *truth, ids.numpy(), w.double().numpy(), mask)


@pytest.mark.parametrize("model_type", RUNNABLE)
def test_every_family_loads_its_bf16_experts(tmp_path, model_type):
    truth = write_checkpoint(tmp_path, model_type, hidden=H, intermediate=I, experts=E)
    layer = max(truth)
    kt = wrapper(tmp_path, layer)
    kt.load_weights()
    x, ids, w = routing()
    out = kt.forward(x, ids, w).double().numpy()
    # The reference backend with f32 activations over bf16 weights: only accumulation order differs.
    assert relative_error(out, reference(truth[layer], x, ids, w)) < 1e-5


@pytest.mark.parametrize(("model_type", "quant", "method"), [("deepseek_v3", "fp8", "FP8"),
                                                             ("minimax_m2", "fp8", "FP8"),
                                                             ("kimi_k2", "rawint4", "RAWINT4"),
                                                             ("qwen3_moe", "gptq", "GPTQ_INT4"),
                                                             ("qwen3_moe", "nvfp4", "NVFP4"),
                                                             ("minimax_m2", "mxfp8", "MXFP8")])
def test_quantized_checkpoints_load_as_stored(tmp_path, model_type, quant, method):
    truth = write_checkpoint(tmp_path, model_type, hidden=H, intermediate=I, experts=E, quant=quant)
    spec = Checkpoint(tmp_path).spec
    assert spec.quantization.method == method
    layer = spec.moe_layers[0]
    kt = wrapper(tmp_path, layer, method)
    kt.load_weights()
    x, ids, w = routing()
    assert relative_error(kt.forward(x, ids, w).double().numpy(), reference(truth[layer], x, ids, w)) < 1e-5


@pytest.mark.parametrize("backend", ["reference", "avx"])
@pytest.mark.parametrize(("method", "quant"), [("INT8", None), ("INT4", None), ("INT4", "fp8"), ("BF16", "fp8")])
def test_quantize_at_load_matches_loading_the_same_floats(tmp_path, backend, method, quant):
    from kt_core.backends.selection import selector

    if not any(c.backend == backend and c.runnable for c in selector().candidates):
        pytest.skip(f"backend {backend} is not installed or cannot run here")
    truth = write_checkpoint(tmp_path, "qwen3_moe", hidden=H, intermediate=I, experts=E, quant=quant)
    layer = min(truth)
    opts = {"group_size": 32} if method == "INT4" else {}
    with pytest.raises(KTError, match=f"needs a converted folder .*kt convert.*--method {method}.*cpu_save=True"):
        wrapper(tmp_path, layer, method, backend=backend, **opts).load_weights()
    kt = wrapper(tmp_path, layer, method, backend=backend, cpu_save=True, **opts)
    kt.load_weights()
    same = wrapper(tmp_path, layer, method, backend=backend, **opts)
    same.load_weights_from_tensors(*(torch.from_numpy(m.astype(np.float32)) for m in truth[layer]))
    x, ids, w = routing()
    assert torch.equal(kt.forward(x, ids, w), same.forward(x, ids, w))


def test_physical_to_logical_map_and_gpu_slots(tmp_path):
    truth = write_checkpoint(tmp_path, "deepseek_v3", hidden=H, intermediate=I, experts=E)
    layer = min(truth)
    physical = 10                                   # 8 logical experts + 2 redundant copies (EPLB)
    p2l = torch.tensor([3, 1, 4, 1, 5, 0, 2, 6, 7, 3])
    mask = [p in (0, 9) for p in range(physical)]   # slots 0 and 9 are GPU-resident
    kt = wrapper(tmp_path, layer, num_experts=physical, gpu_experts_mask=torch.tensor(mask))
    kt.load_weights(p2l)
    x, ids, w = routing(experts=physical)
    expect = reference(tuple(m[p2l.numpy()] for m in truth[layer]), x, ids, w, np.array(mask))
    assert relative_error(kt.forward(x, ids, w).double().numpy(), expect) < 1e-5


def test_fused_layouts_are_split_correctly(tmp_path):
    # qwen3_vl_moe stores [E, H, 2I] halves; GPT-OSS interleaves gate/up columns, and its experts
    # (biases, clamped SwiGLU) need a layer made for them: KTMoEWrapper makes it so from the folder
    # (kt-kernel's callers say nothing of biases), a caller's other clamp is refused naming the folder's.
    truth = write_checkpoint(tmp_path / "vl", "qwen3_vl_moe", hidden=H, intermediate=I, experts=E)
    kt = wrapper(tmp_path / "vl", 1)
    kt.load_weights()
    x, ids, w = routing()
    assert relative_error(kt.forward(x, ids, w).double().numpy(), reference(truth[1], x, ids, w)) < 1e-5
    from kt.weights.experts import checkpoint_experts

    oss = write_checkpoint(tmp_path / "oss", "gpt_oss", hidden=H, intermediate=I, experts=E)
    gate, up, down, _, _ = checkpoint_experts(Checkpoint(tmp_path / "oss"), 0, 5)
    for got, want in zip((gate, up, down), oss[0]):
        assert np.array_equal(got.double().numpy(), want[5])
    kt = wrapper(tmp_path / "oss", 0)
    assert kt._moe.expert_bias and (kt.swiglu_limit, kt.swiglu_alpha) == (7.0, 1.702)
    kt.load_weights()
    *weights, biases = oss[0]
    want = moe_reference(x.double().numpy(), *weights, ids.numpy(), w.double().numpy(), swiglu_limit=7.0,
                         swiglu_alpha=1.702, biases=biases)
    assert relative_error(kt.forward(x, ids, w).double().numpy(), want) < 1e-5
    with pytest.raises(WeightsError, match=r"gpt_oss experts compute a clamped SwiGLU.*create layer 0 with "
                                            r"expert_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702"):
        wrapper(tmp_path / "oss", 0, swiglu_limit=5.0, swiglu_alpha=1.702).load_weights()


@pytest.mark.parametrize("quant,method,bound", [(None, "BF16", 1e-4), ("mxfp4", "MXFP4", 5e-3)])
def test_gpt_oss_checkpoint_loads_with_its_biases(tmp_path, quant, method, bound):
    """GPT-OSS's checkpoints as stored — fused bf16 [E, H, 2I], or MXFP4 *_blocks / *_scales — with
    their gate/up and down biases, into a layer made for its experts."""
    truth = write_checkpoint(tmp_path, "gpt_oss", hidden=H, intermediate=I, experts=E, quant=quant)
    layer = min(truth)
    *weights, biases = truth[layer]
    moe = MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method=method, expert_bias=True,
              swiglu_limit=7.0, swiglu_alpha=1.702)
    load_layer(moe, tmp_path, layer)
    x, ids, w = routing()
    want = moe_reference(x.numpy(), *weights, ids.numpy(), w.numpy(), swiglu_limit=7.0, swiglu_alpha=1.702,
                         biases=biases)
    assert relative_error(moe(x, ids, w).double().numpy(), want) < bound


@pytest.mark.parametrize("quant,method,backend,bound", [(None, "BF16", "reference", 1e-4), ("mxfp4", "MXFP4", "reference", 1e-4),
                                                   ("mxfp4", "MXFP4", None, 2e-3)])
def test_deepseek_v4_checkpoint_loads_with_its_clamped_silu(tmp_path, quant, method, backend, bound):
    """DeepSeek-V4: experts per expert as w1 / w3 / w2 under `ffn`, the clamped SiLU with the config's
    swiglu_limit (0.5 here, so it clamps). As transformers saves them (bf16, `model.layers...`) and as
    DeepSeek ships them (`layers...` without `model.`, int8 E2M1 pairs + UE8M0 `.scale` under an FP8
    quantization_config: kt reads MXFP4). A wrapper made without the limit gets the folder's (as
    kt-kernel's callers say nothing of it); another limit is refused naming the folder's.
    Bound: against float64 over the same stored weights — the reference backend (f32 activations), and
    the host's kernels (measured 2.2e-7, 2.2e-7 and 5.3e-4 on Zen 4's avx)."""
    truth = write_checkpoint(tmp_path, "deepseek_v4", hidden=H, intermediate=I, experts=E, quant=quant)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "swiglu_limit": 0.5}))
    ckpt = Checkpoint(tmp_path)
    assert ckpt.spec.quantization.method == method and ckpt.spec.moe_layers == (0, 1, 2)
    if quant:
        assert not any(n.startswith("model.layers") for n in ckpt.weight_map if ".experts." in n)
    kt = wrapper(tmp_path, 1, method, backend=backend)
    assert (kt.swiglu_limit, kt.swiglu_alpha) == (0.5, 0.0)
    kt.load_weights()
    x, ids, w = routing()
    want = moe_reference(x.double().numpy(), *truth[1], ids.numpy(), w.double().numpy(), swiglu_limit=0.5)
    assert relative_error(kt.forward(x, ids, w).double().numpy(), want) < bound
    unclamped = moe_reference(x.double().numpy(), *truth[1], ids.numpy(), w.double().numpy())
    assert relative_error(unclamped, want) > 0.05   # the clamp matters at this limit
    with pytest.raises(WeightsError, match=r"deepseek_v4 experts compute SiLU\(min\(g, limit\)\).*create layer 1 "
                                            r"with swiglu_limit=0.5, swiglu_alpha=0.0"):
        wrapper(tmp_path, 1, method, swiglu_limit=7.0).load_weights()
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "swiglu_limit": "ten"}))
    with pytest.raises(KTError, match="swiglu_limit should be a positive number \\(the experts' clamp\\), found 'ten'"):
        wrapper(tmp_path, 1, method, backend=backend).load_weights()
    if quant:   # UE8M0's reserved code: no finite scale, refused by name
        from safetensors.torch import load_file, save_file

        shard = next(p for p in sorted(tmp_path.glob("*.safetensors")) if "layers.1.ffn.experts.0.w1.scale" in
                     load_file(str(p)))
        tensors = load_file(str(shard))
        scale = tensors["layers.1.ffn.experts.0.w1.scale"].view(torch.uint8).clone()
        scale[0, 0] = 0xFF
        tensors["layers.1.ffn.experts.0.w1.scale"] = scale.view(torch.float8_e8m0fnu)
        save_file(tensors, str(shard), metadata={"format": "pt"})
        (tmp_path / "config.json").write_text(json.dumps({**cfg, "swiglu_limit": 0.5}))
        with pytest.raises(WeightsError, match=r"layers.1.ffn.experts.0.w1.scale holds the reserved UE8M0 code 0xff"):
            wrapper(tmp_path, 1, method, backend=backend).load_weights()


@pytest.mark.parametrize("model_type,key", [("bailing_hybrid", "expert_swiglu_limit_list"), ("step3p7", "swiglu_limits")])
def test_limit_after_silu_per_layer_from_the_folder(tmp_path, model_type, key):
    """Ling-2.5 (bailing_hybrid) and Step-3.7 (its experts stacked per projection, [E, N, K] under
    `moe`): each layer's limit after SiLU from the config. A wrapper made without one takes its
    layer's (kt-kernel's API cannot say "after"): layer 1 clamps at 0.5, layer 2 (limit 0, or null)
    is plain SiLU; another limit is refused naming the folder's."""
    truth = write_checkpoint(tmp_path, model_type, hidden=H, intermediate=I, experts=E, dense_prefix=1)
    cfg = json.loads((tmp_path / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    text.update({key: [0, 0.5, None if model_type == "step3p7" else 0], "mlp_layer_types": ["dense", "sparse", "sparse"]})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    x, ids, w = routing()
    for layer, limit in ((1, 0.5), (2, 0.0)):
        kt = wrapper(tmp_path, layer, backend=None)
        assert kt._moe.swiglu == (limit, 0.0, limit > 0, "silu")
        kt.load_weights()
        want = moe_reference(x.double().numpy(), *truth[layer], ids.numpy(), w.double().numpy(), swiglu_limit=limit,
                             limit_after_act=limit > 0)
        assert relative_error(kt.forward(x, ids, w).double().numpy(), want) < 5e-3   # avx's activations
    plain = moe_reference(x.double().numpy(), *truth[1], ids.numpy(), w.double().numpy())
    clamped = moe_reference(x.double().numpy(), *truth[1], ids.numpy(), w.double().numpy(), swiglu_limit=0.5,
                            limit_after_act=True)
    assert relative_error(plain, clamped) > 0.05   # the limit matters at 0.5
    with pytest.raises(WeightsError, match=r"create layer 1 with swiglu_limit=0.5, swiglu_alpha=0.0, "
                                            r"swiglu_limit_after_act=True"):
        wrapper(tmp_path, 1, swiglu_limit=7.0).load_weights()


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4"])
def test_gemma4_gelu_tanh_experts_from_the_folder(tmp_path, model_type):
    """Gemma 4: fused experts in transformers' own orientation ([E, 2I, H], [E, H, I]), GELU-tanh.
    A wrapper (kt-kernel's API has no word for the activation) takes it from the folder; a layer made
    with SiLU is refused naming it. With hidden == intermediate the shapes cannot tell the orientation:
    the family's decides. A dense Gemma 4 (enable_moe_block false) is refused by name."""
    truth = write_checkpoint(tmp_path, model_type, hidden=H, intermediate=I, experts=E, dense_prefix=0)
    x, ids, w = routing()
    kt = wrapper(tmp_path, 1, backend=None)
    assert kt._moe.swiglu == (0.0, 0.0, False, "gelu_tanh")
    kt.load_weights()
    want = moe_reference(x.double().numpy(), *truth[1], ids.numpy(), w.double().numpy(), gate_activation="gelu_tanh")
    assert relative_error(kt.forward(x, ids, w).double().numpy(), want) < 5e-3   # avx's activations
    assert relative_error(moe_reference(x.double().numpy(), *truth[1], ids.numpy(), w.double().numpy()), want) > 0.05
    silu = MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, backend="reference")
    with pytest.raises(WeightsError, match=r"experts compute GELU-tanh.*create layer 1 with gate_activation='gelu_tanh'"):
        load_layer(silu, tmp_path, 1)
    square = write_checkpoint(tmp_path / "square", model_type, hidden=H, intermediate=H, experts=E, dense_prefix=0)
    layer = MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=H, backend="reference",
                method="FP32", gate_activation="gelu_tanh")
    load_layer(layer, tmp_path / "square", 0)
    want = moe_reference(x.double().numpy(), *square[0], ids.numpy(), w.double().numpy(), gate_activation="gelu_tanh")
    assert relative_error(layer(x.numpy(), ids.numpy(), w.numpy()), want) < 1e-5
    cfg = json.loads((tmp_path / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    text["enable_moe_block"] = False
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KTError, match=f"this {model_type} config has no MoE layers \\(enable_moe_block is False: a dense"):
        Checkpoint(tmp_path)


def test_config_key_variants_and_moe_layer_rules():
    assert spec_from_config(make_config("minimax_m2", hidden=64, intermediate=32, experts=16, top_k=2,
                                        layers=4)).num_experts == 16      # MiniMax has no num_experts key
    cfg = make_config("qwen2_moe", hidden=64, intermediate=32, experts=8, top_k=2, layers=6)
    cfg.update(decoder_sparse_step=2, mlp_only_layers=[3])
    assert spec_from_config(cfg).moe_layers == (1, 5)                      # (L + 1) % 2 == 0, minus layer 3
    cfg = make_config("deepseek_v3", hidden=64, intermediate=32, experts=8, top_k=2, layers=5, dense_prefix=3)
    assert spec_from_config(cfg).moe_layers == (3, 4)
    # transformers 5's mlp_layer_types, where a config lists them, decides (GLM-4.7-Flash has no
    # first_k_dense_replace); ERNIE-4.5's start / end / interval.
    cfg = make_config("glm4_moe_lite", hidden=64, intermediate=32, experts=8, top_k=2, layers=4, dense_prefix=0)
    cfg["mlp_layer_types"] = ["dense", "sparse", "dense", "sparse"]
    assert spec_from_config(cfg).moe_layers == (1, 3)
    cfg["mlp_layer_types"] = ["dense", "sparse"]
    with pytest.raises(KTError, match="mlp_layer_types should list \"sparse\" or \"dense\" for each of the 4 layers"):
        spec_from_config(cfg)
    cfg = make_config("ernie4_5_moe", hidden=64, intermediate=32, experts=8, top_k=2, layers=8, dense_prefix=1)
    cfg.update(moe_layer_end_index=5, moe_layer_interval=2)
    assert spec_from_config(cfg).moe_layers == (1, 3, 5)                   # 1 <= L <= 5, (L + 1) % 2 == 0
    cfg["moe_layer_end_index"] = -1                                        # -1: to the last layer
    assert spec_from_config(cfg).moe_layers == (1, 3, 5, 7)
    # Llama 4: moe_layers, where listed, decides; else every interleave_moe_layer_step-th layer (Maverick: 2).
    cfg = make_config("llama4_text", hidden=64, intermediate=32, experts=8, top_k=1, layers=6)
    cfg["interleave_moe_layer_step"] = 2
    assert spec_from_config(cfg).moe_layers == (1, 3, 5)
    cfg["moe_layers"] = [5, 0]
    assert spec_from_config(cfg).moe_layers == (0, 5)
    cfg["moe_layers"] = [1, 6]
    with pytest.raises(KTError, match=r"moe_layers should list layer numbers below 6, found \[1, 6\]"):
        spec_from_config(cfg)
    # Step-3.7's hub configs list the MoE layers as a string; mlp_layer_types, where given, decides.
    cfg = make_config("step3p7", hidden=64, intermediate=32, experts=8, top_k=2, layers=5, dense_prefix=3)
    del cfg["text_config"]["mlp_layer_types"]
    assert spec_from_config(cfg).moe_layers == (3, 4)                      # every layer from the fourth
    cfg["text_config"]["moe_layers_enum"] = "1,2,4"
    assert spec_from_config(cfg).moe_layers == (1, 2, 4)
    cfg["text_config"]["moe_layers_enum"] = "1,two"
    with pytest.raises(KTError, match="moe_layers_enum should list layer numbers below 5, found '1,two'"):
        spec_from_config(cfg)
    # Jamba: every expert_layer_period-th layer from expert_layer_offset; Flint: mlp_only_layers, else
    # its first two layers dense (transformers' default).
    cfg = make_config("jamba", hidden=64, intermediate=32, experts=8, top_k=2, layers=8)
    cfg.update(expert_layer_period=3, expert_layer_offset=0)
    assert spec_from_config(cfg).moe_layers == (0, 3, 6)
    cfg["expert_layer_offset"] = 2
    assert spec_from_config(cfg).moe_layers == (2, 5)
    cfg = make_config("flint", hidden=64, intermediate=32, experts=8, top_k=2, layers=4)
    assert spec_from_config(cfg).moe_layers == (2, 3)
    cfg["mlp_only_layers"] = []
    assert spec_from_config(cfg).moe_layers == (0, 1, 2, 3)
    # HunYuan gives its top-k once per layer: one value for all, or refused.
    cfg = make_config("hunyuan_v1_moe", hidden=64, intermediate=32, experts=8, top_k=2, layers=4)
    cfg["moe_topk"] = [2, 2, 2, 2]
    assert spec_from_config(cfg).top_k == 2
    cfg["moe_topk"] = [2, 4, 2, 2]
    with pytest.raises(KTError, match=r"moe_topk must be a positive integer, got \[2, 4, 2, 2\]"):
        spec_from_config(cfg)
    with pytest.raises(KTError, match="model_type 'llama' is not an MoE family kt knows; supported: .*qwen3_moe"):
        spec_from_config({"model_type": "llama"})
    with pytest.raises(KTError, match="none of num_local_experts"):
        spec_from_config({"model_type": "mixtral", "hidden_size": 8, "intermediate_size": 8, "num_experts_per_tok": 2,
                          "num_hidden_layers": 1})
    cfg = make_config("deepseek_v3", hidden=64, intermediate=32, experts=8, top_k=2, layers=2, dense_prefix=2)
    with pytest.raises(KTError, match="has no MoE layers"):
        spec_from_config(cfg)
    assert family_for("kimi_k2").name == "deepseek"


def test_bad_checkpoints_give_clear_errors(tmp_path):
    write_checkpoint(tmp_path, "qwen3_moe", hidden=H, intermediate=I, experts=E, layers=2, dense_prefix=0)
    shards = sorted(tmp_path.glob("*.safetensors"))
    with pytest.raises(WeightsError, match="layer 7 of this qwen3_moe model is not an MoE layer"):
        wrapper(tmp_path, 7).load_weights()
    with pytest.raises(WeightsError, match="hidden=128, intermediate=64; the layer was created with hidden_size=64"):
        KTMoEWrapper(0, E, TOP_K, 64, I, weight_path=str(tmp_path), method="BF16", backend="reference").load_weights()

    # A truncated shard: clear error at first read, never a crash.
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) // 2])
    with pytest.raises(KTError, match="not a readable safetensors file|truncated or corrupted"):
        wrapper(tmp_path, 1).load_weights()
    shards[1].write_bytes(data)

    # A missing shard.
    shards[0].rename(tmp_path / "elsewhere")
    with pytest.raises(KTError, match=f"missing shard\\(s\\) {shards[0].name} listed in model.safetensors.index.json"):
        wrapper(tmp_path, 0).load_weights()
    (tmp_path / "elsewhere").rename(shards[0])

    # A tensor of the wrong shape, then of the wrong dtype.
    from safetensors.torch import load_file, save_file

    name = "model.layers.1.mlp.experts.3.up_proj.weight"
    shard = next(s for s in shards if name in load_file(str(s)))
    tensors = load_file(str(shard))
    original = tensors[name]
    tensors[name] = original[:, :-1].contiguous()
    save_file(tensors, str(shard))
    with pytest.raises(WeightsError, match=rf"{name} should be bfloat16 or float16 or float32 \[64, 128\].*found "
                                           r"bfloat16 \[64, 127\]"):
        wrapper(tmp_path, 1).load_weights()
    tensors[name] = original.to(torch.int8)
    save_file(tensors, str(shard))
    with pytest.raises(WeightsError, match=rf"{name} should be .*found int8 \[64, 128\]"):
        wrapper(tmp_path, 1).load_weights()

    # A missing tensor, and no config at all.
    del tensors[name]
    save_file(tensors, str(shard))
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    del index["weight_map"][name]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match=f"tensor {name} is not in the checkpoint"):
        wrapper(tmp_path, 1).load_weights()
    (tmp_path / "config.json").unlink()
    with pytest.raises(KTError, match="not a Hugging Face model folder: no config.json"):
        wrapper(tmp_path, 1).load_weights()


def test_a_failed_load_leaves_no_expert_half_loaded(tmp_path):
    write_checkpoint(tmp_path, "qwen3_moe", hidden=H, intermediate=I, experts=E, layers=1, dense_prefix=0)
    from safetensors.torch import load_file, save_file

    name = "model.layers.0.mlp.experts.6.down_proj.weight"
    shard = next(s for s in tmp_path.glob("*.safetensors") if name in load_file(str(s)))
    tensors = load_file(str(shard))
    tensors[name] = tensors[name].clone()
    tensors[name][0, 0] = float("nan")
    save_file(tensors, str(shard))
    moe = MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method="BF16", backend="reference")
    with pytest.raises(ValueError, match="expert 6 down hold NaN or Inf"):
        load_layer(moe, tmp_path, 0)
    assert not any(moe._layer.expert_loaded(e) for e in range(E))


def test_quant_helpers_round_trip():
    # FP8 -> float for quantizing (convert, cpu_save): the exact product, rounded once to f32.
    from kt.weights.experts import dequantize_fp8

    w = np.random.default_rng(0).standard_normal((130, 200)).astype(np.float32)
    codes, scale_inv = Q.quantize_fp8_block(w)
    got = dequantize_fp8(torch.from_numpy(codes).view(torch.float8_e4m3fn), torch.from_numpy(scale_inv))
    assert got.dtype == torch.float32
    assert np.array_equal(got.numpy(), Q.dequantize_fp8_block(codes, scale_inv).astype(np.float32))


def test_readahead_accepts_every_weight_form(tmp_path):
    # Best effort by design: file-backed views, NumPy arrays, None parts and empty tensors.
    from kt.weights.readahead import readahead

    write_checkpoint(tmp_path, "qwen3_moe", hidden=H, intermediate=I, experts=E, layers=1, dense_prefix=0)
    ckpt = Checkpoint(tmp_path)
    view = ckpt.tensor("model.layers.0.mlp.experts.0.gate_proj.weight")
    readahead({0: (view, np.zeros((4, 4), np.float32), None, (torch.empty(0), None), None)})


def test_folders_without_an_index(tmp_path):
    # save_pretrained writes small models as one model.safetensors and no index.
    truth = write_checkpoint(tmp_path, "qwen3_moe", hidden=H, intermediate=I, experts=E, layers=1, dense_prefix=0,
                             shards=1)
    (tmp_path / "model.safetensors.index.json").unlink()
    (tmp_path / "model-00001-of-00001.safetensors").rename(tmp_path / "model.safetensors")
    kt = wrapper(tmp_path, 0)
    kt.load_weights()
    x, ids, w = routing()
    assert relative_error(kt.forward(x, ids, w).double().numpy(), reference(truth[0], x, ids, w)) < 1e-5
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(KTError, match="has no \\*.safetensors files"):
        Checkpoint(tmp_path)


@pytest.mark.parametrize(("settings", "message"), [
    ({"bits": 8}, "GPTQ checkpoint with bits=8, sym=True, desc_act=False; kt reads symmetric 4-bit GPTQ"),
    ({"sym": False}, "bits=4, sym=False"),
    ({"desc_act": True}, "desc_act=True; kt reads .* without act-order"),
    ({"group_size": -1}, "GPTQ group_size -1: kt's INT4 kernels take groups of 32, 64 or 128"),
])
def test_gptq_settings_kt_cannot_read_are_named(settings, message):
    cfg = make_config("qwen3_moe", hidden=H, intermediate=I, experts=E, top_k=TOP_K, layers=2, quant="gptq")
    cfg["quantization_config"].update(settings)
    with pytest.raises(KTError, match=message):
        spec_from_config(cfg)
