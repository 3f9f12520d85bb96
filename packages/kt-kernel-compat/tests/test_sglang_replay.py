"""SGLang's kt integration (kvcache-ai's fork, kt_ep_wrapper.py and cuda_graph_runner.py), replayed
call by call against `kt_kernel` as kt serves it, on tiny models this test writes: class-level
capture sizes before any layer, masks from generate_gpu_experts_masks, one wrapper per MoE layer
built with the fork's keyword arguments, load_weights with a permuted physical-to-logical map,
submit_forward / sync_forward per layer with deferred experts, a run-time mask update, and a
batch over the chunk size. Outputs (bf16, as the model's hidden states) against a float64
reference of the stored weights: ||out - ref|| / ||ref|| <= 1e-2 per layer and step (bf16's own
rounding of the output is ~1e-3 of that); for GGUF's LLAMAFILE the reference carries the activation
blocks llama.cpp (and kt by default) quantizes the products' inputs to. (The CUDA stream argument is the fork's; on the CPU it
is not used.)"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import kt_kernel  # noqa: E402
from kt.testing.checkpoints import write_checkpoint  # noqa: E402
from kt.weights import Checkpoint  # noqa: E402
from kt.weights.conversion import convert  # noqa: E402
from kt_core.testing import quantize as Q  # noqa: E402
from kt_core.testing.reference import moe_reference  # noqa: E402
from kt_kernel import KTMoEWrapper, generate_gpu_experts_masks  # noqa: E402

H, I, E, TOP_K, CHUNK = 256, 256, 8, 2, 32
TOL = 1e-2


def model(tmp_path, method):
    """(weight_path, {layer: float64 (gate, up, down) the kernels compute with}, MoE layers)."""
    if method == "LLAMAFILE":
        pytest.importorskip("gguf")
        from kt.testing.gguf_files import write_moe_gguf
        path = tmp_path / "model.gguf"
        truth = write_moe_gguf(path, hidden=H, intermediate=I, experts=E, top_k=TOP_K, layers=2,
                               types=("Q8_0", "Q8_0", "Q8_0"))
        return path, {layer: tuple(np.asarray(m, np.float64) for m in w) for layer, w in truth.items()}, [0, 1]
    model_type, quant = {"FP8": ("deepseek_v3", "fp8"), "RAWINT4": ("kimi_k2", "rawint4")}.get(method, ("qwen3_moe", None))
    folder = tmp_path / "hf"
    truth = write_checkpoint(folder, model_type, hidden=H, intermediate=I, experts=E, top_k=TOP_K, layers=3,
                             quant=quant)
    layers = list(Checkpoint(folder).spec.moe_layers)
    if method in ("AMXINT8", "AMXINT4"):
        fmt = method[3:]
        out = convert(folder, tmp_path / "converted", method=fmt)
        truth = {layer: Q.dequantized_weights(fmt, *(m.astype(np.float32) for m in w), group_size=128)
                 for layer, w in truth.items()}
        return out, truth, layers
    return folder, truth, layers


@pytest.mark.parametrize("method", ["BF16", "AMXINT8", "AMXINT4", "FP8", "RAWINT4", "LLAMAFILE"])
def test_sglang_call_sequence(tmp_path, method):
    weight_path, truth, layers = model(tmp_path, method)
    # cuda_graph_runner: token counts of the captured batch sizes, on the class, before any layer.
    KTMoEWrapper.set_capture_batch_sizes([1, 2, 4, 8])
    # kt_ep_wrapper._init_kt_gpu_experts_masks ("frequency"): the hottest (layer, expert) pairs.
    rng = np.random.default_rng(0)
    freq = torch.from_numpy(rng.random((max(layers) + 1, E)))
    masks = generate_gpu_experts_masks(freq, 2 * len(layers))
    assert masks.dtype == torch.bool and int(masks.sum()) == 2 * len(layers)
    g = torch.Generator().manual_seed(3)
    p2l = torch.randperm(E, generator=g).to(torch.int64)
    wrappers, stored = {}, {}
    for layer in layers:
        # kt_ep_wrapper.create_weights: every argument by keyword; the last layer defers nothing.
        wrappers[layer] = KTMoEWrapper(
            layer_idx=layer, num_experts=E, num_experts_per_tok=TOP_K, hidden_size=H, moe_intermediate_size=I,
            gpu_experts_mask=masks[layer].clone(), cpuinfer_threads=2, threadpool_count=1, numa_nodes=None,
            weight_path=str(weight_path), chunked_prefill_size=CHUNK, swiglu_limit=0.0, swiglu_alpha=0.0,
            method=method, max_deferred_experts_per_token=0 if layer == layers[-1] else 1)
        # process_weights_after_loading: physical slot p holds logical expert p2l[p].
        wrappers[layer].load_weights(p2l)
        stored[layer] = tuple(m[p2l.numpy()] for m in truth[layer])

    acts = None
    if method == "LLAMAFILE":
        from kt_core.testing.ggml_blocks import llama_activations
        acts = llama_activations(("Q8_0",) * 3)

    def reference(layer, x, ids, w, mask):
        return moe_reference(x.double().numpy(), *stored[layer], ids.numpy(), w.double().numpy(), mask.numpy(),
                             activations=acts)

    for step, tokens in enumerate((0, 1, 3, 8, CHUNK)):
        if step == 3:   # --kt-enable-dynamic-expert-update: wrapper.gpu_experts_mask.copy_(new)
            for layer in layers:
                wrappers[layer].gpu_experts_mask.copy_(torch.roll(masks[layer], 3))
        carry = None
        for layer in layers:
            x = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
            ids = torch.argsort(torch.rand(tokens, E, generator=g), dim=1)[:, :TOP_K]
            w = torch.softmax(torch.randn(tokens, TOP_K, generator=g), dim=-1)
            kt = wrappers[layer]
            mask = kt.gpu_experts_mask.clone()
            kt.submit_forward(x, ids, w, 0)
            out = kt.sync_forward(x, 0)
            assert out.shape == (tokens, H) and out.dtype == torch.bfloat16
            immediate, deferred = ids, None
            if kt.max_deferred_experts_per_token:
                immediate, deferred = kt.select_deferred_experts(ids, w, TOP_K - kt.max_deferred_experts_per_token)
            want = reference(layer, x, immediate, w, mask)
            if carry is not None:
                want = want + carry
            carry = None if deferred is None else reference(layer, x, deferred, w, mask)
            if tokens:
                err = np.linalg.norm(out.double().numpy() - want) / np.linalg.norm(want)
                assert err <= TOL, f"{method} layer {layer}, {tokens} tokens: error {err:.2e}"
    # The fork splits prefill into chunks of chunked_prefill_size; one over it is refused by name.
    kt = wrappers[layers[-1]]
    x = torch.randn(CHUNK + 1, H).to(torch.bfloat16)
    ids = torch.zeros(CHUNK + 1, TOP_K, dtype=torch.int64)
    with pytest.raises(ValueError, match="chunked_prefill_size"):
        kt.submit_forward(x, ids, torch.ones(CHUNK + 1, TOP_K), 0)


def test_the_import_name_is_kts():
    assert kt_kernel.__kt_kernel_api__ == "0.7.2" and "+kt" in kt_kernel.__version__
    assert kt_kernel.KTMoEWrapper.get_capture_batch_sizes is not None


def test_importing_kt_kernel_leaves_the_sft_wrapper_unloaded():
    """`import kt_kernel` stays torch-free (the packaging session installs it without torch): the SFT
    class is resolved on first use, as kt-kernel resolves it."""
    import subprocess
    import sys

    code = "import sys, kt_kernel; print('kt_core.sft' in sys.modules, kt_kernel.AMXSFTMoEWrapper.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "AMXSFTMoEWrapper"]
