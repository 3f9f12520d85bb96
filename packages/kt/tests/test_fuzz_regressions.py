"""The fuzz targets (fuzz/, run for a bounded time by `nox -s fuzz`) on their seed corpora and
on every input that ever crashed one (fuzz/regressions/<target>/), plus a readable test of
each fix: bad input must always end in the reader's documented error, naming what was
expected and what was found."""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("gguf")

FUZZ = Path(__file__).resolve().parents[3] / "fuzz"
sys.path.insert(0, str(FUZZ))

import _harness  # noqa: E402
import seeds  # noqa: E402

from kt_core.errors import KTError  # noqa: E402

TARGETS = seeds.TARGETS


def target(name):
    return importlib.import_module(f"fuzz_{name}")


@pytest.fixture(scope="module")
def corpus():
    return {}


def seeds_of(corpus, name):
    if name not in corpus:
        corpus[name] = seeds.build(name)
    return corpus[name]


@pytest.mark.parametrize("name", TARGETS)
def test_seeds_pass_their_target(corpus, name):
    built = seeds_of(corpus, name)
    assert len(built) >= 3
    for data in built.values():
        target(name).check(data)          # raises _harness.Crash on an undocumented failure


@pytest.mark.parametrize("name", ["gguf", "checkpoint", "converted"])
def test_seeds_are_read_without_any_error(corpus, name, tmp_path):
    """The seeds reach the end of each reader (an error there would make the fuzzer explore
    only the refusal path)."""
    t = target(name)
    t._setup()
    for seed, data in seeds_of(corpus, name).items():
        if name == "gguf":
            path = tmp_path / f"{seed}.gguf"
            path.write_bytes(data)
            t._read(path)
        else:
            folder = tmp_path / seed
            folder.mkdir()
            for file, content in _harness.unpack_files(t.FILES, data).items():
                (folder / file).write_bytes(content)
            t._read(folder)


REGRESSIONS = [(t, p) for t in TARGETS for p in _harness.regression_inputs(t)]


@pytest.mark.parametrize(("name", "path"), REGRESSIONS, ids=[f"{t}/{p.name}" for t, p in REGRESSIONS])
def test_inputs_that_once_crashed(name, path):
    if "hang" in path.name:
        # A hang that came back must fail the test, not stall the suite: a child with a deadline.
        import subprocess

        code = (f"import sys; sys.path.insert(0, {str(FUZZ)!r}); import fuzz_{name} as t; "
                f"t.check(open({str(path)!r}, 'rb').read())")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        return
    target(name).check(path.read_bytes())


def test_the_harness_calls_an_undocumented_exception_a_crash():
    with pytest.raises(_harness.Crash, match="raised KeyError: 'x'.*documented: KTError"):
        _harness.verdict(lambda: {}["x"], (KTError,), "reading")
    with pytest.raises(_harness.Crash, match="ValueError"):    # a ValueError from outside the boundary files
        _harness.verdict(lambda: int("x"), (KTError,), "reading", boundary=((ValueError,), ("kt_core/moe.py",)))
    assert _harness.verdict(lambda: (_ for _ in ()).throw(KTError("no")), (KTError,), "reading") is None


def test_pack_files_round_trip_and_truncation():
    names = ("a", "b")
    data = _harness.pack_files(names, {"a": b"123", "b": b"xy"})
    assert _harness.unpack_files(names, data) == {"a": b"123", "b": b"xy"}
    assert _harness.unpack_files(names, data[:-1]) == {"a": b"123", "b": b"x"}


def test_seed_writer_makes_a_corpus_folder_per_target(tmp_path):
    folders = seeds.write(tmp_path, ("plugin",))
    assert sorted(p.name for p in folders["plugin"].iterdir()) == sorted(f"seed-{n}" for n in seeds.build("plugin"))


# -- the fixes, spelled out ----------------------------------------------------------------------
def _model(tmp_path, **changes):
    from kt.testing.checkpoints import write_checkpoint

    write_checkpoint(tmp_path, "deepseek_v3", hidden=32, intermediate=32, experts=2, top_k=1, layers=2,
                     keep_truth=False)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_config_json_of_the_wrong_shape(tmp_path):
    from kt.weights import Checkpoint

    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(KTError, match="should hold a JSON object of model settings; found a list"):
        Checkpoint(tmp_path)


def test_absurd_layer_counts_are_refused_at_once(tmp_path):
    from kt.weights import Checkpoint

    _model(tmp_path, num_hidden_layers=10**18)
    start = time.perf_counter()
    with pytest.raises(KTError, match=r"num_hidden_layers = 10{18}: more layers than any model has"):
        Checkpoint(tmp_path)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(("key", "value", "message"), [
    ("first_k_dense_replace", "one", "first_k_dense_replace must be an integer, got 'one'"),
    ("quantization_config", [1], "quantization_config should be a JSON object"),
    ("model_type", ["deepseek_v3"], "model_type should be a string"),
])
def test_config_settings_of_the_wrong_type(tmp_path, key, value, message):
    from kt.weights import Checkpoint

    _model(tmp_path, **{key: value})
    with pytest.raises(KTError, match=message):
        Checkpoint(tmp_path)


@pytest.mark.parametrize("index", [b"\xbe\xef", b'{"weight_map": [1]}', b'{"weight_map": {"t": "../../etc/passwd"}}'])
def test_shard_index_of_the_wrong_shape(tmp_path, index):
    from kt.weights import Checkpoint

    _model(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_bytes(index)
    with pytest.raises(KTError, match="safetensors index|weight_map should map tensor names to shard file names"):
        Checkpoint(tmp_path)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from kt.weights import convert

    src = _model(tmp_path_factory.mktemp("src"))
    return convert(src, tmp_path_factory.mktemp("conv") / "out", method="INT4", group_size=32)


def _edit_manifest(folder, edit):
    path = folder / "kt-manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m.pop("layers"), "layers should be an object"),
    (lambda m: m["geometry"].update(hidden="32"), "geometry.hidden should be a positive integer"),
    (lambda m: m.update(group_size=48), r"group_size should be one of \(32, 64, 128\)"),
    (lambda m: m["layers"]["1"].update(file="../layer-0001.safetensors"), "should be a file name in the folder"),
    (lambda m: m.update(method=["INT4"]), "codes layout"),
])
def test_damaged_manifests(tmp_path, converted, edit, message):
    import shutil

    from kt.weights import ConvertedFolder

    folder = tmp_path / "copy"
    shutil.copytree(converted, folder)
    _edit_manifest(folder, edit)
    with pytest.raises(KTError, match=message):
        ConvertedFolder.open(folder, check_source=False).layer_tensors(1)


def test_layer_file_with_other_arrays(tmp_path, converted):
    import shutil

    import torch
    from safetensors.torch import save_file

    from kt.weights import ConvertedFolder

    folder = tmp_path / "copy"
    shutil.copytree(converted, folder)
    save_file({"gate.codes": torch.zeros(2, 32, 16, dtype=torch.uint8)}, str(folder / "layer-0001.safetensors"))
    _edit_manifest(folder, lambda m: m["layers"]["1"].update(bytes=(folder / "layer-0001.safetensors").stat().st_size))
    with pytest.raises(KTError, match=r"holds arrays \['gate.codes'\]; a INT4 layer holds \['down.codes'"):
        ConvertedFolder.open(folder, check_source=False).layer_tensors(1)
    save_file({n: torch.zeros(1, dtype=torch.uint8) for n in ("gate.codes", "gate.scales", "up.codes", "up.scales",
                                                               "down.codes", "down.scales")},
              str(folder / "layer-0001.safetensors"))
    _edit_manifest(folder, lambda m: m["layers"]["1"].update(bytes=(folder / "layer-0001.safetensors").stat().st_size))
    with pytest.raises(KTError, match=r"gate.codes is uint8 \[1\], expected uint8 \[2, 32, 16\]"):
        ConvertedFolder.open(folder, check_source=False).layer_tensors(1)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(tier=7), "tier should be a kt_core.backends.Tier"),
    (dict(abi_version=(1,)), "abi_version should be a (major, minor) tuple"),
    (dict(variants=("v1",)), "variants should hold kt_core.backends.Variant objects"),
    (dict(rank="high"), "rank be an integer"),
])
def test_descriptors_with_fields_of_the_wrong_type_are_broken_plugins(kwargs, message):
    from kt_core.backends import BackendDescriptor, Tier, Variant, discovery

    rank = kwargs.pop("rank", 0)
    fields = dict(name="odd", abi_version=(1, 1), tier=Tier.GENERIC_SIMD,
                  variants=(Variant("v1", module="odd_native", methods=("FP32",), rank=rank),))
    fields.update(kwargs)

    class EntryPoint:
        name, value, dist = "odd", "odd:descriptor", None

        def load(self):
            return BackendDescriptor(**fields)

    found = discovery._load(EntryPoint())
    assert found.descriptor is None and message in found.error, found.error


def test_a_string_where_a_collection_belongs_is_refused():
    from kt_core.backends import Variant

    with pytest.raises(TypeError, match="requires must be a collection of names, not the string 'avx2'"):
        Variant("v1", module="m", requires="avx2")


def test_gguf_counts_past_the_end_of_the_file_are_refused_at_once(tmp_path):
    """gguf-py's reader trusts metadata counts: an array of 2**40 strings in a 60-byte file
    made it loop (the fuzzer's hang); kt checks every count against the bytes left first."""
    import struct

    from kt.gguf.reader import GGUFModel

    key = b"general.architecture"
    path = tmp_path / "hang.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                     + struct.pack("<IIQ", 9, 8, 2**40))
    start = time.perf_counter()
    with pytest.raises(KTError, match=r"hang.gguf is not a readable GGUF file .*metadata #0's value at offset 68 "
                                      r"claims 1099511627776 entries, more than the 0 bytes left can hold"):
        GGUFModel(path)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(("key", "value", "found"), [("expert_count", 0, "0"), ("block_count", -3, "-3"),
                                                     ("embedding_length", 1.5, "1.5")])
def test_gguf_sizes_that_are_not_positive_integers(tmp_path, key, value, found):
    """A zero expert count made layer_experts index an empty list (IndexError, found by fuzzing);
    every size kt reads from the metadata must be a positive integer."""
    import gguf

    from kt.gguf.reader import GGUFModel

    sizes = {"block_count": 1, "embedding_length": 64, "expert_feed_forward_length": 32, "expert_count": 2,
             "expert_used_count": 1, key: value}
    w = gguf.GGUFWriter(str(tmp_path / "sizes.gguf"), "qwen3moe")
    for name, v in sizes.items():
        kind = gguf.GGUFValueType.FLOAT32 if isinstance(v, float) else gguf.GGUFValueType.INT32
        w.add_key_value(f"qwen3moe.{name}", v, kind)
    w.add_tensor("blk.0.ffn_gate.0.weight", np.zeros((32, 64), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(KTError, match=rf"metadata {key} must be a positive integer, found {found}"):
        GGUFModel(tmp_path / "sizes.gguf").layer_experts(0)
