"""A complete fake backend built with ctypes: real FP32 kernels (NumPy behind C function
pointers) whose every entry can be made to fail on demand, so faults and fuzzing can stage a
plugin that returns an error status from a packer or a kernel, or lies in its handshake,
without a compiler. Mirrors kt/plugin.h (ABI 1.1; 1.3's packer-less methods with packs=False);
the packed layout is gate, up, down as f32 row-major, activations are f32 rows.

    fake = FakeBackend(name="faulty")          # then register it with fake_plugins.install
    fake.fail["gate_up_tile"] = 4              # next gate_up_tile calls return KT_ERROR_INTERNAL
    capsule = fake.capsule()
"""

from __future__ import annotations

import ctypes as C
import threading

import numpy as np

KT_OK, KT_ERROR_INVALID_ARGUMENT, KT_ERROR_UNSUPPORTED, KT_ERROR_OUT_OF_MEMORY, KT_ERROR_INTERNAL = range(5)
KT_DTYPE_F32 = 0


class MoeConfig(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("hidden", C.c_int64), ("intermediate", C.c_int64),
                ("num_experts", C.c_int64), ("top_k", C.c_int64), ("group_size", C.c_int64),
                ("quant_flags", C.c_uint32), ("weight_dtype", C.c_int * 3)]


class Matrix(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("rows", C.c_int64), ("cols", C.c_int64),
                ("row_stride", C.c_int64)]


class Weight(C.Structure):
    _fields_ = [("values", Matrix), ("scales", Matrix), ("zeros", Matrix)]


class ExpertWeights(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("gate", Weight), ("up", Weight), ("down", Weight)]


SET_ERROR = C.CFUNCTYPE(None, C.c_char_p)


class HostApi(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("abi_major", C.c_uint16), ("abi_minor", C.c_uint16),
                *[(n, C.c_void_p) for n in ("num_threads", "num_groups", "group_numa_node", "parallel_for",
                                           "parallel_for_2d", "parallel_for_groups", "alloc", "free", "has_feature",
                                           "log")],
                ("set_error", SET_ERROR)]


CFG = C.POINTER(MoeConfig)
INIT = C.CFUNCTYPE(C.c_int, C.POINTER(HostApi))
DECLINES = C.CFUNCTYPE(C.c_int, CFG, C.c_int64)
PACKED_BYTES = C.CFUNCTYPE(C.c_size_t, CFG)
PACK = C.CFUNCTYPE(C.c_int, CFG, C.POINTER(ExpertWeights), C.c_void_p)
ROW_BYTES = C.CFUNCTYPE(C.c_size_t, C.c_int64)
QUANTIZE = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.c_int64, C.c_int64, C.c_int64, C.c_void_p)
TILE = C.CFUNCTYPE(C.c_int, CFG, C.c_void_p, C.c_void_p, C.c_int64, C.c_int64, C.c_int64, C.POINTER(C.c_float),
                   C.c_int64)
FORWARD = C.CFUNCTYPE(C.c_int, CFG, C.c_void_p, C.c_void_p, C.c_int, C.c_int64, C.c_void_p, C.c_void_p,
                      C.POINTER(C.c_float))


class MethodKernels(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("method", C.c_char_p), ("layout_id", C.c_char_p),
                ("kernel_id", C.c_char_p), ("gate_up_block", C.c_int64), ("down_block", C.c_int64),
                ("declines", DECLINES), ("packed_expert_bytes", PACKED_BYTES), ("pack_expert", PACK),
                ("activation_row_bytes", ROW_BYTES), ("quantize_activations", QUANTIZE),
                ("gate_up_tile", TILE), ("down_tile", TILE), ("moe_forward", FORWARD)]


class BackendApi(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("abi_major", C.c_uint16), ("abi_minor", C.c_uint16),
                ("name", C.c_char_p), ("variant", C.c_char_p), ("required_features", C.c_char_p),
                ("init", INIT), ("num_methods", C.c_size_t), ("methods", C.POINTER(MethodKernels))]


def _f32(ptr, shape, stride=None) -> np.ndarray:
    """A NumPy view of f32 memory (rows of `stride` elements)."""
    rows, cols = shape
    stride = cols if stride is None else stride
    if rows == 0 or cols == 0:
        return np.zeros((rows, cols), np.float32)
    buf = (C.c_float * ((rows - 1) * stride + cols)).from_address(ptr)
    return np.lib.stride_tricks.as_strided(np.frombuffer(buf, np.float32), (rows, cols), (stride * 4, 4))


class FakeBackend:
    """One FP32 method whose entries fail on request: fail[entry] = status makes every call
    of that entry return `status` (after host->set_error) until the entry is removed; a
    status of "once:<n>" style is spelled fail_once[entry] = status."""

    ENTRIES = ("init", "pack_expert", "quantize_activations", "gate_up_tile", "down_tile", "moe_forward")

    def __init__(self, *, name="faulty", variant="v1", method="FP32", whole_op=False, abi=(1, 1),
                 packed_bytes: int | None = None, row_bytes: int | None = None, packs: bool = True,
                 declines_below: int = 0):
        # packs=False: no packer (ABI 1.3, the core borrows one for this layout); declines_below:
        # batches of fewer tokens are declined (a GEMM library or matrix engine).
        # packed_bytes / row_bytes: sizes to report instead of the true ones (a lying plugin);
        # the entries then touch no memory, so only the core's handling of the sizes is tested.
        self.lie = (packed_bytes, row_bytes)
        self.host = None
        self.fail: dict[str, int] = {}
        self.fail_once: dict[str, int] = {}
        self.calls = dict.fromkeys(self.ENTRIES, 0)
        self.failed: list[tuple[str, int]] = []     # (entry, status) of every call made to fail
        self._lock = threading.Lock()
        self.whole_op = whole_op
        self._fns = [INIT(self._init), PACKED_BYTES(self._packed_bytes), PACK(self._pack), ROW_BYTES(self._row_bytes),
                     QUANTIZE(self._quantize), TILE(self._gate_up), TILE(self._down), FORWARD(self._forward)]
        init, packed_bytes, pack, row_bytes, quantize, gate_up, down, forward = self._fns
        self._strings = [s.encode() for s in (name, variant, method, "fake-f32-rowmajor-v1", "moe.f32.fake")]
        self.declines_below = declines_below
        self._fns.append(DECLINES(lambda cfg, tokens: int(tokens < self.declines_below)))
        self.kernels = MethodKernels(C.sizeof(MethodKernels), self._strings[2], self._strings[3], self._strings[4], 8, 8,
                                     self._fns[-1] if declines_below else DECLINES(),
                                     packed_bytes if packs else PACKED_BYTES(), pack if packs else PACK(), row_bytes,
                                     quantize, gate_up, down, forward if whole_op else FORWARD())
        self.api = BackendApi(C.sizeof(BackendApi), abi[0], abi[1], self._strings[0], self._strings[1], b"", init, 1,
                              C.pointer(self.kernels))

    # -- failure injection -----------------------------------------------------------------
    def _failing(self, entry: str) -> int:
        with self._lock:
            self.calls[entry] += 1
            status = self.fail.get(entry, KT_OK) or self.fail_once.pop(entry, KT_OK)
        if status != KT_OK:
            self.failed.append((entry, status))
            if self.host:
                self.host.contents.set_error(f"fake {entry} failed on purpose (status {status})".encode())
        return status

    # -- the entries -------------------------------------------------------------------------
    def _init(self, host):
        self.host = host
        return self._failing("init")

    def _packed_bytes(self, cfg):
        c = cfg.contents
        return 3 * c.hidden * c.intermediate * 4 if self.lie[0] is None else self.lie[0]

    @property
    def lying(self) -> bool:
        return self.lie != (None, None)

    def _pack(self, cfg, src, dst):
        if (status := self._failing("pack_expert")) != KT_OK or self.lying:
            return status
        c, w = cfg.contents, src.contents
        at = dst
        for part in (w.gate, w.up, w.down):
            m = part.values
            if m.dtype != KT_DTYPE_F32:
                self.host.contents.set_error(b"the fake backend packs f32 weights only")
                return KT_ERROR_UNSUPPORTED
            _f32(at, (m.rows, m.cols))[:] = _f32(m.data, (m.rows, m.cols), m.row_stride)
            at += m.rows * m.cols * 4
        del c
        return KT_OK

    def _row_bytes(self, k):
        return k * 4 if self.lie[1] is None else self.lie[1]

    def _quantize(self, src, dtype, rows, k, stride, dst):
        if (status := self._failing("quantize_activations")) != KT_OK or self.lying:
            return status
        if dtype != KT_DTYPE_F32:
            self.host.contents.set_error(b"the fake backend quantizes f32 activations only")
            return KT_ERROR_UNSUPPORTED
        _f32(dst, (rows, k))[:] = _f32(src, (rows, k), stride)
        return KT_OK

    def _matrices(self, cfg, packed):
        c = cfg.contents
        H, I = c.hidden, c.intermediate
        gate = _f32(packed, (I, H))
        up = _f32(packed + I * H * 4, (I, H))
        down = _f32(packed + 2 * I * H * 4, (H, I))
        return gate, up, down

    def _gate_up(self, cfg, packed, act, rows, n0, n1, out, stride):
        if (status := self._failing("gate_up_tile")) != KT_OK or self.lying:
            return status
        gate, up, _ = self._matrices(cfg, packed)
        x = _f32(act, (rows, cfg.contents.hidden))
        g, u = x @ gate[n0:n1].T, x @ up[n0:n1].T
        _f32(C.addressof(out.contents), (rows, stride))[:, n0:n1] = g / (1 + np.exp(-g)) * u
        return KT_OK

    def _down(self, cfg, packed, act, rows, n0, n1, out, stride):
        if (status := self._failing("down_tile")) != KT_OK or self.lying:
            return status
        _, _, down = self._matrices(cfg, packed)
        a = _f32(act, (rows, cfg.contents.intermediate))
        _f32(C.addressof(out.contents), (rows, stride))[:, n0:n1] = a @ down[n0:n1].T
        return KT_OK

    def _forward(self, cfg, packed, hidden, dtype, tokens, ids, weights, out):
        if (status := self._failing("moe_forward")) != KT_OK or self.lying:
            return status
        c = cfg.contents
        experts = C.cast(packed, C.POINTER(C.c_void_p))
        x = _f32(hidden, (tokens, c.hidden))
        ids = np.ctypeslib.as_array(C.cast(ids, C.POINTER(C.c_int64)), (tokens * c.top_k,)).reshape(tokens, c.top_k)
        w = _f32(weights, (tokens, c.top_k))
        y = np.zeros((tokens, c.hidden), np.float32)
        for t in range(tokens):
            for j in range(c.top_k):
                e = int(ids[t, j])
                if e < 0 or not experts[e]:
                    continue
                gate, up, down = self._matrices(cfg, experts[e])
                g, u = gate @ x[t], up @ x[t]
                y[t] += w[t, j] * (down @ (g / (1 + np.exp(-g)) * u))
        _f32(C.addressof(out.contents), (tokens, c.hidden))[:] = y
        return KT_OK

    def capsule(self):
        """A PyCapsule named kt.backend_api around this table (the object keeps it alive)."""
        new = C.pythonapi.PyCapsule_New
        new.restype = C.py_object
        new.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
        self._capsule_name = C.create_string_buffer(b"kt.backend_api")
        return new(C.addressof(self.api), self._capsule_name, None)
