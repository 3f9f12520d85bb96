"""The plugin ABI lock: a change to kt/plugin.h (or kt/forward.h, the device bridges' table) must
come with a version bump.

plugin.h's declarations (comments and whitespace removed, so rewording a comment is free)
are hashed; packages/kt-core/plugin-abi.lock records one hash per ABI version the header
has declared. `nox -s abi` fails when the header's current KT_PLUGIN_ABI_MAJOR.MINOR has
no recorded hash, or a different one: the header changed without a version bump.

    python tools/abi_hash.py              # check (what nox -s abi runs)
    python tools/abi_hash.py --record     # after a deliberate bump: record the new version's hash

A bump appends fields and raises MINOR, or changes anything else and raises MAJOR
(docs/plugin-abi.md, "The tables"); the version history table there must gain the row.
--record refuses to overwrite a version already recorded (use --force only to correct a
lock entry made by mistake before that version was ever released).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "packages" / "kt-core" / "include" / "kt" / "plugin.h"
LOCK = ROOT / "packages" / "kt-core" / "plugin-abi.lock"
DOC = ROOT / "docs" / "plugin-abi.md"
# kt/forward.h: versioned by KT_FORWARD_API_VERSION, one integer (kt-cuda and other device bridges).
FORWARD_HEADER = HEADER.with_name("forward.h")
FORWARD_LOCK = LOCK.with_name("forward-api.lock")


def normalize(text: str) -> str:
    """The header's tokens: comments dropped, every run of whitespace one space."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return " ".join(text.split())


def digest(text: str) -> str:
    return hashlib.sha256(normalize(text).encode()).hexdigest()


def version(text: str) -> str:
    found = {k: re.search(rf"#\s*define\s+KT_PLUGIN_ABI_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR")}
    if all(found.values()):
        return f"{found['MAJOR'].group(1)}.{found['MINOR'].group(1)}"
    if forward := re.search(r"#\s*define\s+KT_FORWARD_API_VERSION\s+(\d+)", text):
        return forward.group(1)
    raise SystemExit("no KT_PLUGIN_ABI_MAJOR / KT_PLUGIN_ABI_MINOR (plugin.h) or KT_FORWARD_API_VERSION (forward.h) "
                     "definition")


def read_lock(path: Path = LOCK) -> dict[str, str]:
    entries = {}
    for line in path.read_text().splitlines() if path.is_file() else ():
        line = line.split("#", 1)[0].strip()
        if line:
            ver, sha = line.split()
            entries[ver] = sha
    return entries


def check(header: Path = HEADER, lock: Path = LOCK, doc: Path | None = DOC) -> list[str]:
    """Problems with the header against the lock (empty when it is consistent)."""
    text = header.read_text()
    ver, sha, entries = version(text), digest(text), read_lock(lock)
    problems = []
    what = "plugin ABI" if header.name == "plugin.h" else "kt_forward_api version"
    bump = ("bump KT_PLUGIN_ABI_MINOR (fields appended) or KT_PLUGIN_ABI_MAJOR (anything else), add the version "
            "history row to docs/plugin-abi.md" if header.name == "plugin.h" else "bump KT_FORWARD_API_VERSION")
    if ver not in entries:
        problems.append(f"{header.name} declares {what} {ver}, which {lock.name} does not record. After a "
                        f"deliberate version bump, record it: python tools/abi_hash.py --record")
    elif entries[ver] != sha:
        problems.append(f"{header.name} changed since {what} {ver} was recorded (hash {entries[ver][:12]}, now "
                        f"{sha[:12]}) but still declares {ver}: {bump}, then run python tools/abi_hash.py --record")
    if doc is not None and doc.is_file() and not re.search(rf"^\|\s*{re.escape(ver)}\s*\|", doc.read_text(), re.M):
        problems.append(f"{doc.name}'s version history has no row for ABI {ver}")
    return problems


def record(force: bool = False, header: Path = HEADER, lock: Path = LOCK) -> str:
    text = header.read_text()
    ver, sha, entries = version(text), digest(text), read_lock(lock)
    if ver in entries and entries[ver] != sha and not force:
        raise SystemExit(f"ABI {ver} is already recorded with another hash: a released version's header never "
                         "changes; bump the version instead (or --force to correct an unreleased entry)")
    entries[ver] = sha
    lines = [f"# sha256 of packages/kt-core/include/kt/{header.name} without comments and whitespace, per "
             f"{'plugin ABI' if header.name == 'plugin.h' else 'kt_forward_api'}",
             "# version (tools/abi_hash.py; nox -s abi). Refresh after a deliberate bump: python tools/abi_hash.py --record"]
    key = lambda v: tuple(int(x) for x in v.split("."))   # noqa: E731
    lines += [f"{v} {entries[v]}" for v in sorted(entries, key=key)]
    lock.write_text("\n".join(lines) + "\n")
    return ver


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", action="store_true", help="record the header's current version and hash")
    ap.add_argument("--force", action="store_true", help="with --record: overwrite an existing entry")
    args = ap.parse_args(argv)
    pairs = ((HEADER, LOCK, DOC), (FORWARD_HEADER, FORWARD_LOCK, None))
    if args.record:
        for header, lock, _ in pairs:
            print(f"recorded {header.name} version {record(args.force, header, lock)} in {lock.relative_to(ROOT)}")
        return 0
    problems = [p for header, lock, doc in pairs for p in check(header, lock, doc)]
    for p in problems:
        print(f"abi: {p}", file=sys.stderr)
    if not problems:
        print(f"abi: plugin.h matches the recorded hash of ABI {version(HEADER.read_text())}, forward.h that of "
              f"kt_forward_api {version(FORWARD_HEADER.read_text())}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
