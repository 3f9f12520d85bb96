"""`kt convert` and converted folders: codes identical to quantizing at load, resumable,
atomic (no file that looks valid after a failure), the source never touched, and a clear
error for every mismatch between a folder and what loads it."""

import errno
import hashlib
import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from typer.testing import CliRunner  # noqa: E402

from kt.cli.app import app  # noqa: E402
from kt.testing.checkpoints import write_checkpoint  # noqa: E402
from kt.weights import conversion as convert_module  # noqa: E402
from kt.weights import convert  # noqa: E402
from kt.weights.converted import MANIFEST  # noqa: E402
from kt_core import KTError, KTMoEWrapper, WeightsError  # noqa: E402
from kt_core.backends.selection import selector  # noqa: E402

from conftest import run_python  # noqa: E402

H, I, E, TOP_K = 128, 64, 8, 2
BACKENDS = sorted({c.backend for c in selector().candidates if c.runnable and "INT4" in c.methods})


def wrapper(path, layer, method, **kw):
    return KTMoEWrapper(layer_idx=layer, num_experts=E, num_experts_per_tok=TOP_K, hidden_size=H,
                        moe_intermediate_size=I, weight_path=str(path), chunked_prefill_size=16, method=method, **kw)


def forward(kt):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(7)])
    return kt.forward(x, ids, torch.rand(7, TOP_K, generator=g))


def tree_digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    write_checkpoint(path, "deepseek_v3", hidden=H, intermediate=I, experts=E, layers=4, dense_prefix=1)
    return path


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("method", "group", "zp"), [("INT8", 0, False), ("INT4", 32, False), ("INT4", 64, True)])
def test_converted_folder_loads_exactly_like_quantizing_at_load(tmp_path, model, backend, method, group, zp):
    before = tree_digest(model)
    out = convert(model, tmp_path / "out", method=method, group_size=group or None, zero_point=zp)
    assert tree_digest(model) == before, "kt convert must never modify its source"
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["complete"] and sorted(manifest["layers"]) == ["1", "2", "3"]
    for layer in (1, 3):
        # The folder fixes group and zero point: the wrapper takes them from the manifest.
        from_folder = wrapper(out, layer, method, backend=backend)
        from_folder.load_weights()
        online = wrapper(model, layer, method, backend=backend, cpu_save=True, group_size=group, zero_point=zp)
        online.load_weights()
        assert torch.equal(forward(from_folder), forward(online))


def test_fp8_sources_convert_through_their_dequantized_weights(tmp_path):
    src = tmp_path / "fp8"
    write_checkpoint(src, "deepseek_v3", hidden=H, intermediate=I, experts=E, layers=2, quant="fp8")
    out = convert(src, tmp_path / "out", method="INT4", group_size=32)
    a = wrapper(out, 1, "INT4", backend="reference")
    a.load_weights()
    b = wrapper(src, 1, "INT4", backend="reference", cpu_save=True, group_size=32)
    b.load_weights()
    assert torch.equal(forward(a), forward(b))


def test_interrupted_conversion_resumes_to_the_same_files(tmp_path, model, monkeypatch):
    straight = convert(model, tmp_path / "straight", method="INT4", group_size=32)
    real_save, calls = convert_module._save_layer, []

    def interrupted(path, tensors, metadata):
        calls.append(path)
        if len(calls) == 2:
            real_save(path, tensors, metadata)          # the file is written, then the process dies
            raise KeyboardInterrupt
        real_save(path, tensors, metadata)

    monkeypatch.setattr(convert_module, "_save_layer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(model, tmp_path / "resumed", method="INT4", group_size=32)
    resumed = tmp_path / "resumed"
    assert sorted(p.name for p in resumed.iterdir()) == ["config.json", MANIFEST, "layer-0001.safetensors"]
    with pytest.raises(KTError, match=r"unfinished conversion \(1 of 3 layers\); run `kt convert ... --resume`"):
        wrapper(resumed, 1, "INT4", backend="reference").load_weights()
    with pytest.raises(KTError, match="already holds a kt conversion; pass --resume"):
        convert(model, resumed, method="INT4", group_size=32)
    with pytest.raises(KTError, match="cannot resume .*group_size is 32, this conversion's is 64"):
        convert(model, resumed, method="INT4", group_size=64, resume=True)
    monkeypatch.setattr(convert_module, "_save_layer", real_save)
    convert(model, resumed, method="INT4", group_size=32, resume=True)
    layers = [f"layer-{i:04d}.safetensors" for i in (1, 2, 3)]
    assert {n: d for n, d in tree_digest(resumed).items() if n in layers} == \
        {n: d for n, d in tree_digest(straight).items() if n in layers}


def test_a_full_disk_leaves_no_file_that_looks_valid(tmp_path, model, monkeypatch):
    real_save = convert_module._save_layer

    def disk_full(path, tensors, metadata):
        if path.name.startswith(".layer-0002"):
            path.write_bytes(b"\0" * 100)            # half a file, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(path, tensors, metadata)

    monkeypatch.setattr(convert_module, "_save_layer", disk_full)
    with pytest.raises(KTError, match="writing .*layer-0002.safetensors failed: the disk is full. 1 layers are complete; "
                                      "make room and run the same kt convert with --resume"):
        convert(model, tmp_path / "out", method="INT8")
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["config.json", MANIFEST, "layer-0001.safetensors"]
    assert not json.loads((tmp_path / "out" / MANIFEST).read_text())["complete"]


def test_folder_mismatches_are_refused(tmp_path, model):
    out = convert(model, tmp_path / "out", method="INT4", group_size=32)
    with pytest.raises(WeightsError, match="holds INT4 codes .*the layer asks for INT8"):
        wrapper(out, 1, "INT8", backend="reference").load_weights()
    with pytest.raises(WeightsError, match=r"holds INT4 codes \(group 32.*asks for INT4 \(group 64"):
        wrapper(out, 1, "INT4", backend="reference", group_size=64).load_weights()
    with pytest.raises(WeightsError, match="has no layer 0; its MoE layers are"):
        wrapper(out, 0, "INT4", backend="reference").load_weights()

    # A damaged layer file.
    layer = out / "layer-0002.safetensors"
    data = layer.read_bytes()
    layer.write_bytes(data[:-10])
    with pytest.raises(KTError, match="should hold .* bytes, found .*: the converted folder is damaged"):
        wrapper(out, 2, "INT4", backend="reference").load_weights()
    layer.write_bytes(data)

    # A manifest of another format version.
    manifest = json.loads((out / MANIFEST).read_text())
    (out / MANIFEST).write_text(json.dumps(manifest | {"format_version": 99}))
    with pytest.raises(KTError, match="converted with format version 99; this kt reads version 1"):
        wrapper(out, 1, "INT4", backend="reference").load_weights()
    (out / MANIFEST).write_text(json.dumps(manifest))

    # The source changed after conversion.
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"rope_theta": 1.0}))
    try:
        with pytest.raises(KTError, match="source model .* changed since .* was converted"):
            wrapper(out, 1, "INT4", backend="reference").load_weights()
    finally:
        (model / "config.json").write_text(json.dumps(config, indent=1))


def test_bad_conversion_requests(tmp_path, model):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(KTError, match="is not empty and is not a kt converted folder"):
        convert(model, tmp_path / "busy", method="INT8")
    with pytest.raises(KTError, match="kt convert writes INT8 or INT4 codes, or BF16, FP8, RAWINT4 packed copies "
                                      r"\(--packed\); got method 'AWQ'"):
        convert(model, tmp_path / "x", method="AWQ")
    with pytest.raises(KTError, match="FP8 experts load as the source stores them; `kt convert --method FP8` only "
                                      "makes packed copies of them, so it needs --packed"):
        convert(model, tmp_path / "x", method="FP8")
    with pytest.raises(KTError, match="stores BF16 experts; packed copies of method FP8 need a checkpoint that stores "
                                      "FP8 experts"):
        convert(model, tmp_path / "x", method="FP8", packed=True)
    with pytest.raises(KTError, match="INT4 group size must be one of"):
        convert(model, tmp_path / "x", method="INT4", group_size=48)
    with pytest.raises(KTError, match="never into the source model folder"):
        convert(model, model, method="INT8")
    raw = tmp_path / "kimi"
    write_checkpoint(raw, "kimi_k2", hidden=H, intermediate=I, experts=E, layers=2, quant="rawint4")
    with pytest.raises(KTError, match="stores RAWINT4 experts; kt convert reads bf16/fp16/fp32 or FP8"):
        convert(raw, tmp_path / "y", method="INT4")


def test_kt_convert_command(tmp_path, model):
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(model), str(tmp_path / "out"), "--method", "INT4", "--group-size", "64"])
    assert result.exit_code == 0, result.output
    assert "peak RAM about" in result.output and "converted folder ready" in result.output
    kt = wrapper(tmp_path / "out", 2, "INT4", backend="reference")
    kt.load_weights()
    assert torch.isfinite(forward(kt)).all()
    again = runner.invoke(app, ["convert", str(model), str(tmp_path / "out"), "--group-size", "64"])
    assert again.exit_code == 1 and "already holds a kt conversion" in " ".join(again.output.split())


@pytest.mark.parametrize(("args", "message"), [
    (["--threads", "-3"], "Invalid value for '--threads'"),
    (["--method", "INT8", "--group-size", "64"], "--group-size applies to INT4 only"),
    (["--method", "INT8", "--zero-point"], "--zero-point applies to INT4 only"),
    (["--method", "INT4", "--group-size", "48"], "INT4 group size must be one of (32, 64, 128), got 48"),
])
def test_kt_convert_refuses_bad_flags_and_writes_nothing(tmp_path, model, args, message):
    r = run_python(f"import sys; from kt_core.cli import main; "
                   f"sys.exit(main(['convert', {str(model)!r}, {str(tmp_path / 'out')!r}, *{args!r}]))")
    assert r.returncode in (1, 2) and message in r.stdout + r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_kt_convert_without_torch_leaves_no_folder(tmp_path, model):
    code = (f"import sys; sys.modules['torch'] = None; from kt_core.cli import main; "
            f"sys.exit(main(['convert', {str(model)!r}, {str(tmp_path / 'out')!r}]))")
    r = run_python(code)
    assert r.returncode == 1 and "needs PyTorch: pip install torch" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "out").exists()


def test_int4_group_defaults_to_the_largest_dividing_both_sizes(tmp_path):
    """GPT-OSS's hidden 2880 is no multiple of 128: kt-kernel takes such layers, so kt picks 64."""
    write_checkpoint(tmp_path / "m", "qwen3_moe", hidden=320, intermediate=96, experts=4, layers=1, dense_prefix=0)
    out = convert(tmp_path / "m", tmp_path / "out", method="INT4")
    assert json.loads((out / "kt-manifest.json").read_text())["group_size"] == 32


def test_converted_files_take_the_umask(tmp_path, model):
    old = os.umask(0o022)
    try:
        out = convert(model, tmp_path / "out", method="INT8")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
    assert set(modes.values()) == {0o644}, modes


@pytest.mark.parametrize("model_type", ["deepseek_v2", "kimi_k2", "qwen2_moe", "qwen3_moe", "qwen3_vl_moe", "mixtral",
                                        "minimax_m2", "glm4_moe", "olmoe"])
def test_every_family_converts_and_loads(tmp_path, model_type):
    from kt_core.testing.reference import moe_reference, relative_error

    truth = write_checkpoint(tmp_path / "m", model_type, hidden=H, intermediate=I, experts=E, layers=2)
    out = convert(tmp_path / "m", tmp_path / "out", method="INT8")
    layer = max(truth)
    kt = wrapper(out, layer, "INT8", backend="reference")
    kt.load_weights()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(7)])
    w = torch.rand(7, TOP_K, generator=g)
    expect = moe_reference(x.double().numpy(), *truth[layer], ids.numpy(), w.double().numpy())
    # Against the unquantized weights per-channel int8 costs 3.5e-2 - 6.5e-2 of the output RMS
    # (max error / RMS, docs/backends.md); 1e-1 leaves margin, a wrong tensor gives ~1.
    assert relative_error(kt.forward(x, ids, w).double().numpy(), expect) < 1e-1


@pytest.mark.parametrize("model_type, settings, reference", [
    ("gemma4_text", {}, {"gate_activation": "gelu_tanh"}),
    ("deepseek_v4", {"swiglu_limit": 0.5}, {"swiglu_limit": 0.5}),
])
def test_converted_folder_keeps_its_experts_activation(tmp_path, model_type, settings, reference):
    """A converted folder keeps its source's config.json: a wrapper made without the experts'
    activation (kt-kernel's API has no word for GELU-tanh) takes it from the folder, and a layer
    made for plain SiLU is refused at load naming it. GPT-OSS (expert biases) is refused by kt
    convert, which does not store biases."""
    from kt.weights import load_layer
    from kt_core import MoE
    from kt_core.testing.quantize import dequantized_weights
    from kt_core.testing.reference import moe_reference, relative_error

    truth = write_checkpoint(tmp_path / "m", model_type, hidden=H, intermediate=I, experts=E, layers=2, dense_prefix=0)
    if settings:
        cfg = json.loads((tmp_path / "m" / "config.json").read_text())
        (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, **settings}))
    out = convert(tmp_path / "m", tmp_path / "out", method="INT8")
    kt = wrapper(out, 1, "INT8", backend="reference")
    kt.load_weights()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, H, generator=g) * 3
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(7)])
    w = torch.rand(7, TOP_K, generator=g)
    stored = dequantized_weights("INT8", *truth[1])   # the codes the folder holds, as floats
    expect = moe_reference(x.double().numpy(), *stored, ids.numpy(), w.double().numpy(), **reference)
    plain = moe_reference(x.double().numpy(), *stored, ids.numpy(), w.double().numpy())
    assert relative_error(plain, expect) > 0.05
    assert relative_error(kt.forward(x, ids, w).double().numpy(), expect) < 1e-5   # the reference backend: f32 activations
    silu = MoE(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, method="INT8", backend="reference")
    with pytest.raises(WeightsError, match=f"{model_type} experts compute .*create layer 1 with"):
        load_layer(silu, out, 1)
    write_checkpoint(tmp_path / "oss", "gpt_oss", hidden=H, intermediate=I, experts=E, layers=2)
    with pytest.raises(KTError, match="gpt_oss model, whose experts carry biases, which a kt converted folder does not"):
        convert(tmp_path / "oss", tmp_path / "oss-out", method="INT8")
