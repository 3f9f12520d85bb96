"""Device bridges: packages that drive kt's CPU experts from a device's streams (kt-cuda's
`kt.device_bridges` entry point "cuda"). kt-core finds them by entry point and never imports
a device runtime itself; KTMoEWrapper hands CUDA tensors to the "cuda" bridge when one is
installed and usable here."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

log = logging.getLogger("kt_core")
GROUP = "kt.device_bridges"
_providers: dict[str, object | None] = {}


def provider(kind: str):
    """The installed bridge for device type `kind` ("cuda"), if it can serve here; else None."""
    if kind not in _providers:
        found = None
        for ep in entry_points(group=GROUP):
            if ep.name != kind:
                continue
            candidate = ep.load()()
            ok, why = candidate.available()
            if ok:
                found = candidate
            else:
                log.info("kt %s bridge %s is installed but unused: %s", kind, ep.value, why)
        _providers[kind] = found
    return _providers[kind]


def report() -> list[tuple[str, str, bool, str]]:
    """(kind, entry point, usable, why) for every installed bridge, for kt doctor."""
    rows = []
    for ep in entry_points(group=GROUP):
        try:
            ok, why = ep.load()().available()
        except Exception as exc:   # a broken bridge is reported, not fatal to kt doctor
            ok, why = False, f"does not load: {exc}"
        rows.append((ep.name, ep.value, ok, why))
    return rows
