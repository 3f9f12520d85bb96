"""kt-cuda on any host, and on a GPU where one is lent (the GPU tests skip, naming what is
missing, elsewhere; benchmarks/cuda_check.sh runs them on the device machine)."""

import time

import pytest

import kt_cuda
from kt_core import KTMoEWrapper, device_bridge
from kt_core import _native as core

USABLE, WHY = kt_cuda.available()
needs_gpu = pytest.mark.skipif(not USABLE, reason=f"needs a CUDA GPU: {WHY}")
E, K, H, I = 8, 2, 256, 128


def test_import_needs_no_gpu_and_says_why_it_is_unused():
    ok, why = kt_cuda.available()
    assert isinstance(ok, bool) and why
    if not ok:
        assert device_bridge.provider("cuda") is None
        rows = device_bridge.report()
        assert ("cuda", "kt_cuda:bridge_provider", False, why) in rows


def test_bridge_arguments_are_checked_before_anything_is_allocated():
    native = kt_cuda._load_native()
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        native.StreamBridge(core.forward_api(), H, K, 5, [], 16)
    with pytest.raises(ValueError, match=r"capture size 17 is outside \[1, 16\] \(chunked_prefill_size\)"):
        native.StreamBridge(core.forward_api(), H, K, 1, [17], 16)
    with pytest.raises(ValueError, match="expected kt_core._native.forward_api"):
        import ctypes
        bogus = ctypes.pythonapi.PyCapsule_New
        bogus.restype, bogus.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        native.StreamBridge(bogus(1, b"other", None), H, K, 1, [], 16)


@pytest.mark.skipif(USABLE, reason="this host has a GPU: pinned staging succeeds")
def test_without_a_gpu_staging_fails_with_the_runtimes_reason():
    native = kt_cuda._load_native()
    with pytest.raises(RuntimeError, match=r"pinned staging \(hidden\): "):
        native.StreamBridge(core.forward_api(), H, K, 1, [4], 16)


def test_the_gpu_numa_node_is_minus_one_where_unknown():
    assert kt_cuda.gpu_numa_node(None if USABLE else 0) >= -1
    if not USABLE:
        assert kt_cuda.gpu_numa_node(0) == -1


# -- on a GPU -------------------------------------------------------------------------------


@needs_gpu
def test_pinned_staging_is_kt_cores_numa_memory():
    from kt_core import pool
    live = lambda: sum(n["bytes_live"] for n in pool.numa_usage())   # noqa: E731
    before = live()
    bridge = kt_cuda._load_native().StreamBridge(core.forward_api(), H, K, 1, [1, 4], 16, kt_cuda.gpu_numa_node(0))
    assert bridge.pinned_bytes > 0 and live() - before >= bridge.pinned_bytes
    del bridge
    assert live() == before


def layer(torch, layer_idx=0, chunk=64):
    g = torch.Generator().manual_seed(layer_idx)
    w = [(torch.randn(E, *s, generator=g) / s[1] ** 0.5).bfloat16() for s in ((I, H), (I, H), (H, I))]
    kt = KTMoEWrapper(layer_idx=layer_idx, num_experts=E, num_experts_per_tok=K, hidden_size=H, moe_intermediate_size=I,
                      gpu_experts_mask=torch.tensor([e < 2 for e in range(E)]), chunked_prefill_size=chunk,
                      method="BF16")
    kt.load_weights_from_tensors(*w)
    return kt


def inputs(torch, tokens, seed=0, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, H, generator=g).bfloat16()
    ids = torch.argsort(torch.rand(tokens, E, generator=g), dim=1)[:, :K].to(torch.int32)
    w = torch.softmax(torch.randn(tokens, K, generator=g), dim=-1)
    return x.to(device), ids.to(device), w.to(device)


@needs_gpu
def test_stream_ordered_forward_equals_the_cpu_forward():
    import torch
    kt = layer(torch)
    for tokens in (1, 3, 8, 64):
        x, ids, w = inputs(torch, tokens, tokens)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            kt.submit_forward(x, ids, w, stream.cuda_stream)
            out = kt.sync_forward(x, stream.cuda_stream)
        stream.synchronize()
        want = kt.forward(x.cpu(), ids.cpu().long(), w.cpu())
        assert out.device.type == "cuda" and out.dtype == torch.bfloat16
        assert torch.equal(out.cpu(), want), tokens


@needs_gpu
@pytest.mark.parametrize("tokens", [1, 2, 4, 8])
def test_capture_and_replay_match_eager(tokens):
    import torch
    KTMoEWrapper.set_capture_batch_sizes([1, 2, 4, 8])
    kt = layer(torch, layer_idx=1)
    x, ids, w = inputs(torch, tokens, 100 + tokens)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):   # warm-up outside the graph: staging and outputs exist
        kt.forward(x, ids, w, stream.cuda_stream)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kt.forward(x, ids, w, torch.cuda.current_stream().cuda_stream)
    for seed in (1, 2):
        nx, nids, nw = inputs(torch, tokens, 200 + seed)
        x.copy_(nx)
        ids.copy_(nids)
        w.copy_(nw)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), kt.forward(nx.cpu(), nids.cpu().long(), nw.cpu())), seed


@needs_gpu
def test_submit_returns_before_the_cpu_work_and_gpu_work_overlaps_it():
    import torch
    # A layer whose CPU forward takes tens of milliseconds, so that the other stream's short
    # GPU work (one 1024 x 1024 product, ~0.1 ms) has every chance to finish before it.
    hidden, inter, tokens = 1024, 512, 2048
    g = torch.Generator().manual_seed(7)
    weights = [(torch.randn(E, *s, generator=g) / s[1] ** 0.5).bfloat16()
               for s in ((inter, hidden), (inter, hidden), (hidden, inter))]
    kt = KTMoEWrapper(layer_idx=2, num_experts=E, num_experts_per_tok=K, hidden_size=hidden,
                      moe_intermediate_size=inter, gpu_experts_mask=torch.zeros(E, dtype=torch.bool),
                      chunked_prefill_size=tokens, method="BF16")
    kt.load_weights_from_tensors(*weights)
    x = torch.randn(tokens, hidden, generator=g).bfloat16()
    ids = torch.argsort(torch.rand(tokens, E, generator=g), dim=1)[:, :K].to(torch.int32)
    w = torch.softmax(torch.randn(tokens, K, generator=g), dim=-1)
    x, ids, w = x.cuda(), ids.cuda(), w.cuda()
    stream, other = torch.cuda.Stream(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(other):    # warm-up: cuBLAS initializes on first use (~100 ms), which no overlap hides
        a = torch.randn(1024, 1024, device="cuda")
        a = a @ a / 1024
    kt.submit_forward(x, ids, w, stream.cuda_stream)   # warm-up: staging for this size is allocated here
    kt.sync_forward(x, stream.cuda_stream)
    torch.cuda.synchronize()

    start = time.perf_counter()
    kt.submit_forward(x, ids, w, stream.cuda_stream)
    submitted = time.perf_counter() - start
    with torch.cuda.stream(other):    # GPU work enqueued after submit, on another stream
        began_other, done_other = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began_other.record(other)
        a = a @ a / 1024
        done_other.record(other)
    out = kt.sync_forward(x, stream.cuda_stream)
    done_cpu = torch.cuda.Event(enable_timing=True)
    done_cpu.record(stream)
    done_cpu.synchronize()
    total = time.perf_counter() - start
    other_ms, margin_ms = began_other.elapsed_time(done_other), done_other.elapsed_time(done_cpu)
    seen = f"submit {submitted * 1e3:.2f} ms of {total * 1e3:.2f} ms; other stream {other_ms:.3f} ms, " \
           f"finished {margin_ms:.2f} ms before the bridged forward"
    print(seen)
    # The other stream's work completed before the bridged CPU forward did: it was not queued
    # behind the bridge's host functions. And submit returned long before the forward ended.
    assert done_other.query(), seen
    assert margin_ms > 0, "the other stream's work waited for the CPU experts: " + seen
    assert submitted < 0.25 * total, seen
    assert torch.equal(out.cpu(), kt.forward(x.cpu(), ids.cpu().long(), w.cpu()))
