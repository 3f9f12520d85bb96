"""KTMoEWrapper: kt-kernel's API on a CPU-only torch, and its answers to bad input."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kt_core import KTError, KTMoEWrapper  # noqa: E402
from kt_core.testing.reference import moe_reference, relative_error  # noqa: E402

E, K, H, I = 8, 2, 64, 32


def make(method="BF16", **kw):
    # The reference backend: these tests check the wrapper's plumbing to 1e-5, whatever else is installed.
    args = dict(layer_idx=0, num_experts=E, num_experts_per_tok=K, hidden_size=H, moe_intermediate_size=I,
                gpu_experts_mask=None, cpuinfer_threads=None, threadpool_count=1, weight_path=None,
                chunked_prefill_size=64, method=method, backend="reference")
    args.update(kw)
    return KTMoEWrapper(**args)


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(E, I, H, generator=g) / H**0.5
    up = torch.randn(E, I, H, generator=g) / H**0.5
    down = torch.randn(E, H, I, generator=g) / I**0.5
    return gate.bfloat16(), up.bfloat16(), down.bfloat16()


def routing(tokens, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(tokens)])
    w = torch.softmax(torch.randn(tokens, K, generator=g), dim=-1)
    return ids, w


def reference(x, w, ids, tw, mask=None):
    as_np = [t.float().numpy() for t in w]
    return moe_reference(x.float().numpy(), *as_np, ids.numpy(), tw.numpy(), mask)


def test_positional_kt_kernel_signature_and_bf16_forward():
    wrapper = KTMoEWrapper(0, E, K, H, I, None, 2, 1, "/nonexistent", 64, False, None, "BF16")
    w = weights()
    wrapper.load_weights_from_tensors(*w, torch.arange(E))
    x = torch.randn(5, H).bfloat16()
    ids, tw = routing(5)
    out = wrapper.forward(x, ids, tw, None)
    assert out.dtype == torch.bfloat16 and out.shape == (5, H) and out.device == x.device
    # bf16 output rounding (half an ulp, 2^-9 relative) is the only difference from float64
    # over the bf16 weights: bound it by the largest output element.
    want = reference(x, w, ids, tw)
    bound = 2.0**-8 * np.abs(want).max() / np.sqrt(np.mean(want**2))
    assert relative_error(out.float().numpy(), want) <= bound


def test_amx_method_names_run_where_there_is_no_amx():
    wrapper = KTMoEWrapper(0, E, K, H, I, None, None, 1, None, 64, False, None, "AMXINT8")
    assert "int8" in wrapper._moe.layout_id    # AMXINT8 names the INT8 format, whatever backend serves it
    # GGUF names LLAMAFILE, whose ggml types (and so its packed size) come from the file.
    with pytest.raises(Exception, match="method LLAMAFILE reads its experts from a GGUF file: pass weight_path="):
        KTMoEWrapper(0, E, K, H, I, None, None, 1, None, 64, False, None, "GGUF")
    with pytest.raises(Exception, match="method LLAMAFILE reads its experts from a GGUF file"):
        make("GGUF")


@pytest.mark.parametrize(("hidden", "intermediate", "group"), [(2880, 64, 64), (320, 96, 32)])
def test_amxint4_takes_layers_whose_sizes_are_no_multiple_of_128(hidden, intermediate, group):
    """kt-kernel accepts GPT-OSS's hidden 2880: the group is the largest of 128/64/32 dividing both
    sizes, and repr says which."""
    wrapper = make("AMXINT4", hidden_size=hidden, moe_intermediate_size=intermediate)
    assert wrapper._moe.group_size == group and f"group_size={group}" in repr(wrapper)


def test_submit_and_sync_forward():
    wrapper = make()
    w = weights()
    wrapper.load_weights_from_tensors(*w)
    x = torch.randn(7, H, dtype=torch.float32)
    ids, tw = routing(7)
    wrapper.submit_forward(x, ids.int(), tw.half())   # int32 ids and fp16 weights are converted
    out = wrapper.sync_forward(x, None)
    assert out.dtype == torch.float32
    assert relative_error(out.numpy(), reference(x, w, ids, tw.half().float())) < 1e-5


def test_gpu_experts_mask_and_num_gpu_experts():
    w = weights()
    x = torch.randn(6, H)
    ids, tw = routing(6)
    mask = torch.tensor([e % 2 == 0 for e in range(E)])
    masked = make(gpu_experts_mask=mask)
    masked.load_weights_from_tensors(*w)
    assert relative_error(masked.forward(x, ids, tw).numpy(), reference(x, w, ids, tw, mask.numpy())) < 1e-5
    first3 = make(num_gpu_experts=3)
    first3.load_weights_from_tensors(*w)
    want = reference(x, w, ids, tw, np.arange(E) < 3)
    assert relative_error(first3.forward(x, ids, tw).numpy(), want) < 1e-5


def test_physical_to_logical_map_permutes_experts():
    w = weights()
    perm = torch.tensor([3, 1, 0, 2, 7, 6, 5, 4])
    wrapper = make()
    wrapper.load_weights_from_tensors(*w, perm)
    x = torch.randn(4, H)
    ids, tw = routing(4)
    permuted = [t[perm] for t in w]
    assert relative_error(wrapper.forward(x, ids, tw).numpy(), reference(x, permuted, ids, tw)) < 1e-5


def test_capture_sizes_are_class_level_and_buffer_cache():
    """SGLang's cuda_graph_runner calls KTMoEWrapper.set_capture_batch_sizes on the class."""
    KTMoEWrapper.set_capture_batch_sizes([4, 1, 2, 4])
    assert KTMoEWrapper.get_capture_batch_sizes() == [1, 2, 4]
    wrapper = make()
    assert wrapper.get_capture_batch_sizes() == [1, 2, 4]
    with pytest.raises(ValueError, match="capture batch sizes must be positive token counts"):
        KTMoEWrapper.set_capture_batch_sizes([0, 3])
    wrapper.clear_buffer_cache()


def test_gpu_experts_mask_copy_takes_effect_on_the_next_forward():
    """SGLang's dynamic expert update: wrapper.gpu_experts_mask.copy_(new); every expert is held
    on the CPU (as in kt-kernel), so any expert can move either way."""
    w = weights()
    x = torch.randn(6, H)
    ids, tw = routing(6)
    first = torch.tensor([e < 4 for e in range(E)])
    wrapper = make(gpu_experts_mask=first)
    assert wrapper.gpu_experts_mask.dtype == torch.bool and wrapper.num_gpu_experts == 4
    wrapper.load_weights_from_tensors(*w)
    assert relative_error(wrapper.forward(x, ids, tw).numpy(), reference(x, w, ids, tw, first.numpy())) < 1e-5
    second = torch.tensor([e % 3 == 0 for e in range(E)])
    wrapper.gpu_experts_mask.copy_(second)
    assert relative_error(wrapper.forward(x, ids, tw).numpy(), reference(x, w, ids, tw, second.numpy())) < 1e-5
    wrapper.gpu_experts_mask.fill_(False)
    wrapper.submit_forward(x, ids, tw)
    assert relative_error(wrapper.sync_forward(x).numpy(), reference(x, w, ids, tw)) < 1e-5


def test_without_cpu_copies_gpu_experts_cannot_move_here():
    w = weights()
    wrapper = make(gpu_experts_mask=torch.tensor([e < 2 for e in range(E)]), cpu_copy_of_gpu_experts=False)
    wrapper.load_weights_from_tensors(*w)
    assert wrapper._moe.packed_bytes == (E - 2) * wrapper._moe.expert_bytes
    wrapper.gpu_experts_mask[0] = False
    ids, tw = routing(2)
    with pytest.raises(ValueError, match="expert 0 cannot move to the CPU: the layer was made with it GPU-resident"):
        wrapper.forward(torch.randn(2, H), ids, tw)


def test_select_deferred_experts_protects_an_expert_for_the_whole_batch():
    from kt_core import select_deferred_experts
    ids = torch.tensor([[0, 1], [1, 2], [3, -1]])
    scores = torch.tensor([[0.9, 0.1], [0.7, 0.3], [0.6, 0.4]])
    immediate, deferred = select_deferred_experts(ids, scores, 1)
    # protected: 0 (token 0), 1 (token 1), 3 (token 2): token 0's pick of 1 stays immediate.
    assert immediate.tolist() == [[0, 1], [1, -1], [3, -1]]
    assert deferred.tolist() == [[-1, -1], [-1, 2], [-1, -1]]
    none, everything = select_deferred_experts(ids.numpy(), scores.numpy(), 0)
    assert isinstance(none, np.ndarray) and (none == -1).all() and everything.tolist() == ids.tolist()
    kept, _ = select_deferred_experts(ids, scores, 5)
    assert kept.tolist() == ids.tolist()


def hand_deferral(ids, scores, protected_k):
    """select_deferred_experts' rule, written out loop by loop (the test's own oracle)."""
    ids, scores = ids.tolist(), scores.tolist()
    protected = set()
    for row, sc in zip(ids, scores):
        order = sorted(range(len(row)), key=lambda j: -sc[j])[:protected_k]
        protected |= {row[j] for j in order if row[j] >= 0}
    immediate = [[e if e in protected else -1 for e in row] for row in ids]
    deferred = [[-1 if e in protected else e for e in row] for row in ids]
    return torch.tensor(immediate), torch.tensor(deferred)


def test_deferred_experts_land_in_the_next_layers_output():
    """Layer 0 defers one pick per token: its output holds the immediate picks, and the deferred
    ones (computed after its sync) are added into layer 1's output; the last layer defers nothing."""
    w0, w1 = weights(0), weights(5)
    layer0, layer1 = make(layer_idx=0, max_deferred_experts_per_token=1), make(layer_idx=1)
    layer0.load_weights_from_tensors(*w0)
    layer1.load_weights_from_tensors(*w1)
    for tokens in (1, 3, 8, 64):
        x0, x1 = torch.randn(tokens, H), torch.randn(tokens, H)
        ids0, tw0 = routing(tokens, seed=tokens)
        ids1, tw1 = routing(tokens, seed=tokens + 1)
        immediate, deferred = hand_deferral(ids0, tw0, K - 1)
        want0 = reference(x0, w0, immediate, tw0)
        want1 = reference(x1, w1, ids1, tw1) + reference(x0, w0, deferred, tw0)
        layer0.submit_forward(x0, ids0, tw0)
        out0 = layer0.sync_forward(x0)
        x0.fill_(7.0)   # the caller reuses its buffer: the deferred forward has its own copy
        out1 = layer1.forward(x1, ids1, tw1)
        assert relative_error(out0.numpy(), want0) < 1e-5, tokens
        assert relative_error(out1.numpy(), want1) < 1e-5, tokens


def test_a_deferred_output_nobody_collects_is_an_error():
    layer0 = make(layer_idx=0, max_deferred_experts_per_token=1)
    layer0.load_weights_from_tensors(*weights())
    x = torch.randn(3, H)
    ids, tw = routing(3)
    layer0.forward(x, ids, tw)
    with pytest.raises(KTError, match="layer 0 deferred experts into layer 1, but layer 0 ran next"):
        layer0.forward(x, ids, tw)
    layer0.max_deferred_experts_per_token = 0
    layer0.forward(x, ids, tw)   # the pool was left idle: the next forward runs


def test_generate_gpu_experts_masks_takes_the_hottest_pairs_over_all_layers():
    from kt_core import generate_gpu_experts_masks
    freq = torch.tensor([[1.0, 5.0, 0.0], [3.0, 2.0, 3.0]])
    mask = generate_gpu_experts_masks(freq, 3)
    assert mask.dtype == torch.bool and mask.tolist() == [[False, True, False], [True, False, True]]
    assert not generate_gpu_experts_masks(freq, 0).any() and generate_gpu_experts_masks(freq, 99).all()
    assert generate_gpu_experts_masks(freq.numpy(), 1).tolist() == [[False, True, False], [False, False, False]]
    with pytest.raises(ValueError, match=r"must be \[num_layers, num_experts\], got shape \(3,\)"):
        generate_gpu_experts_masks(np.ones(3), 1)


def test_kt_kernel_arguments_kt_cannot_honour_are_refused_by_name():
    with pytest.raises(ValueError, match="Unknown mode: 'train'. Supported modes: 'inference', 'sft'"):
        make(mode="train")
    with pytest.raises(ValueError, match="numa_nodes lists 2 nodes; it must list one per thread pool"):
        make(numa_nodes=[0, 1])
    with pytest.raises(KTError, match=r"numa_nodes=\[7\]: kt's pool has no threads on NUMA node\(s\) \[7\]"):
        make(numa_nodes=[7])
    with pytest.raises(ValueError, match=r"max_deferred_experts_per_token must be in \[0, num_experts_per_tok=2\]"):
        make(max_deferred_experts_per_token=3)
    make(numa_nodes=[0], swiglu_limit=0.0)


def test_swiglu_limit_and_alpha_are_applied():
    """kt-kernel's swiglu_limit / swiglu_alpha (GPT-OSS: 7, 1.702): the clamped SwiGLU."""
    w = weights()
    x = torch.randn(6, H) * 3
    ids, tw = routing(6)
    kt = make(swiglu_limit=7.0, swiglu_alpha=1.702)
    kt.load_weights_from_tensors(*w)
    want = moe_reference(x.numpy(), *[t.float().numpy() for t in w], ids.numpy(), tw.numpy(), swiglu_limit=7.0,
                         swiglu_alpha=1.702)
    assert relative_error(kt.forward(x, ids, tw).numpy(), want) < 1e-5


def test_load_weights_without_weight_path_says_what_is_missing():
    wrapper = make()
    with pytest.raises(Exception, match="reads experts from weight_path, and this KTMoEWrapper has none"):
        wrapper.load_weights()


@pytest.fixture
def loaded():
    wrapper = make()
    wrapper.load_weights_from_tensors(*weights())
    return wrapper


def test_wrong_hidden_shape(loaded):
    ids, tw = routing(3)
    with pytest.raises(ValueError, match=r"hidden_states must have shape \[3, 64\], got \[3, 63\]"):
        loaded.forward(torch.randn(3, 63), ids, tw)


def test_wrong_ids_shape(loaded):
    with pytest.raises(ValueError, match=r"topk_ids must have shape \[3, 2\], got \[3, 3\]"):
        loaded.forward(torch.randn(3, H), torch.zeros(3, 3, dtype=torch.int64), torch.ones(3, 2))


def test_float_ids_refused(loaded):
    with pytest.raises(TypeError, match="integer expert ids"):
        loaded.forward(torch.randn(2, H), torch.zeros(2, 2), torch.ones(2, 2))


def test_ids_out_of_range(loaded):
    ids = torch.tensor([[0, 1], [2, 8]])
    with pytest.raises(ValueError, match=r"topk_ids\[1, 1\] = 8 is outside \[-1, 8\)"):
        loaded.forward(torch.randn(2, H), ids, torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"= -2 is outside"):
        loaded.forward(torch.randn(2, H), -2 * torch.ones(2, 2, dtype=torch.int64), torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"topk_ids\[1, 1\] = 8 is outside \[-1, 8\)"):
        loaded.submit_forward(torch.randn(2, H), ids, torch.ones(2, 2))   # refused at submit, not at sync
    loaded.submit_forward(torch.randn(2, H), ids.clamp(max=7), torch.ones(2, 2))   # and nothing was left pending
    assert loaded.sync_forward().shape == (2, H)


def test_too_many_tokens(loaded):
    ids, tw = routing(65)
    with pytest.raises(ValueError, match=r"forward got 65 tokens; this layer takes at most 64 \(chunked_prefill_size\)"):
        loaded.forward(torch.randn(65, H), ids, tw)
    with pytest.raises(ValueError, match=r"forward got 65 tokens; this layer takes at most 64"):
        loaded.submit_forward(torch.randn(65, H), ids, tw)      # refused at submit, not at sync


def test_non_contiguous_and_strided_inputs_are_handled(loaded):
    x = torch.randn(H, 4).t()                  # a transposed view: copied, not misread
    ids, tw = routing(4)
    out = loaded.forward(x, ids, tw)
    np.testing.assert_allclose(out.numpy(), loaded.forward(x.contiguous(), ids, tw).numpy())


def test_meta_device_is_refused(loaded):
    with pytest.raises(Exception, match="meta"):
        loaded.forward(torch.empty(2, H, device="meta"), torch.zeros(2, 2, dtype=torch.int64), torch.ones(2, 2))


def test_nan_and_inf_propagate_without_crashing(loaded):
    x = torch.randn(3, H)
    x[0, 0] = float("nan")
    x[2, 1] = float("inf")
    ids, tw = routing(3)
    out = loaded.forward(x, ids, tw)
    assert torch.isnan(out[0]).any()
    assert torch.isfinite(out[1]).all()


def test_weights_of_the_wrong_shape():
    wrapper = make()
    gate, up, down = weights()
    with pytest.raises(ValueError, match=r"down must have shape \[64, 32\], got \[32, 64\]"):
        wrapper.load_weights_from_tensors(gate, up, down.transpose(1, 2))
    with pytest.raises(ValueError, match="same number of experts"):
        wrapper.load_weights_from_tensors(gate, up, down[:4])
    with pytest.raises(ValueError, match="physical_to_logical_map entry 9 is outside"):
        wrapper.load_weights_from_tensors(gate, up, down, torch.tensor([0, 1, 2, 3, 4, 5, 6, 9]))


def test_integer_weights_refused():
    wrapper = make()
    gate, up, down = weights()
    with pytest.raises(ValueError, match="gate must be floating point .* got integer codes"):
        wrapper.load_weights_from_tensors(gate.int(), up, down)


def test_forward_before_load_is_refused():
    wrapper = make()
    ids, tw = routing(1)
    with pytest.raises(RuntimeError, match="has no weights: call load_weights"):
        wrapper.forward(torch.randn(1, H), ids, tw)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="top_k .9. cannot exceed num_experts .8."):
        make(num_experts_per_tok=9)
    with pytest.raises(ValueError, match="gpu_experts_mask has 3 entries, expected num_experts=8"):
        make(gpu_experts_mask=torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match="either gpu_experts_mask or num_gpu_experts"):
        make(gpu_experts_mask=torch.zeros(E, dtype=torch.bool), num_gpu_experts=2)


def test_nan_weights_refused_at_load():
    wrapper = make()
    gate, up, down = weights()
    gate[2, 3, 5] = float("nan")
    with pytest.raises(ValueError, match=r"expert 2 gate hold NaN or Inf at \[3, 5\]"):
        wrapper.load_weights_from_tensors(gate, up, down)
    down[1, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"expert 1 down hold NaN or Inf at \[0, 0\]"):
        wrapper.load_weights_from_tensors(*weights()[:2], down)


NUMA_NODES = """
import numpy as np, torch
from kt_core import KTMoEWrapper, KTError, pool
from kt_core.testing.reference import moe_reference, relative_error
assert len(pool.info().groups) == 2, pool.info()
E, K, H, I = 12, 2, 64, 32
g = torch.Generator().manual_seed(0)
w = [torch.randn(E, *s, generator=g) / s[1] ** 0.5 for s in ((I, H), (I, H), (H, I))]
args = dict(num_experts=E, num_experts_per_tok=K, hidden_size=H, moe_intermediate_size=I, chunked_prefill_size=16,
            method="BF16", backend="reference")
everywhere = KTMoEWrapper(layer_idx=0, threadpool_count=2, **args)
assert [everywhere._moe.expert_group(e) for e in range(E)] == [0] * 6 + [1] * 6
one = KTMoEWrapper(layer_idx=1, threadpool_count=1, numa_nodes=[1], **args)
two = KTMoEWrapper(layer_idx=2, threadpool_count=2, numa_nodes=[1, 0], **args)
assert {one._moe.expert_group(e) for e in range(E)} == {1}
assert [two._moe.expert_group(e) for e in range(E)] == [1] * 6 + [0] * 6
assert KTMoEWrapper(layer_idx=4, threadpool_count=1, numa_nodes=[0], **args)._moe.expert_group(E - 1) == 0
x = torch.randn(9, H, generator=g)
ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(9)])
tw = torch.rand(9, K, generator=g)
want = moe_reference(x.numpy(), *[t.bfloat16().float().numpy() for t in w], ids.numpy(), tw.numpy())
for kt in (everywhere, one, two):
    kt.load_weights_from_tensors(*w)
    assert relative_error(kt.forward(x, ids, tw).numpy(), want) < 1e-5
try:
    KTMoEWrapper(layer_idx=3, threadpool_count=1, numa_nodes=[2], **args)
except KTError as e:
    assert "kt's pool has 2 virtual groups (KT_VIRTUAL_NUMA), numbered 0..1" in str(e), e
else:
    raise AssertionError("numa_nodes=[3] accepted")
print("ok")
"""


def test_numa_nodes_place_a_layers_experts_on_those_groups():
    """kt-kernel's numa_nodes: the layer's experts live (memory) and run (threads) on those
    nodes; here two virtual groups stand for two nodes."""
    from kt_core.testing.fixtures import run_python
    r = run_python(NUMA_NODES, KT_VIRTUAL_NUMA="2")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
