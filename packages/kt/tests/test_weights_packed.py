"""Packed copies in converted folders (weights/packed.py): a layer stored in a backend's
packed layout loads by copy into the very bytes packing the codes gives, for any expert map;
hosts with another layout fall back to the codes; damaged packed files are clear errors."""

import json
import os
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from typer.testing import CliRunner  # noqa: E402

import kt_core  # noqa: E402
from kt.cli.app import app  # noqa: E402
from kt.testing.checkpoints import write_checkpoint  # noqa: E402
from kt.weights import Checkpoint, ConvertedFolder, add_packed, convert, load_layer  # noqa: E402
from kt.weights import packed as packed_module  # noqa: E402
from kt.weights import packing as packing_module  # noqa: E402
from kt.weights.converted import MANIFEST  # noqa: E402
from kt_core import KTError, KTMoEWrapper  # noqa: E402
from kt_core.backends.selection import selector  # noqa: E402

H, I, E, TOP_K = 128, 128, 8, 2
# Every runnable backend packing the converted methods, the reference one included.
BACKENDS = sorted({c.backend for c in selector().candidates if c.runnable and "INT4" in c.methods})


def moe(folder, backend, **kw):
    return kt_core.MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method=folder.method,
                       group_size=folder.group_size, zero_point=folder.zero_point, backend=backend, max_tokens=16, **kw)


def forward(m):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(9, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(9)])
    return m.forward(x, ids, torch.rand(9, TOP_K, generator=g))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    write_checkpoint(path, "qwen3_moe", hidden=H, intermediate=I, experts=E, layers=3, dense_prefix=0)
    return path


@pytest.fixture(scope="module", params=[("INT8", 0, False), ("INT4", 32, True), ("INT4", 128, False)],
                ids=["int8", "int4-g32-asym", "int4-g128"])
def converted(request, model, tmp_path_factory):
    method, group, zp = request.param
    return convert(model, tmp_path_factory.mktemp("conv") / "out", method=method, group_size=group or None,
                   zero_point=zp)


@pytest.mark.parametrize("route", ["mapped", "copied"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_layers_load_the_bytes_packing_the_codes_gives(converted, backend, route, tmp_path, monkeypatch):
    monkeypatch.setenv("KT_MAP_WEIGHTS", "1" if route == "mapped" else "0")
    folder = tmp_path / "copy"           # packed files go into a copy, not the shared fixture
    folder.mkdir()
    for f in converted.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    layout = add_packed(folder, backend=backend)
    conv = ConvertedFolder.open(folder)
    entry = conv.manifest["packed"][layout]
    assert sorted(entry["layers"]) == ["0", "1", "2"]
    # A permutation with a GPU-resident slot: the packed copy is in logical order, so the
    # map picks offsets, and skipped slots are not read.
    p2l = [3, 1, 7, 0, 2, 6, 5, 4]
    mask = [False, False, True, False, False, False, False, False]
    from_codes, from_packed = moe(conv, backend, gpu_experts_mask=mask), moe(conv, backend, gpu_experts_mask=mask)
    assert from_codes.layout_id == layout
    for layer in (0, 2):
        # The codes route: the same folder without its packed copies.
        codes_only = ConvertedFolder(conv.path, {k: v for k, v in conv.manifest.items() if k != "packed"})
        assert load_layer(from_codes, codes_only, layer, p2l) == "packed at load"
        assert load_layer(from_packed, conv, layer, p2l) == route
        for slot in range(E):
            if mask[slot]:
                assert not from_packed._layer.expert_loaded(slot)
                continue
            assert from_packed.packed_expert(slot) == from_codes.packed_expert(slot), f"layer {layer} slot {slot}"
        assert torch.equal(forward(from_packed), forward(from_codes))


def test_the_wrapper_loads_packed_folders_and_hosts_with_another_layout_use_the_codes(model, tmp_path):
    out = convert(model, tmp_path / "out", method="INT4", group_size=32, packed=True)
    (layout, entry), = ConvertedFolder.open(out).manifest["packed"].items()
    assert entry["expert_stride"] % 4096 == 0 and entry["expert_stride"] - entry["expert_bytes"] < 4096
    kw = dict(layer_idx=1, num_experts=E, num_experts_per_tok=TOP_K, hidden_size=H, moe_intermediate_size=I,
              weight_path=str(out), chunked_prefill_size=16, method="INT4")
    fast = KTMoEWrapper(**kw)
    fast.load_weights()
    online = KTMoEWrapper(**(kw | {"weight_path": str(model)}), cpu_save=True, group_size=32)
    online.load_weights()
    g = torch.Generator().manual_seed(1)
    x, ids, w = torch.randn(5, H, generator=g), torch.randint(0, E, (5, TOP_K), generator=g), torch.rand(5, TOP_K)
    assert torch.equal(fast.forward(x, ids, w), online.forward(x, ids, w))
    # The folder is replaced by rename while the mapped layer serves: it keeps its pages.
    for f in out.glob("*.packed"):
        f.rename(f.with_suffix(".old"))
        f.write_bytes(b"")
    assert torch.equal(fast.forward(x, ids, w), online.forward(x, ids, w))
    for f in out.glob("*.old"):
        f.rename(f.with_suffix(".packed"))
    # The reference backend packs another layout: it reads the codes, with the same result.
    conv = ConvertedFolder.open(out)
    ref = moe(conv, "reference")
    assert ref.layout_id != layout
    assert load_layer(ref, conv, 1) == "packed at load"


def test_resume_and_interrupted_packing_keep_what_is_whole(model, tmp_path, monkeypatch):
    out = convert(model, tmp_path / "out", method="INT8")
    real, calls = packing_module.write_atomically, []

    def interrupted(path, write):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt          # dies while writing the second layer
        real(path, write)

    monkeypatch.setattr(packing_module, "write_atomically", interrupted)
    with pytest.raises(KeyboardInterrupt):
        add_packed(out)
    monkeypatch.setattr(packing_module, "write_atomically", real)
    (layout, entry), = json.loads((out / MANIFEST).read_text())["packed"].items()
    assert sorted(entry["layers"]) == ["0"]
    first = (out / entry["layers"]["0"]["file"]).read_bytes()
    # `kt convert --resume --packed` on the finished folder keeps layer 0 and packs the rest.
    convert(model, out, method="INT8", resume=True, packed=True)
    entry = json.loads((out / MANIFEST).read_text())["packed"][layout]
    assert sorted(entry["layers"]) == ["0", "1", "2"]
    assert (out / entry["layers"]["0"]["file"]).read_bytes() == first
    assert not list(out.glob(".*.partial"))


def test_damaged_packed_files_and_manifests_are_clear_errors(model, tmp_path):
    out = convert(model, tmp_path / "out", method="INT4", group_size=64, packed=True)
    manifest = json.loads((out / MANIFEST).read_text())
    (layout, entry), = manifest["packed"].items()
    conv = ConvertedFolder.open(out)
    m = moe(conv, None)
    path = out / entry["layers"]["1"]["file"]
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    with pytest.raises(KTError, match=rf"{path.name} should hold {len(data)} bytes .*found {len(data) - 1}: the "
                                      "converted folder is damaged"):
        load_layer(m, conv, 1)
    path.unlink()
    with pytest.raises(KTError, match="found missing"):
        load_layer(m, conv, 1)
    path.write_bytes(data)
    # Packed by kernels with another expert size: not this layout's bytes, so the codes load.
    other = json.loads(json.dumps(manifest))
    other["packed"][layout]["expert_bytes"] += 64
    assert load_layer(m, ConvertedFolder(out, other), 1) == "packed at load"
    for bad, field in ((["x"], "packed"), ({layout: {"layers": {}}}, f"packed['{layout}']"),
                       ({layout: {"expert_bytes": 8, "expert_stride": 8, "layers": {}}}, f"packed['{layout}']"),
                       ({layout: {"expert_bytes": 8, "expert_stride": 64, "layers": {"1": {"file": "../x", "bytes": 8}}}},
                        f"packed['{layout}'].layers['1'].file")):
        (out / MANIFEST).write_text(json.dumps(manifest | {"packed": bad}))
        with pytest.raises(KTError, match=rf"{MANIFEST}: {re.escape(field)} should be"):
            ConvertedFolder.open(out)


@pytest.mark.parametrize("route", ["map_packed", "load_packed"])
def test_short_files_misaligned_offsets_and_bad_slots_are_refused(model, tmp_path, route):
    out = convert(model, tmp_path / "out", method="INT8")
    conv = ConvertedFolder.open(out)
    m = moe(conv, None)
    install = getattr(m, route)
    short = tmp_path / "short.packed"
    short.write_bytes(b"\1" * (m.expert_bytes + 128))
    fd = os.open(short, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match=rf"the packed file ends at byte {m.expert_bytes + 128}; expert 1 needs "
                                             rf"bytes up to {m.expert_bytes + 64 + m.expert_bytes}"):
            install({0: 0, 1: m.expert_bytes + 64}, fd)
        assert not m._layer.expert_loaded(0), "a failed batch installs nothing"
        with pytest.raises(ValueError, match="expert index 8 outside"):
            install({8: 0}, fd)
        if route == "map_packed":
            with pytest.raises(ValueError, match="start at byte 8, not on a 64-byte boundary"):
                install({0: 8}, fd)
        install({0: 0}, fd)
        assert m.packed_expert(0) == b"\1" * m.expert_bytes
    finally:
        os.close(fd)
    with pytest.raises(RuntimeError, match="Bad file descriptor"):
        install({1: 0}, fd)
    with pytest.raises(ValueError, match="is not loaded"):
        m.packed_expert(1)


def test_kt_map_weights_setting(monkeypatch):
    one_node = len({node for node, _ in kt_core.pool.info().groups}) == 1
    for value, want in (("1", True), ("no", False), ("auto", one_node)):
        monkeypatch.setenv("KT_MAP_WEIGHTS", value)
        assert packed_module.map_weights() is want
    monkeypatch.setenv("KT_MAP_WEIGHTS", "sometimes")
    with pytest.raises(KTError, match="KT_MAP_WEIGHTS must be 1, 0 or auto; found 'sometimes'"):
        packed_module.map_weights()


def test_kt_convert_packed_command(model, tmp_path):
    result = CliRunner().invoke(app, ["convert", str(model), str(tmp_path / "out"), "--method", "INT8", "--packed"])
    assert result.exit_code == 0, result.output
    assert "packing 3 of 3 layers in" in result.output
    assert ConvertedFolder.open(tmp_path / "out").manifest["packed"]


@pytest.mark.parametrize(("model_type", "quant", "method"), [("qwen3_moe", "bf16", "BF16"), ("deepseek_v3", "fp8", "FP8"),
                                                             ("kimi_k2", "rawint4", "RAWINT4")])
def test_packed_copies_of_a_checkpoints_own_format(tmp_path, model_type, quant, method):
    """BF16 / FP8 / RAWINT4 load as the checkpoint stores them; `kt convert --method M --packed`
    keeps no codes, only packed copies, and falls back to the source for other layouts."""
    src = tmp_path / "src"
    write_checkpoint(src, model_type, hidden=H, intermediate=I, experts=E, layers=3, dense_prefix=1, quant=quant)
    out = convert(src, tmp_path / "out", method=method, packed=True)
    conv = ConvertedFolder.open(out)
    (layout, entry), = conv.manifest["packed"].items()
    assert conv.manifest["layers"] == {} and not list(out.glob("*.safetensors"))
    assert sorted(entry["layers"]) == [str(L) for L in Checkpoint(src).spec.moe_layers]

    def layer(backend=None):
        return kt_core.MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method=method,
                           backend=backend, max_tokens=16)

    fast, direct = layer(), layer()
    assert load_layer(fast, conv, 2) in ("mapped", "copied")
    assert load_layer(direct, Checkpoint(src), 2) == "packed at load"
    assert all(fast.packed_expert(e) == direct.packed_expert(e) for e in range(E))
    assert torch.equal(forward(fast), forward(direct))
    kw = dict(layer_idx=2, num_experts=E, num_experts_per_tok=TOP_K, hidden_size=H, moe_intermediate_size=I,
              chunked_prefill_size=16, method=method)
    a, b = KTMoEWrapper(**kw, weight_path=str(out)), KTMoEWrapper(**kw, weight_path=str(src))
    a.load_weights()
    b.load_weights()
    assert torch.equal(forward(a), forward(b))
    # Kernels of another layout read the source model, while it is there.
    ref = layer("reference")
    assert ref.layout_id != layout
    assert load_layer(ref, conv, 2) == "packed at load"
    src.rename(tmp_path / "moved")
    conv = ConvertedFolder.open(out)
    with pytest.raises(KTError, match=rf"holds {method} experts only as packed copies \({layout}\) and none of layer 2 "
                                      rf"in this host's layout {ref.layout_id}; its source model .* is gone"):
        load_layer(ref, conv, 2)
    assert load_layer(layer(), conv, 1) in ("mapped", "copied")
