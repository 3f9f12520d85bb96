"""Where kt-backend-blis takes over from kt-backend-avx: per method, the rows per expert
(tokens x top_k / num_experts) from which BLIS's forward is faster on this host. Measured by
`python -m kt_backend_blis.calibrate` and kept in a JSON file tied to the host (CPU, ISA level,
BLIS library) and to the kt-backend-avx build it was measured against: a file from another machine,
another BLIS or another avx build (whose prefill may have changed speed) is ignored. KT_BLIS_MIN_ROWS
overrides it: a number for every method (0: BLIS takes every batch, as the tests run it), `never`,
or per method, `BF16=256,INT8=never`."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from pathlib import Path

from . import _build

METHODS = ("BF16", "INT8", "INT4", "RAWINT4", "FP8", "FP8_PERCHANNEL", "MXFP4", "GPTQ_INT4")
ENV = "KT_BLIS_MIN_ROWS"


def path() -> Path:
    if p := os.environ.get("KT_BLIS_CROSSOVER"):
        return Path(p)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kt" / "blis_crossover.json"


@functools.cache
def avx_build() -> str:
    """A fingerprint of the installed kt-backend-avx native module (the side BLIS was measured
    against): an upgrade that makes its prefill faster must not keep a crossover measured before it."""
    spec = importlib.util.find_spec("kt_backend_avx._native")
    if spec is None or not spec.origin:
        return "not installed"
    return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()[:16]


def host_key() -> dict:
    import kt_core
    h = kt_core.host()
    return {"cpu": h.brand, "isa_level": h.isa_level, "blis": _build.BLIS_SONAME, "avx_build": avx_build()}


def _override() -> dict[str, int | None] | None:
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None

    def rows(value: str, where: str) -> int | None:
        if value.strip().lower() == "never":
            return None
        try:
            n = int(value)
        except ValueError:
            n = -1
        if n < 0:
            raise ValueError(f"{ENV}: {where} should be an integer >= 0 or 'never', found {value!r}")
        return n

    if "=" not in text:
        return dict.fromkeys(METHODS, rows(text, "the value"))
    out = {}
    for part in text.split(","):
        method, _, value = part.partition("=")
        method = method.strip().upper()
        if method not in METHODS:
            raise ValueError(f"{ENV}: unknown method {method!r}; kt-backend-blis serves {', '.join(METHODS)}")
        out[method] = rows(value, method)
    return out


def _calibrated() -> tuple[dict[str, int | None] | None, str]:
    """The calibration file's table if it was measured on this host, and why not otherwise."""
    p = path()
    if not p.is_file():
        return None, f"no calibration at {p}"
    try:
        data = json.loads(p.read_text())
        key, table = data["host"], data["min_rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{p} is not a kt-backend-blis calibration ({exc})"
    if key != host_key():
        return None, f"{p} was measured on another host, BLIS or kt-backend-avx build ({key}, this one {host_key()})"
    return {m: table.get(m) for m in METHODS}, f"calibrated {data.get('date', '')} ({p})"


def table() -> tuple[dict[str, int | None], str]:
    """Rows per expert from which BLIS serves each method (None: never), and where that came from."""
    calibrated, why = _calibrated()
    base = calibrated or dict.fromkeys(METHODS)
    override = _override()
    if override is not None:
        return {**base, **override}, f"{ENV}={os.environ[ENV]}" + (f" over {why}" if calibrated else "")
    return base, why


def unusable_reason() -> str | None:
    """Why kt-backend-blis cannot serve here (None: it can), phrased as what it needs."""
    try:
        rows, why = table()
    except ValueError as exc:
        return f"needs a valid {ENV}: {exc}"
    if all(v is None for v in rows.values()):
        if _override() is None and _calibrated()[0] is None:
            return (f"needs a crossover measured on this host ({why}): run `python -m kt_backend_blis.calibrate` to "
                    f"measure where BLIS beats kt-backend-avx here (until then kt-backend-avx serves), or set {ENV}")
        return f"needs a method where BLIS beats kt-backend-avx here: {why} found none, so kt-backend-avx serves"
    return None


def apply(native) -> None:
    rows, _ = table()
    for method, n in rows.items():
        if n is None:
            native.set_never(method)
        else:
            native.set_min_rows(method, n)


def save(min_rows: dict[str, int | None], measured: list[dict], settings: dict) -> Path:
    """Write a calibration for this host atomically."""
    import time
    p = path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"host": host_key(), "date": time.strftime("%Y-%m-%d %H:%M"), "min_rows": min_rows,
                               "settings": settings, "measured": measured}, indent=1))
    os.replace(tmp, p)
    return p
