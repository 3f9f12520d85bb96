"""Real compiled plugins for the ABI and fault tests: tests/abi/plugin_fp32.c built with the
system C compiler against a chosen kt/plugin.h, registered as a kt.backends entry point the
way fake_plugins does (the native module wraps the library's table in a PyCapsule)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fake_plugins

ABI_DIR = Path(__file__).parent / "abi"
HEADER_1_0 = ABI_DIR / "kt-1.0"                     # plugin.h as released with ABI 1.0

DESCRIPTOR = """
from kt_core.backends import BackendDescriptor, Tier, Variant
descriptor = BackendDescriptor(name={name!r}, abi_version={abi!r}, tier=Tier.GENERIC_SIMD,
    variants=(Variant("v1", module="fake_{name}_native", methods={methods!r}),))
"""
NATIVE = """
import ctypes
lib = ctypes.CDLL({lib!r})
lib.kt_test_backend.restype = ctypes.c_void_p
_new = ctypes.pythonapi.PyCapsule_New
_new.restype = ctypes.py_object
_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_name = ctypes.create_string_buffer(b"kt.backend_api")
def backend_api(variant):
    return _new(lib.kt_test_backend(), _capsule_name, None)
"""


def compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build a plugin with")
    return cc


def build(out: Path, *, include: Path, name: str, defines: dict[str, str] | None = None) -> Path:
    """plugin_fp32.c compiled against include/kt/plugin.h into out/lib<name>.so."""
    lib = out / f"lib{name}.so"
    flags = [f"-D{k}={v}" for k, v in (defines or {}).items()]
    cmd = [compiler(), "-O1", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{include}", f'-DKT_TEST_NAME="{name}"',
           *flags, str(ABI_DIR / "plugin_fp32.c"), "-o", str(lib), "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return lib


def register(root: Path, plugins: dict[str, tuple]) -> None:
    """Entry points for {name: (library, descriptor abi_version[, methods])} under root (on sys.path)."""
    sources = {}
    for name, (lib, abi, *methods) in plugins.items():
        sources[name] = DESCRIPTOR.format(name=name, abi=abi, methods=tuple(methods[0]) if methods else ("FP32",))
        sources[f"{name}_native"] = NATIVE.format(lib=str(lib))
    fake_plugins.install(root, sources)
    for mod in [m for m in sys.modules if m.startswith("fake_") and m != "fake_plugins"]:
        del sys.modules[mod]


def native_lib(name: str):
    """The ctypes handle of a registered plugin's library (kt_test_fail, kt_test_seen_config_size)."""
    import importlib

    return importlib.import_module(f"fake_{name}_native").lib


def native_lib_capsule(name: str):
    """The registered plugin's backend table, in its PyCapsule (what backend_api() returns)."""
    import importlib

    return importlib.import_module(f"fake_{name}_native").backend_api("v1")
