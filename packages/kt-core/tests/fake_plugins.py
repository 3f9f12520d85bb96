"""Plugins that misbehave, made on the fly: entry points in a temporary dist-info, and
backend tables built with ctypes so each ABI violation can be staged without a compiler."""

from __future__ import annotations

import ctypes
import textwrap
from pathlib import Path

INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class BackendApi(ctypes.Structure):
    # Mirrors kt_backend_api in kt/plugin.h.
    _fields_ = [("struct_size", ctypes.c_uint32), ("abi_major", ctypes.c_uint16), ("abi_minor", ctypes.c_uint16),
                ("name", ctypes.c_char_p), ("variant", ctypes.c_char_p), ("required_features", ctypes.c_char_p),
                ("init", INIT), ("num_methods", ctypes.c_size_t), ("methods", ctypes.c_void_p)]


_keep_alive = []


def capsule(*, name="liar", variant="v1", major=1, minor=0, size=None, features=b"") -> object:
    """A PyCapsule named kt.backend_api around a hand-made table."""
    init = INIT(lambda host: 0)
    table = BackendApi(ctypes.sizeof(BackendApi) if size is None else size, major, minor, name.encode(),
                       variant.encode(), features, init, 0, None)
    _keep_alive.extend([init, table])
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name_bytes = ctypes.create_string_buffer(b"kt.backend_api")
    _keep_alive.append(name_bytes)
    return new(ctypes.addressof(table), name_bytes, None)


def install(root: Path, plugins: dict[str, str]) -> None:
    """Write modules `{name: source}` under root and register each as a kt.backends entry point
    `name = fake_<name>:descriptor` (root must be on sys.path)."""
    dist = root / "fake_kt_plugins-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-kt-plugins\nVersion: 0.1\n")
    lines = ["[kt.backends]"]
    for name, source in plugins.items():
        (root / f"fake_{name}.py").write_text(textwrap.dedent(source))
        lines.append(f"{name} = fake_{name}:descriptor")
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
