"""kt/forward.h: a layer's forward submitted and awaited through the C table device bridges use
(kt-cuda calls it from CUDA host functions), here from a plain thread through ctypes: the same
result as MoE.forward, bad input refused with a status and a message, one forward at a time."""

import ctypes
import threading

import numpy as np

import kt_core
from kt_core import _native
from kt_core.testing.reference import random_moe, random_routing

F32, BF16 = 0, 1
OK, INVALID = 0, 1


class ForwardApi(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("version", ctypes.c_uint32),
                ("submit", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)),
                ("wait", ctypes.CFUNCTYPE(ctypes.c_int)), ("last_error", ctypes.CFUNCTYPE(ctypes.c_char_p)),
                # version 2
                ("alloc", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_int)),
                ("free", ctypes.CFUNCTYPE(None, ctypes.c_void_p))]


def forward_api() -> ForwardApi:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return ForwardApi.from_address(get(_native.forward_api(), b"kt_forward_api"))


def layer_and_inputs(tokens=5):
    rng = np.random.default_rng(tokens)
    moe = kt_core.MoE(num_experts=6, top_k=2, hidden_size=64, intermediate_size=32, method="BF16", backend="reference",
                      max_tokens=16)
    moe.load(*random_moe(rng, 6, 64, 32))
    x = rng.standard_normal((tokens, 64)).astype(np.float32)
    ids, w = random_routing(rng, tokens, 6, 2)
    return moe, x, np.ascontiguousarray(ids, np.int64), np.ascontiguousarray(w, np.float32)


def submit(api, moe, x, ids, w, out):
    return api.submit(moe.native_handle, x.ctypes.data, F32, x.shape[0], ids.ctypes.data, w.ctypes.data, out.ctypes.data,
                      F32)


def test_forward_from_another_thread_equals_moe_forward():
    api = forward_api()
    assert api.version == 2 and api.struct_size == ctypes.sizeof(ForwardApi)
    moe, x, ids, w = layer_and_inputs()
    out = np.zeros_like(x)
    status = []
    worker = threading.Thread(target=lambda: status.extend([submit(api, moe, x, ids, w, out), api.wait()]))
    worker.start()
    worker.join()
    assert status == [OK, OK], api.last_error()
    np.testing.assert_array_equal(out, moe.forward(x, ids, w))
    assert api.wait() == OK   # nothing queued: returns at once


def test_staging_memory_comes_from_kt_cores_numa_allocator():
    """Version 2: device bridges allocate their staging buffers through kt-core (counted per node)."""
    api = forward_api()
    live = lambda: sum(n["bytes_live"] for n in kt_core.pool.numa_usage())   # noqa: E731
    before = live()
    p = api.alloc(1 << 20, 4096, -1, 0)
    assert p and p % 4096 == 0 and live() - before >= 1 << 20
    assert ctypes.string_at(p, 64) == b"\0" * 64   # zero-filled
    api.free(p)
    assert live() == before
    assert api.alloc(1 << 62, 64, -1, 0) is None   # failure is NULL, never an exception through C


def test_bad_input_is_a_status_and_a_message_and_queues_nothing():
    api = forward_api()
    moe, x, ids, w = layer_and_inputs()
    out = np.zeros_like(x)
    ids[1, 1] = 9
    assert submit(api, moe, x, ids, w, out) == INVALID
    assert b"topk_ids[1, 1] = 9 is outside [-1, 6)" in api.last_error()
    big = np.zeros((17, 64), np.float32)
    assert api.submit(moe.native_handle, big.ctypes.data, F32, 17, ids.ctypes.data, w.ctypes.data, big.ctypes.data,
                      F32) == INVALID
    assert b"this layer takes at most 16 (chunked_prefill_size)" in api.last_error()
    assert api.submit(None, x.ctypes.data, F32, 5, ids.ctypes.data, w.ctypes.data, out.ctypes.data, F32) == INVALID
    assert b"null layer" in api.last_error()
    assert not _native.pool_job_pending()


def test_one_forward_at_a_time():
    """A second submit while the first is queued or running is refused by name; if the first
    already finished (a tiny layer), the second is simply the next forward."""
    api = forward_api()
    moe, x, ids, w = layer_and_inputs()
    first, second = np.zeros_like(x), np.zeros_like(x)
    assert submit(api, moe, x, ids, w, first) == OK
    status = submit(api, moe, x, ids, w, second)
    message = api.last_error()
    assert api.wait() == OK
    want = moe.forward(x, ids, w)
    np.testing.assert_array_equal(first, want)
    if status == OK:
        assert api.wait() == OK
        np.testing.assert_array_equal(second, want)
    else:
        assert status == INVALID and b"a forward is already queued; wait() for it first" in message
