"""Fuzz target: the plugin handshake — a backend's descriptor as discovery and selection
judge it (kt_core/backends/discovery.py, selection.py), the native table as load_backend
validates it (native/bindings, native/abi), and the first load and forwards through it.

The plugin is tests/fake_kernels.FakeBackend (real FP32 kernels behind ctypes function
pointers); each input byte picks one property of the descriptor, the table or a kernel's
behaviour from FIELDS (a missing byte picks the first choice: an honest plugin). What is
fuzzed is what the ABI makes the core check: versions, sizes, names, feature lists, NULL
entries, block sizes, reported byte counts and the status every entry returns. Pointers that
lie about the memory behind them are outside any C ABI's reach and are not fuzzed.

Documented errors: KTError (BackendError for anything wrong with a plugin), and the
exceptions the core raises for a failed kernel (plugin-abi.md: RuntimeError, ValueError for
KT_ERROR_INVALID_ARGUMENT, MemoryError for KT_ERROR_OUT_OF_MEMORY) carrying the plugin's
message. When the plugin is honest and nothing fails, the output must match NumPy's.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

FUZZ_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(FUZZ_DIR))
sys.path.insert(0, str(FUZZ_DIR.parent / "packages" / "kt-core" / "tests"))
import _harness  # noqa: E402

MODULE = "kt_fuzz_plugin_native"
STATUSES = (0, 1, 2, 3, 4, 9)
FIELDS = {
    "entry": ("descriptor", "factory", "factory-raises", "int", "import-error"),
    "desc_name": ("fuzz", "other"),
    "abi_major": (1, 0, 2, "1"),
    "abi_minor": (1, 0, 2, 255, None),
    "abi_shape": ("tuple", "short", "list", "str"),
    "tier": ("GENERIC_SIMD", "REFERENCE", "MATRIX_ENGINE", 7, "simd", None),
    "arch": (("x86_64", "aarch64"), ("riscv64",), (), "x86_64", None),
    "variants": ("one", "two", "none", "not-a-variant", "str"),
    "var_name": ("v1", "v2", "", None),
    "var_module": (MODULE, "kt_fuzz_no_such_module", "", None),
    "var_requires": ((), ("sse2",), ("quantum_tiles",), "sse2", None),
    "var_methods": (("FP32",), ("fp32",), ("FP32", "INT8"), (), "FP32", None, ("LLAMAFILE",)),
    "var_rank": (0, 1, -5, "high", None),
    "var_ggml": ((), ("Q4_K",), ("Q9_Z",), None),
    "probe": (None, "ok", "reason", "raises", "not-callable"),
    "api_size": ("exact", "minus8", "tiny", "zero", "plus64"),
    "api_major": (1, 0, 2, 65535),
    "api_minor": (1, 0, 2, 65535),
    "api_name": ("match", "other", None),
    "api_variant": ("match", "other", None),
    "api_features": (b"", b"sse2", b",,sse2,", b"quantum_tiles", None),
    "init": ("ok", "fails", "null"),
    "num_methods": (1, 0),
    "m_size": ("exact", "before-forward", "tiny", "zero", "plus64"),
    "m_method": (b"FP32", b"INT8", b"", None, b"fp32"),
    "m_layout": (b"fake-f32-rowmajor-v1", None, b""),
    "m_kernel": (b"moe.f32.fake", None),
    "gate_up_block": (8, 1, 0, -1, 1 << 40, 7),
    "down_block": (8, 1, 0, -1, 1 << 40, 7),
    "null": (0, 1, 2, 4, 8, 16, 32, 64, 3, 255),     # bit mask over the kernel entries below
    "whole_op": (False, True),
    "declines": (None, 0, 1),
    "packed_bytes": (None, 0, 1, 1 << 50),
    "row_bytes": (None, 0, 1, 1 << 50),
    "fail_pack": STATUSES, "fail_quantize": STATUSES, "fail_gate_up": STATUSES, "fail_down": STATUSES,
    "fail_forward": STATUSES,
    "tokens": (3, 1, 0, 16),
}
NULLABLE = ("packed_expert_bytes", "pack_expert", "activation_row_bytes", "quantize_activations", "gate_up_tile",
            "down_tile", "moe_forward", "declines")


def decode(data: bytes) -> dict:
    return {name: choices[data[i] % len(choices)] if i < len(data) else choices[0]
            for i, (name, choices) in enumerate(FIELDS.items())}


def encode(**picks) -> bytes:
    """The input that picks `picks` (field=value) and the first choice elsewhere."""
    return bytes(FIELDS[name].index(picks[name]) if name in picks else 0 for name in FIELDS)


def encode_seed() -> dict[str, bytes]:
    return {"honest": encode(), "whole-op": encode(whole_op=True), "abi-1.0": encode(abi_minor=0, api_minor=0),
            "abi-1.0-short-method-table": encode(api_minor=0, m_size="before-forward"),
            "newer-minor": encode(abi_minor=2, api_minor=2), "other-major": encode(api_major=2),
            "failing-tile": encode(fail_gate_up=4), "failing-pack": encode(fail_pack=1),
            "oom-forward": encode(whole_op=True, fail_forward=3), "declines": encode(declines=1),
            "lying-features": encode(api_features=b"quantum_tiles")}


class _EntryPoint:
    """What importlib.metadata gives discovery, for a plugin made here."""

    def __init__(self, load):
        self.name, self.value, self.dist, self._load = "fuzz", "kt_fuzz_plugin:descriptor", None, load

    def load(self):
        return self._load()


_state = {}


def _setup():
    if _state:
        return
    import ctypes

    import fake_kernels as fk
    import numpy as np

    import kt_core.moe as moe_module
    from kt_core.backends import BackendDescriptor, Tier, Variant, discovery, selection
    from kt_core.errors import KTError
    from kt_core.host import host
    from kt_core.testing.reference import moe_reference, random_moe, random_routing

    module = types.ModuleType(MODULE)
    sys.modules[MODULE] = module
    rng = np.random.default_rng(0)
    weights = random_moe(rng, 4, 32, 16)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    ids, wt = random_routing(rng, 16, 4, 2)
    ids[0, 0] = -1                                    # a skipped slot
    _state.update(np=np, C=ctypes, fk=fk, moe=moe_module, BackendDescriptor=BackendDescriptor, Tier=Tier,
                  Variant=Variant, discovery=discovery, selection=selection, KTError=KTError, host=host,
                  module=module, weights=weights, x=x, ids=ids, wt=wt, reference=moe_reference,
                  others=tuple(d for d in discovery.discover() if d.descriptor and d.descriptor.name == "reference"),
                  selector=moe_module.selector)


def _descriptor(p: dict):
    s = _state
    if p["entry"] == "int":
        return 42
    if p["entry"] == "import-error":
        raise ImportError("libfuzz.so.1: cannot open shared object file")
    major, minor = p["abi_major"], p["abi_minor"]
    abi = {"tuple": (major, minor), "short": (major,), "list": [major, minor], "str": f"{major}.{minor}"}[p["abi_shape"]]
    variant = s["Variant"](p["var_name"], module=p["var_module"], requires=p["var_requires"], methods=p["var_methods"],
                           rank=p["var_rank"], ggml_types=p["var_ggml"])
    variants = {"one": (variant,), "two": (variant, s["Variant"]("v2", module=MODULE, methods=("FP32",), rank=9)),
                "none": (), "not-a-variant": ("v1",), "str": "v1"}[p["variants"]]
    probe = {None: None, "ok": lambda: None, "reason": lambda: "libfuzz missing",
             "raises": lambda: 1 / 0, "not-callable": "yes"}[p["probe"]]
    tier = getattr(s["Tier"], p["tier"]) if p["tier"] in ("GENERIC_SIMD", "REFERENCE", "MATRIX_ENGINE") else p["tier"]
    return s["BackendDescriptor"](name=p["desc_name"], abi_version=abi, tier=tier, arch=p["arch"], variants=variants,
                                  probe=probe)


def _entry_point(p: dict):
    def load():
        if p["entry"] == "factory-raises":
            raise RuntimeError("the descriptor factory failed")
        if p["entry"] == "factory":
            return lambda: _descriptor(p)
        return _descriptor(p)
    return _EntryPoint(load)


def _fake(p: dict):
    fk, C = _state["fk"], _state["C"]
    fake = fk.FakeBackend(name="fuzz", whole_op=p["whole_op"], packed_bytes=p["packed_bytes"], row_bytes=p["row_bytes"])
    api, k = fake.api, fake.kernels
    size = C.sizeof(fk.BackendApi)
    api.struct_size = {"exact": size, "minus8": size - 8, "tiny": 8, "zero": 0, "plus64": size + 64}[p["api_size"]]
    api.abi_major, api.abi_minor = p["api_major"], p["api_minor"]
    api.name = {"match": b"fuzz", "other": b"zzuf", None: None}[p["api_name"]]
    api.variant = {"match": b"v1", "other": b"v9", None: None}[p["api_variant"]]
    api.required_features = p["api_features"]
    if p["init"] == "fails":
        fake.fail["init"] = fk.KT_ERROR_INTERNAL
    elif p["init"] == "null":
        api.init = fk.INIT()
    api.num_methods = p["num_methods"]
    msize = C.sizeof(fk.MethodKernels)
    k.struct_size = {"exact": msize, "before-forward": fk.MethodKernels.moe_forward.offset, "tiny": 12, "zero": 0,
                     "plus64": msize + 64}[p["m_size"]]
    k.method, k.layout_id, k.kernel_id = p["m_method"], p["m_layout"], p["m_kernel"]
    k.gate_up_block, k.down_block = p["gate_up_block"], p["down_block"]
    if p["declines"] is not None:
        fake.declines_fn = fk.DECLINES(lambda cfg, tokens, v=p["declines"]: v)
        k.declines = fake.declines_fn
    for bit, entry in enumerate(NULLABLE):
        if p["null"] >> bit & 1:
            setattr(k, entry, getattr(fk, {"packed_expert_bytes": "PACKED_BYTES", "pack_expert": "PACK",
                                           "activation_row_bytes": "ROW_BYTES", "quantize_activations": "QUANTIZE",
                                           "gate_up_tile": "TILE", "down_tile": "TILE", "moe_forward": "FORWARD",
                                           "declines": "DECLINES"}[entry])())
    for entry, field in (("pack_expert", "fail_pack"), ("quantize_activations", "fail_quantize"),
                         ("gate_up_tile", "fail_gate_up"), ("down_tile", "fail_down"), ("moe_forward", "fail_forward")):
        if p[field]:
            fake.fail[entry] = p[field]
    return fake


def _run(p: dict, fake) -> None:
    s = _state
    np = s["np"]
    found = s["discovery"]._load(_entry_point(p))
    sel = s["selection"].Selector((found, *s["others"]), s["host"]())
    sel.explain()
    s["moe"].selector = lambda: sel
    layer = s["moe"].MoE(num_experts=4, top_k=2, hidden_size=32, intermediate_size=16, method="FP32", backend="fuzz",
                         max_tokens=16)
    honest = not fake.lying and not any(fake.fail.values())
    _expect_message(fake, lambda: layer.load(*s["weights"]))
    t = p["tokens"]
    x, ids, wt = s["x"][:t], s["ids"][:t], s["wt"][:t]
    want = s["reference"](x, *s["weights"], ids, wt)
    out = _expect_message(fake, lambda: layer(x, ids, wt))
    if honest and np.abs(out - want).max() > 1e-4 * max(1.0, np.abs(want).max()):
        raise _harness.Crash(f"an honest plugin's forward differs from NumPy's by {np.abs(out - want).max()}")
    fake.fail.clear()                                # the layer must still work once the faults stop
    if not fake.lying:
        out = layer(x, ids, wt)
        if np.abs(out - want).max() > 1e-4 * max(1.0, np.abs(want).max()):
            raise _harness.Crash("after a failed call the layer computes wrong outputs")


def _expect_message(fake, fn):
    """fn(); a failure caused by a plugin status must carry the plugin's message."""
    before = len(fake.failed)
    try:
        return fn()
    except (RuntimeError, ValueError, MemoryError):
        # Not bound to a name: this frame holding the exception that holds this frame would be a
        # reference cycle keeping the layer (and its packed weights) alive until the next gc.
        new = fake.failed[before:]
        if new and "failed on purpose" not in str(sys.exc_info()[1]) and not isinstance(sys.exc_info()[1],
                                                                                           _state["KTError"]):
            raise _harness.Crash(f"{sys.exc_info()[1]!r} lost the plugin's message for {new[0]}") from None
        raise


def check(data: bytes) -> None:
    _setup()
    p = decode(data)
    fake = _fake(p)
    _state["module"].backend_api = lambda variant: fake.capsule()
    try:
        _harness.verdict(lambda: _run(p, fake), (_state["KTError"],), "a plugin handshake and forward",
                         boundary=((RuntimeError, ValueError, MemoryError), ("kt_core/moe.py",)))
    finally:
        _state["moe"].selector = _state["selector"]      # the process's own selection again
        _state["selection"].reset()


if __name__ == "__main__":
    _harness.main(lambda: (_setup(), check)[1])
