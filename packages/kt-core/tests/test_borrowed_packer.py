"""Plugin ABI 1.3: a method with no packer computes on a layout another backend packs (as
kt-backend-blis does on kt-backend-avx's). The core packs with that backend, hands it the
batches the borrower declines, keeps one copy of the weights, and refuses the arrangement
clearly where it cannot work."""

from __future__ import annotations

import sys
import types

import fake_kernels as fk
import numpy as np
import pytest

import kt_core
from kt_core.backends import BackendDescriptor, Tier, Variant, selection
from kt_core.backends.discovery import Discovered
from kt_core.errors import BackendError
from kt_core.testing.reference import moe_reference, random_moe, random_routing, relative_error

E, H, I, TOP_K, TOKENS = 8, 64, 32, 2, 24


@pytest.fixture
def install(monkeypatch):
    """install(fake, ...) makes a selector holding exactly these fake backends."""
    def go(*fakes: tuple[fk.FakeBackend, Tier]):
        found = []
        for fake, tier in fakes:
            name = fake._strings[0].decode()
            module = types.ModuleType(f"{name}_native")
            module.backend_api = lambda variant, fake=fake: fake.capsule()
            monkeypatch.setitem(sys.modules, module.__name__, module)
            d = BackendDescriptor(name=name, abi_version=(fake.api.abi_major, fake.api.abi_minor), tier=tier,
                                  variants=(Variant("v1", module=module.__name__, methods=("FP32",)),))
            found.append(Discovered(f"{name} = test", d, None))
        sel = selection.Selector(tuple(found), kt_core.host())
        monkeypatch.setattr(kt_core.moe, "selector", lambda: sel)
        return sel
    return go


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(13)
    w = random_moe(rng, E, H, I)
    x = rng.standard_normal((TOKENS, H)).astype(np.float32)
    ids, wt = random_routing(rng, TOKENS, E, TOP_K)
    return w, x, ids, wt, moe_reference(x, *w, ids, wt)


def layer(**kw):
    return kt_core.MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method="FP32", **kw)


def test_the_packer_is_borrowed_and_takes_the_declined_batches(install, data):
    packer = fk.FakeBackend(name="packer")
    borrower = fk.FakeBackend(name="borrower", abi=(1, 3), packs=False, declines_below=8)
    install((packer, Tier.GENERIC_SIMD), (borrower, Tier.VENDOR_LIBRARY))
    w, x, ids, wt, want = data
    moe = layer()
    assert moe.backend == "borrower/v1"
    assert moe.packer_backend == "packer/v1" and moe.small_batch_backend == "packer/v1"
    moe.load(*w)
    assert packer.calls["pack_expert"] == E and borrower.calls["pack_expert"] == 0
    assert moe.packed_bytes == E * 3 * H * I * 4      # one copy, the packer's
    assert relative_error(moe(x, ids, wt), want) < 1e-5
    assert borrower.calls["gate_up_tile"] > 0 and packer.calls["gate_up_tile"] == 0
    assert relative_error(moe(x[:3], ids[:3], wt[:3]), want[:3]) < 1e-5   # declined: the packer's kernels
    assert packer.calls["gate_up_tile"] > 0
    assert moe.kernel_id_for(3) == moe.kernel_id_for(TOKENS) == "moe.f32.fake"


def test_a_borrower_can_take_a_matrix_engines_declined_batches(install, data):
    """amx declining decode, blis (which packs nothing: no byte count of its own) ranked next:
    the borrower serves the small batches on the packed bytes it reads. Its missing
    packed_expert_bytes was once called: a null function pointer, a segfault."""
    engine = fk.FakeBackend(name="engine", declines_below=8)
    borrower = fk.FakeBackend(name="borrower", abi=(1, 3), packs=False)
    install((engine, Tier.MATRIX_ENGINE), (borrower, Tier.VENDOR_LIBRARY), (fk.FakeBackend(name="packer"), Tier.GENERIC_SIMD))
    w, x, ids, wt, want = data
    moe = layer()
    assert moe.backend == "engine/v1" and moe.small_batch_backend == "borrower/v1"
    moe.load(*w)
    assert relative_error(moe(x[:3], ids[:3], wt[:3]), want[:3]) < 1e-5
    assert borrower.calls["gate_up_tile"] > 0 and engine.calls["gate_up_tile"] == 0


def test_without_a_backend_that_packs_the_layout_the_layer_is_refused(install):
    install((fk.FakeBackend(name="borrower", abi=(1, 3), packs=False, declines_below=8), Tier.VENDOR_LIBRARY))
    with pytest.raises(BackendError, match=r"borrower/v1 computes method FP32 on layout fake-f32-rowmajor-v1 but "
                                           r"packs nothing itself, and no runnable backend here packs that layout"):
        layer()


def test_a_plugin_older_than_abi_1_3_must_pack(install):
    install((fk.FakeBackend(name="packer"), Tier.GENERIC_SIMD),
            (fk.FakeBackend(name="old", abi=(1, 2), packs=False), Tier.VENDOR_LIBRARY))
    with pytest.raises(BackendError, match=r"lacks mandatory entries \(names, packer — or, from ABI 1.3"):
        layer(backend="old")
