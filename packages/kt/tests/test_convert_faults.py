"""kt convert under faults: killed mid-write, unwritable or full output."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import textwrap
from pathlib import Path

import pytest

from kt_core.errors import KTError

KT_ERROR_INVALID_ARGUMENT, KT_ERROR_OUT_OF_MEMORY, KT_ERROR_INTERNAL = 1, 3, 4
# Large enough that the forward runs on the pool threads (above kt-core's serial threshold).
E, H, I, TOP_K, TOKENS = 8, 256, 128, 2, 24


# -- kt convert ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from kt.testing.checkpoints import write_checkpoint

    pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("model")
    write_checkpoint(path, "qwen3_moe", hidden=64, intermediate=32, experts=4, layers=4, dense_prefix=0)
    return path


def digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.name.startswith("layer-")}


KILLED = textwrap.dedent("""
    import os, signal, sys
    from kt.weights import conversion
    real = conversion._save_layer
    def save(path, tensors, metadata):
        if "layer-0002" in path.name:
            path.write_bytes(b"half a layer")       # the process dies mid-write: no cleanup runs
            os.kill(os.getpid(), signal.SIGKILL)
        real(path, tensors, metadata)
    conversion._save_layer = save
    conversion.convert(sys.argv[1], sys.argv[2], method="INT8")
""")


def test_a_killed_conversion_resumes_to_the_same_files(tmp_path, model):
    import subprocess
    import sys

    from kt.weights import ConvertedFolder, convert

    out = tmp_path / "killed"
    r = subprocess.run([sys.executable, "-c", KILLED, str(model), str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr[-2000:]
    names = sorted(p.name for p in out.iterdir())
    assert names == [".layer-0002.safetensors.partial", "config.json", "kt-manifest.json", "layer-0000.safetensors",
                     "layer-0001.safetensors"]
    assert not json.loads((out / "kt-manifest.json").read_text())["complete"]
    with pytest.raises(KTError, match=r"unfinished conversion \(2 of 4 layers\)"):
        ConvertedFolder.open(out)
    convert(model, out, method="INT8", resume=True)
    assert not list(out.glob(".*.partial"))
    assert digests(out) == digests(convert(model, tmp_path / "straight", method="INT8"))


def test_an_output_path_under_a_file(tmp_path, model):
    from kt.weights import convert

    (tmp_path / "file").write_text("x")
    with pytest.raises(KTError, match="is a file; kt convert writes into a folder"):
        convert(model, tmp_path / "file", method="INT8")
    with pytest.raises(KTError, match=r"writing .*file/out failed: .*Not a directory.*; fix that and run the same"):
        convert(model, tmp_path / "file" / "out", method="INT8")


@pytest.mark.parametrize(("failing", "err", "message"), [
    ("config", errno.EROFS, r"writing .*out failed: the output folder is not writable \(Read-only file system\). "
                            r"0 layers are complete; make it writable"),
    ("manifest", errno.EACCES, r"writing .*kt-manifest.json failed: the output folder is not writable \(Permission "
                               r"denied\). 0 layers are complete"),
    ("layer", errno.EROFS, r"writing .*layer-0000.safetensors failed: the output folder is not writable"),
    ("late-manifest", errno.ENOSPC, r"writing .*kt-manifest.json failed: the disk is full. 2 layers are complete; "
                                    "make room and run the same kt convert with --resume"),
])
def test_unwritable_or_full_output_at_every_write(tmp_path, model, monkeypatch, failing, err, message):
    """Root ignores permission bits, so the OS errors are injected where each write happens."""
    from kt.weights import conversion, convert

    def fail(*_):
        raise OSError(err, os.strerror(err))

    if failing == "config":
        real = Path.write_bytes
        monkeypatch.setattr(Path, "write_bytes", lambda self, d: fail() if self.name == "config.json" else real(self, d))
    elif failing == "manifest":
        monkeypatch.setattr(conversion, "write_manifest", fail)
    elif failing == "layer":
        monkeypatch.setattr(conversion, "_save_layer", fail)
    else:
        real, calls = conversion.write_manifest, []

        def late(out, manifest):
            calls.append(1)
            if len(calls) == 3:                      # the initial manifest, layer 0's, then layer 1's
                fail()
            real(out, manifest)
        monkeypatch.setattr(conversion, "write_manifest", late)
    with pytest.raises(KTError, match=message):
        convert(model, tmp_path / "out", method="INT8")
