"""Choose a backend variant per method, and explain the choice.

Every discovered variant gets a score: 0 when it cannot run here (wrong architecture,
another ABI major, a failed probe, missing CPU features, excluded by the environment),
else (tier, variant rank) — documented tiers, no magic numbers. Per method the runnable
variants that provide it are tried best first; a native module that fails to load or
whose table contradicts its descriptor is recorded and skipped.

Environment, read once at first use:
  KT_BACKENDS          comma list: only these backends, in this preference order; naming one
                       that is not installed or cannot run is an error
  KT_DISABLE_BACKENDS  comma list of backends never to use
  KT_CPU_VARIANT       within each backend that has a variant of this name (e.g. x86-64-v3), use
                       only that one; an error if no backend has it or it cannot run here
  KT_MAX_ISA           cap the host's features (see kt_core.host)
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass

from .. import _native
from ..errors import BackendError, BackendSelectionError
from ..host import Host, host
from .descriptor import BackendDescriptor, Tier, Variant
from .discovery import Discovered, discover

# Method names kt-kernel users pass, mapped to the format they name.
# kt-kernel 0.7.2's method names (SGLang passes them) for kt's formats.
METHOD_ALIASES = {"AMXINT8": "INT8", "AMXINT4": "INT4", "MOE_INT8": "INT8", "MOE_INT4": "INT4", "GGUF": "LLAMAFILE"}


def canonical_method(method: str) -> str:
    m = str(method).upper()
    return METHOD_ALIASES.get(m, m)


@dataclass(frozen=True)
class Candidate:
    backend: str
    variant: str
    tier: Tier
    rank: int
    methods: tuple[str, ...]
    runnable: bool
    reason: str            # why it can run ("ok") or why not
    descriptor: BackendDescriptor
    spec: Variant

    @property
    def score(self) -> tuple[int, int] | int:
        return (int(self.tier), self.rank) if self.runnable else 0


def _env_list(name: str) -> list[str]:
    """A comma list of backend names; names are case-insensitive (backends name themselves in lower case)."""
    return [x.strip().lower() for x in os.environ.get(name, "").split(",") if x.strip()]


def _judge(d: BackendDescriptor, v: Variant, h: Host, disabled: set[str], allowed: list[str] | None,
           forced_variant: str | None) -> tuple[bool, str]:
    if d.name in disabled:
        return False, "disabled by KT_DISABLE_BACKENDS"
    if allowed is not None and d.name not in allowed:
        return False, "not listed in KT_BACKENDS"
    if d.abi_version[0] != _native.ABI_MAJOR:
        return False, (f"built for plugin ABI {d.abi_version[0]}.{d.abi_version[1]}, this kt-core speaks "
                       f"{_native.ABI_MAJOR}.{_native.ABI_MINOR}")
    if d.abi_version[1] > _native.ABI_MINOR:
        return False, (f"needs plugin ABI {d.abi_version[0]}.{d.abi_version[1]}, this kt-core speaks up to "
                       f"{_native.ABI_MAJOR}.{_native.ABI_MINOR}: upgrade kt-core")
    if h.arch not in d.arch:
        return False, f"built for {', '.join(d.arch)}; this host is {h.arch}"
    missing = h.missing(v.requires)
    if missing:
        capped = [f for f in missing if f in h.detected_features]
        why = f"needs {', '.join(missing)}"
        if capped:
            why += f" ({', '.join(capped)} withheld by KT_MAX_ISA={h.max_isa})"
        return False, why
    if forced_variant and v.name != forced_variant and any(x.name == forced_variant for x in d.variants):
        return False, f"KT_CPU_VARIANT={forced_variant} selects another variant"
    if d.probe is not None:
        try:
            problem = d.probe()
        except Exception as exc:
            problem = f"probe raised {type(exc).__name__}: {exc}"
        if problem:
            return False, problem
    return True, "ok"


class Selector:
    """The process's backend choice; build it through `selector()`."""

    def __init__(self, discovered: tuple[Discovered, ...], h: Host):
        self.host = h
        self.broken = [d for d in discovered if d.descriptor is None]
        allowed = _env_list("KT_BACKENDS") or None
        disabled = set(_env_list("KT_DISABLE_BACKENDS"))
        forced = os.environ.get("KT_CPU_VARIANT", "").strip().lower() or None
        self.allowed = allowed
        self.candidates: list[Candidate] = []
        for item in discovered:
            d = item.descriptor
            if d is None:
                continue
            for v in d.variants:
                ok, reason = _judge(d, v, h, disabled, allowed, forced)
                self.candidates.append(Candidate(d.name, v.name, d.tier, v.rank, v.methods, ok, reason, d, v))
        self.load_failures: dict[tuple[str, str], str] = {}
        self._loaded: dict[tuple[str, str], object] = {}
        self._check_environment(allowed, forced)

    def _check_environment(self, allowed: list[str] | None, forced: str | None) -> None:
        names = {c.backend for c in self.candidates}
        for name in allowed or []:
            if name not in names:
                broken = [b for b in self.broken if b.entry_point.split(" =")[0] == name]
                detail = f": {broken[0].error}" if broken else ""
                raise BackendSelectionError(
                    f"KT_BACKENDS names {name!r}, which is not an installed, loadable backend{detail}. "
                    f"Installed: {', '.join(sorted(names)) or 'none'}"
                )
            own = [c for c in self.candidates if c.backend == name]
            if not any(c.runnable for c in own):
                reasons = "; ".join(f"{c.variant}: {c.reason}" for c in own)
                raise BackendSelectionError(f"KT_BACKENDS names {name!r}, which cannot run on this host ({reasons})")
        if forced:
            named = [c for c in self.candidates if c.variant == forced]
            if not named:
                variants = sorted({c.variant for c in self.candidates})
                raise BackendSelectionError(
                    f"KT_CPU_VARIANT={forced!r} is no variant of any installed backend; known variants: {', '.join(variants)}"
                )
            if not any(c.runnable for c in named):
                reasons = "; ".join(f"{c.backend}/{c.variant}: {c.reason}" for c in named)
                raise BackendSelectionError(f"KT_CPU_VARIANT={forced!r} cannot run here: {reasons}")

    def _order_key(self, c: Candidate):
        # Backends KT_BACKENDS leaves out are not runnable, but `kt backends` still lists them: last.
        allowed = self.allowed or []
        position = allowed.index(c.backend) if c.backend in allowed else len(allowed)
        return (position, -int(c.tier), -c.rank, c.backend, c.variant)

    def methods(self) -> set[str]:
        """Every method some installed backend variant provides (runnable here or not)."""
        return {m for c in self.candidates for m in c.methods}

    def ranked(self, method: str) -> list[Candidate]:
        """Runnable candidates providing `method`, best first (before any native import)."""
        m = canonical_method(method)
        runnable = [c for c in self.candidates if c.runnable and m in c.methods]
        return sorted(runnable, key=self._order_key)

    def load(self, c: Candidate):
        """Import and validate one variant's native table (cached); raises BackendError."""
        key = (c.backend, c.variant)
        if key in self._loaded:
            return self._loaded[key]
        if key in self.load_failures:
            raise BackendError(f"backend {c.backend}/{c.variant} failed to load: {self.load_failures[key]}")
        try:
            module = importlib.import_module(c.spec.module)
            native = _native.load_backend(module.backend_api(c.variant), c.backend, c.variant)
            provided = {m["method"] for m in native.methods}
            claimed = set(c.methods) - provided
            if claimed:
                raise BackendError(
                    f"its descriptor claims methods {', '.join(sorted(claimed))} that the native module does not "
                    f"provide (it provides {', '.join(sorted(provided))})"
                )
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            self.load_failures[key] = reason
            raise BackendError(f"backend {c.backend}/{c.variant} failed to load: {reason}") from exc
        self._loaded[key] = native
        return native

    def choose(self, method: str, shape: tuple[int, int, int, int] | None = None, tokens: int = 1,
               needs_raw_gate_up: bool = False, needs_transposed: bool = False):
        """The best loadable variant for `method` that does not decline `shape` (and, for layers
        whose experts carry biases, has the raw gate/up tile of plugin ABI 1.4; for layers that
        train, that and the transposed tiles of ABI 1.5): returns (candidate, native backend)."""
        m = canonical_method(method)
        ranked = self.ranked(m)
        if not ranked:
            providers = sorted({f"{c.backend}/{c.variant}" for c in self.candidates if m in c.methods})
            if providers:
                why = "; ".join(f"{c.backend}/{c.variant}: {c.reason}" for c in self.candidates if m in c.methods)
                raise BackendError(f"no backend that provides method {m} can run here ({why})")
            have = sorted({x for c in self.candidates for x in c.methods})
            raise BackendError(
                f"no installed backend provides method {m!r}; installed backends provide: {', '.join(have)}. "
                "Install the backend package for it (e.g. kt-backend-avx for INT8/INT4/FP8)."
            )
        problems = []
        for c in ranked:
            try:
                native = self.load(c)
            except BackendError as exc:
                problems.append(str(exc))
                continue
            if shape is not None and native.declines(m, *shape, tokens):
                problems.append(f"{c.backend}/{c.variant} declines this shape")
                continue
            if needs_raw_gate_up and not any(x["method"] == m and x["raw_gate_up"] for x in native.methods):
                problems.append(f"{c.backend}/{c.variant} has no raw gate/up tile (plugin ABI 1.4) for expert biases, "
                                "the limit after SiLU or GELU-tanh")
                continue
            if needs_transposed and not any(x["method"] == m and x["raw_gate_up"] and x["transposed"]
                                            for x in native.methods):
                problems.append(f"{c.backend}/{c.variant} has no raw gate/up and transposed tiles (plugin ABI 1.4, "
                                "1.5), which training needs")
                continue
            return c, native
        raise BackendError(f"no backend could run method {m}: " + "; ".join(problems))

    def explain(self) -> list[dict]:
        """One row per backend variant (and per broken plugin): score, and why it won or lost."""
        methods = sorted({m for c in self.candidates for m in c.methods})
        winners = {}
        for m in methods:
            for c in self.ranked(m):
                if (c.backend, c.variant) not in self.load_failures:
                    winners.setdefault(m, (c.backend, c.variant))
                    break
        rows = []
        for c in sorted(self.candidates, key=self._order_key):
            key = (c.backend, c.variant)
            chosen = sorted(m for m, w in winners.items() if w == key)
            if key in self.load_failures:
                reason = f"failed to load: {self.load_failures[key]}"
            elif not c.runnable:
                reason = c.reason
            elif chosen:
                reason = "chosen: best runnable variant for " + ", ".join(chosen)
            else:
                beaten = {m: winners.get(m) for m in c.methods}
                reason = "runnable; outranked by " + ", ".join(
                    sorted({f"{w[0]}/{w[1]}" for w in beaten.values() if w and w != key})
                )
            rows.append({"backend": c.backend, "variant": c.variant, "tier": c.tier.name.lower(), "rank": c.rank,
                         "score": c.score, "runnable": c.runnable and key not in self.load_failures,
                         "methods": list(c.methods), "ggml_types": list(c.spec.ggml_types), "chosen_for": chosen,
                         "reason": reason})
        for b in self.broken:
            rows.append({"backend": b.entry_point, "variant": "-", "tier": "-", "rank": 0, "score": 0,
                         "runnable": False, "methods": [], "ggml_types": [], "chosen_for": [],
                         "reason": f"broken plugin: {b.error}"})
        return rows


@functools.cache
def selector() -> Selector:
    """The process-wide selector; environment variables are read on this first call."""
    return Selector(discover(), host())


def reset() -> None:
    """Forget discovery and selection (tests that change KT_* variables use this)."""
    selector.cache_clear()
    discover.cache_clear()
    host.cache_clear()
