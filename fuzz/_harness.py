"""What every fuzz target shares: the multi-file container, the scratch folder, the verdict
on an exception, and the atheris entry point.

A target is a module with `check(data: bytes) -> None`. It feeds `data` to one kt reader
and returns when the reader accepted the input or refused it with one of the target's
documented error types; any other exception escapes, and that is a crash (atheris saves the
input). Hangs and segfaults are caught by libFuzzer itself (-timeout, signals).

Run one target for a bounded time (nox -s fuzz runs them all):

    python fuzz/fuzz_gguf.py .fuzz/corpus/gguf -max_total_time=50 -timeout=10
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import tempfile
import traceback
from pathlib import Path

FUZZ_DIR = Path(__file__).resolve().parent
REGRESSIONS = FUZZ_DIR / "regressions"


class Crash(AssertionError):
    """A reader failed in a way its documentation does not allow."""


# -- several files in one input --------------------------------------------------------------
# Folder-shaped inputs (a model folder, a converted folder) travel as one byte string:
# records of <u8 slot><u32 length><bytes>, the slot naming the file. A record cut short keeps
# the bytes that are there, so every byte string decodes to some folder.
def pack_files(names: tuple[str, ...], files: dict[str, bytes]) -> bytes:
    out = bytearray()
    for name, content in files.items():
        out += struct.pack("<BI", names.index(name), len(content)) + content
    return bytes(out)


def unpack_files(names: tuple[str, ...], data: bytes) -> dict[str, bytes]:
    files, at = {}, 0
    while at + 5 <= len(data):
        slot, length = struct.unpack_from("<BI", data, at)
        at += 5
        files[names[slot % len(names)]] = data[at:at + length]
        at += length
    return files


class Scratch:
    """A fresh folder per input under one temporary root (removed at exit)."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="kt-fuzz-"))
        self.n = 0

    def folder(self, files: dict[str, bytes] | None = None) -> Path:
        self.n += 1
        path = self.root / str(self.n)
        shutil.rmtree(self.root / str(self.n - 1), ignore_errors=True)
        path.mkdir()
        for name, content in (files or {}).items():
            (path / name).write_bytes(content)
        return path

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)


def _raised_in(exc: BaseException, files: tuple[str, ...]) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(files)


def verdict(fn, allowed: tuple[type[BaseException], ...], what: str, *,
            boundary: tuple[tuple[type[BaseException], ...], tuple[str, ...]] = ((), ())):
    """fn()'s result, None when it raised an allowed error; a Crash naming the leak otherwise.
    boundary = (types, files): those exception types are documented too when raised by the
    named files (path suffixes) themselves, e.g. the ValueError kt_core/moe.py raises for bad
    weights or passes on from the native layer; the same type raised deeper (int("x"), a JSON
    decoder) is still a crash."""
    types, files = boundary
    try:
        return fn()
    except allowed:
        return None
    except Exception as exc:
        if types and isinstance(exc, types) and _raised_in(exc, files):
            return None
        return _crash(exc, allowed + types, what)


def _crash(exc: BaseException, allowed, what: str):
    where = "".join(traceback.format_exception(exc)[-4:-1]).rstrip()   # the innermost frames
    raise Crash(f"{what} raised {type(exc).__name__}: {exc} (documented: "
                f"{', '.join(t.__name__ for t in allowed)})\n{where}") from exc


def regression_inputs(target: str) -> list[Path]:
    folder = REGRESSIONS / target
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def main(load_check):
    """atheris entry point: import the code under test, instrument it, then fuzz check()."""
    import atheris

    check = load_check()
    # Coverage feedback for every Python function loaded so far (kt_core, gguf, safetensors'
    # Python side, json...): instrument_imports misses modules kt_core's __init__ pulls in early.
    atheris.instrument_all()
    os.environ.setdefault("KT_FUZZ", "1")
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()
