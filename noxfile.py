"""Developer and CI sessions.

Most sessions run in the environment nox is started from (`.ci/setup` creates it: .venv with
every workspace package installed), so the C++ is built once per change, not once per session
— on a 2-core machine that is the difference between minutes and tens of minutes.
`install_smoke` is the exception by design: it builds a fresh venv from the wheelhouse alone.

    .venv/bin/nox -s lint tests target_conformance target_alone example install_smoke
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file())
# Packages with C++ (a CMakeLists.txt; the application `kt` is pure Python), in build order: each
# builds against the installed packages before it (kt-backend-amx on kt-backend-avx's kernels).
BUILD_FIRST = ("kt-core", "kt-backend-avx")
NATIVE_PACKAGES = sorted((p for p in PACKAGES if (ROOT / "packages" / p / "CMakeLists.txt").is_file()),
                         key=lambda p: (BUILD_FIRST.index(p) if p in BUILD_FIRST else len(BUILD_FIRST), p))
EXAMPLE = ROOT / "examples" / "kt-backend-example"
WHEELHOUSE = ROOT / "wheelhouse"

nox.options.sessions = ["lint", "tests", "target_conformance", "target_alone", "example", "install_smoke", "packaging",
                        "amx_hardware_build", "abi", "tsan", "fuzz", "aarch64"]
nox.options.default_venv_backend = "none"


@nox.session
def lint(session):
    session.run("ruff", "check", ".")


@nox.session
@nox.parametrize("package", PACKAGES)
def tests(session, package):
    """One package's own tests, against the installed build of it."""
    session.run("python", "-m", "pytest", "-q", f"packages/{package}/tests", *session.posargs)


# The AMX emulation build (.ci/setup installs it) serves only with KT_AMX_EMULATE=1 at run time;
# KT_AMX_MIN_ROWS=0 sends every batch, however small, through its tiles, and KT_BLIS_MIN_ROWS=0
# every batch through BLIS (which otherwise serves only where this host's calibration says).
AMX_EMULATION = {"KT_AMX_EMULATE": "1", "KT_AMX_MIN_ROWS": "0", "KT_BLIS_MIN_ROWS": "0"}


@nox.session
def conformance(session):
    """Every installed backend, every variant this host can run, against the reference backend."""
    session.run("python", "-m", "pytest", "-q", "-p", "kt_core.testing.plugin", "--pyargs", "kt_core.testing.conformance",
                *session.posargs, env=AMX_EMULATION)


def _targets(package: str) -> list[dict]:
    """A backend's targets.json: the list its CMake, dispatch table and descriptor are made from."""
    module = package.replace("-", "_")
    return json.loads((ROOT / "packages" / package / "src" / module / "targets.json").read_text())["targets"]


def _isa_targets() -> list[str]:
    """Every backend target this workspace's installed builds hold, by name: kt-backend-avx's
    every target, kt-backend-amx's emulation build (.ci/setup's; the hardware one is
    amx_hardware_build's), kt-backend-blis's targets and the reference backend."""
    amx = [t["name"] for t in _targets("kt-backend-amx") if t["emulated"]]
    return ([f"avx/{t['name']}" for t in _targets("kt-backend-avx")] + [f"amx/{name}" for name in amx]
            + [f"blis/{t['name']}" for t in _targets("kt-backend-blis")] + ["reference/baseline"])


@nox.session
@nox.parametrize("target", _isa_targets())
def target_conformance(session, target):
    """One target's conformance against the reference backend, forced with KT_CPU_VARIANT, so a
    broken target fails by name; a target this host cannot execute is skipped, naming the
    missing features (kt-backend-avx's x86-64-v3 also runs under qemu in its own tests)."""
    session.run("python", "-m", "pytest", "-q", "-p", "kt_core.testing.plugin", "--kt-variant", target, "--pyargs",
                "kt_core.testing.conformance", "-rs", *session.posargs, env=AMX_EMULATION)


@nox.session
@nox.parametrize("target", [t["name"] for t in _targets("kt-backend-avx")])
def target_alone(session, target):
    """kt-backend-avx built with only this target (CMake's KT_AVX_TARGETS), installed apart from
    the workspace's build and run through the conformance suite: a target that only compiles,
    links or dispatches with the others' help fails here by name. Where the host cannot execute
    the target, the build and its dispatch table are still checked and the suite skips it."""
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        session.run("python", "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp,
                    f"--config-settings=cmake.define.KT_AVX_TARGETS={target}",
                    f"--config-settings=build-dir={tmp}/build", str(ROOT / "packages" / "kt-backend-avx"))
        (wheel,) = Path(tmp).glob("kt_backend_avx-*.whl")
        session.run("python", "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel))
        env = {"PYTHONPATH": str(site), **AMX_EMULATION}
        session.run("python", "-c", f"""
import kt_backend_avx as avx, kt_backend_avx._native as native
assert avx.__file__.startswith({str(site)!r}), avx.__file__
assert avx._build.TARGETS == ({target!r},), avx._build.TARGETS
assert [v.name for v in avx.descriptor.variants] == [{target!r}]
try:
    native.backend_api("not-{target}")
except ValueError as e:
    assert "has variants {target};" in str(e), e
else:
    raise AssertionError("a single-target build served another target")
""", env=env)
        session.run("python", "-m", "pytest", "-q", "-p", "kt_core.testing.plugin", "--kt-variant", f"avx/{target}",
                    "--pyargs", "kt_core.testing.conformance", "-rs", "-p", "no:cacheprovider", *session.posargs,
                    env=env)


@nox.session
def amx_hardware_build(session):
    """kt-backend-amx's hardware build (the real tile instructions) compiled into a wheel: it must
    build and its kernels must contain the tile instructions the emulation build stands in for;
    on a host with AMX its tests and the conformance suite run on the real tiles as well."""
    import zipfile
    with tempfile.TemporaryDirectory() as tmp:
        session.run("python", "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp,
                    str(ROOT / "packages" / "kt-backend-amx"), env={"KT_AMX_EMULATE": "OFF"})
        (wheel,) = Path(tmp).glob("kt_backend_amx-*.whl")
        with zipfile.ZipFile(wheel) as z:
            build = z.read("kt_backend_amx/_build.py").decode()
            assert 'VARIANT = "sapphire-rapids"' in build and "EMULATED = bool(0)" in build, build
            so = next(n for n in z.namelist() if n.startswith("kt_backend_amx/_native"))
            z.extract(so, tmp)
        disassembly = session.run("objdump", "-d", str(Path(tmp) / so), silent=True, external=True)
        for instruction in ("ldtilecfg", "tileloadd", "tilestored", "tdpbusd", "tdpbsud", "tdpbf16ps", "tilerelease"):
            assert instruction in disassembly, f"the hardware build has no {instruction}"
        session.log(f"{wheel.name}: sapphire-rapids build with the AMX tile instructions")
        probe = Path(tmp) / "amx_tile_probe"   # the tile-unit bounds docs/performance.md quotes; built everywhere
        session.run("g++", "-O2", "-Wall", "-Werror", "-mamx-tile", "-mamx-int8", str(ROOT / "benchmarks" / "amx_tile_probe.cpp"),
                    "-o", str(probe), external=True)
        missing = session.run("python", "-c", "from kt_core.host import host; "
                              "print(' '.join(host().missing(('amx_tile', 'amx_int8', 'amx_bf16'))))",
                              silent=True).strip()
        if missing:
            session.log(f"its kernels are not run: this host lacks {missing} (the emulation build ran them in `tests`)")
            return
        # An AMX host: run the hardware build's kernels too. Installed beside the emulation build,
        # first on PYTHONPATH: Python takes the first kt_backend_amx (module and entry point) there.
        hw = Path(tmp) / "hardware"
        session.run("python", "-m", "pip", "install", "-q", "--no-deps", "--target", str(hw), str(wheel))
        session.run(str(probe), external=True)
        env = {"PYTHONPATH": str(hw)}
        session.run("python", "-c", "import kt_backend_amx._build as b; assert not b.EMULATED, b.__file__", env=env)
        session.run("python", "-m", "pytest", "-q", str(ROOT / "packages" / "kt-backend-amx" / "tests"), env=env)
        # importlib mode: pytest's default would put site-packages (the conformance module's base)
        # in front of PYTHONPATH, and with it the emulation build.
        session.run("python", "-m", "pytest", "-q", "--import-mode=importlib", "-p", "kt_core.testing.plugin",
                    "--kt-backend", "amx", "--kt-variant", "amx/sapphire-rapids", "--pyargs", "kt_core.testing.conformance",
                    env={**env, "KT_AMX_MIN_ROWS": "0"})


@nox.session
def example(session):
    """Build the third-party example backend outside the workspace, against the installed
    kt-core's headers and CMake config, then run the conformance suite on it."""
    session.run("python", "-m", "pip", "install", "-q", "--no-build-isolation", str(EXAMPLE))
    try:
        session.run("kt", "backends")
        session.run("python", "-m", "pytest", "-q", "-p", "kt_core.testing.plugin", "--kt-backend", "example",
                    "--pyargs", "kt_core.testing.conformance")
    finally:
        session.run("python", "-m", "pip", "uninstall", "-q", "-y", "kt-backend-example")


def _build_wheel(session, source: Path) -> None:
    session.run("python", "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(WHEELHOUSE),
                str(source))


@nox.session
@nox.parametrize("package", [*PACKAGES, "kt-backend-example"])
def wheels(session, package):
    """One wheel per package into ./wheelhouse (backends build against the installed kt-core).
    kt-backend-avx is one wheel holding every x86 target; the host picks at run time."""
    _build_wheel(session, EXAMPLE if package == "kt-backend-example" else ROOT / "packages" / package)


@nox.session
def install_smoke(session):
    """`pip install kt-core kt-backend-avx` from the wheelhouse into a clean venv, outside the
    workspace: kt doctor, kt backends and a forward must work from the wheels alone."""
    for source in (ROOT / "packages" / "kt-core", ROOT / "packages" / "kt-backend-avx"):
        _build_wheel(session, source)
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        session.run(sys.executable, "-m", "venv", str(venv))
        py, kt = str(venv / "bin" / "python"), str(venv / "bin" / "kt")
        session.run(py, "-m", "pip", "install", "-q", "--find-links", str(WHEELHOUSE), "kt-core", "kt-backend-avx")
        env = {"PYTHONPATH": "", "PWD": tmp}
        session.chdir(tmp)
        session.run(kt, "doctor", env=env)
        session.run(kt, "backends", env=env)
        session.run(py, "-c", SMOKE_FORWARD, env=env)
        session.chdir(str(ROOT))


@nox.session
def packaging(session):
    """What a user building from source meets, checked on a fresh clone of HEAD:
    - `uv build --all-packages`: every package's sdist, then each wheel built from its sdist alone,
      in an isolated environment (kt-core's sdist holds its CMake helpers; the backends' builds
      get kt-core, and kt-backend-amx kt-backend-avx, as build requirements);
    - `pip wheel` of each sdist with only `--find-links` to the others (PyPI-style inputs);
    - `uv sync --all-packages`: a development environment whose `kt backends` sees every backend;
    - the wheels installed into a clean venv with only `--find-links`: kt doctor, a forward."""
    env = {"UV_FIND_LINKS": os.environ.get("PIP_FIND_LINKS", ""), "UV_NO_PROGRESS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        clone, dist = Path(tmp) / "kt", Path(tmp) / "dist"
        session.run("git", "clone", "-q", str(ROOT), str(clone), external=True)
        session.chdir(str(clone))
        session.run("uv", "build", "--all-packages", "-o", str(dist), env=env)
        sdists = sorted(dist.glob("*.tar.gz"))
        wheels = sorted(dist.glob("*.whl"))
        names = {p.name.split("-")[0] for p in sdists}
        assert names == {p.replace("-", "_") for p in PACKAGES}, (names, PACKAGES)
        assert len(wheels) == len(PACKAGES), wheels
        # Each sdist alone, as pip builds it from PyPI: build isolation, the sibling wheels as the index.
        rebuilt = Path(tmp) / "rebuilt"
        for sdist in sdists:
            session.run("python", "-m", "pip", "wheel", "-q", "--no-deps", "--find-links", str(dist), "-w", str(rebuilt),
                        str(sdist))
        assert len(list(rebuilt.glob("*.whl"))) == len(sdists), sorted(rebuilt.iterdir())
        session.run("uv", "sync", "--all-packages", env=env)
        backends = session.run(str(clone / ".venv" / "bin" / "kt"), "backends", "--json", silent=True, external=True,
                               env={"PYTHONPATH": ""})
        for name in ("reference", "avx", "amx", "blis"):
            assert f'"backend": "{name}"' in backends, backends
        venv = Path(tmp) / "venv"
        session.run(sys.executable, "-m", "venv", str(venv))
        py = str(venv / "bin" / "python")
        session.run(py, "-m", "pip", "install", "-q", "--find-links", str(dist), "kt", "kt-backend-avx", "kt-kernel-compat")
        session.chdir(tmp)
        session.run(str(venv / "bin" / "kt"), "doctor", env={"PYTHONPATH": ""}, external=True)
        session.run(py, "-c", SMOKE_FORWARD, env={"PYTHONPATH": ""}, external=True)
        # SGLang's kt integration imports these; kt's packages alone (no kt-kernel) provide them.
        session.run(py, "-c", "from kt_kernel import KTMoEWrapper, generate_gpu_experts_masks; "
                    "KTMoEWrapper.set_capture_batch_sizes([1, 2])", env={"PYTHONPATH": ""}, external=True)
        session.chdir(str(ROOT))


SMOKE_FORWARD = """
import numpy as np, kt_core
from kt_core.testing.reference import bf16_round, random_moe, random_routing, moe_reference, relative_error
assert "site-packages" in kt_core.__file__, kt_core.__file__
rng = np.random.default_rng(0)
w = random_moe(rng, 8, 64, 32)
x = rng.standard_normal((4, 64)).astype(np.float32)
ids, wt = random_routing(rng, 4, 8, 2)
assert any(d.descriptor and d.descriptor.name == "avx" for d in kt_core.backends.discover())
m = kt_core.MoE(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32, method="BF16")
m.load(*w)
err = relative_error(m(x, ids, wt), moe_reference(x, *[bf16_round(a) for a in w], ids, wt))
print(f"{m.backend}: error vs float64 over the bf16 weights {err:.2e}")
assert err < 1e-4
"""


@nox.session
def bench(session):
    """Microbenchmarks; JSON results under ./results, from which benchmarks/update_docs.py
    regenerates the marked sections of docs/performance.md.
    moe_layer.py (a quick set: Qwen3-30B-A3B layer, 1 and 32 tokens, every method, 1 thread and
    all cores) compares against kt-kernel 0.7.2 when benchmarks/setup_kt_kernel.sh has created
    .bench/kt-kernel-venv; its generated weights are kept in .bench/moe_layer_data for the next run.
    decode_ceiling.py: each method's cache-resident decode rate per core, and decode against a
    probe taken right before each batch."""
    results = ROOT / "results"
    results.mkdir(exist_ok=True)
    session.run("python", "benchmarks/overhead.py", "--json", str(results / "overhead.json"), *session.posargs)
    session.run("kt", "bench", "--model", "qwen3-30b-a3b", "--method", "BF16", "--method", "INT8", "--method", "INT4",
                "--json", str(results / "kt_bench_qwen3.json"), "--plot", str(results / "kt_bench_qwen3.png"))
    moe = ["python", "benchmarks/moe_layer.py", "--shapes", "qwen3-30b-a3b", "--tokens", "1", "32", "--repeats", "5",
           "--data-dir", str(ROOT / ".bench" / "moe_layer_data"), "--json", str(results / "moe_layer.json")]
    venv = ROOT / ".bench" / "kt-kernel-venv"
    if (venv / "bin" / "python").is_file():
        moe += ["--kt-kernel-venv", str(venv)]
    else:
        session.log("no .bench/kt-kernel-venv: kt-kernel columns skipped (benchmarks/setup_kt_kernel.sh creates it)")
    session.run(*moe)
    session.run("python", "benchmarks/decode_ceiling.py", "--json", str(results / "decode_ceiling.json"))
    session.run("python", "benchmarks/load_weights.py", "--layers", "4", "--experts", "128", "--json",
                str(results / "load_weights.json"))
    session.run("python", "benchmarks/update_docs.py", "--results", str(results))


# --- sanitizers (docs/reliability.md, "Sanitizers") -----------------------------------------
# Instrumented builds go to .sanitize/ (gitignored), never over the environment's own install:
# `pip install --target` puts them first on PYTHONPATH, and importlib.metadata then finds their
# entry points before the installed ones.
SANITIZE = ROOT / ".sanitize"
ASAN_FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"


def _gcc_runtime(name: str) -> str:
    """Absolute path of a gcc sanitizer runtime (libasan.so, libtsan.so)."""
    path = subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()
    if not os.path.isabs(path):
        raise RuntimeError(f"g++ has no {name}; install gcc's sanitizer runtimes (Debian: libasan8, libubsan1, libtsan2)")
    return os.path.realpath(path)


def _asan_env(site: Path) -> dict:
    # CPython is not instrumented, so libasan must be preloaded; libstdc++ with it, because
    # python does not link it: ASan resolves the real __cxa_throw when it starts, and with
    # libstdc++ loaded only later (by the first extension) the first C++ throw failed ASan's
    # own CHECK. Leak checking is off: the interpreter's own allocations outlive exit by
    # design. Every UBSan report aborts.
    return {"PYTHONPATH": str(site), "LD_PRELOAD": f"{_gcc_runtime('libasan.so')} {_gcc_runtime('libstdc++.so')}",
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:strict_init_order=1:detect_stack_use_after_return=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1", "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}


@nox.session
def asan(session):
    """kt-core and every backend package built with ASan+UBSan into .sanitize/asan (the
    environment's install is untouched; kt-backend-amx as its emulation build, as in CI), then
    the conformance suite (every backend, every variant this host runs), the concurrency tests,
    the packed-layer loads (pread, mmap) and the forward's argument paths under them. Any report
    fails the session. `nox -s asan -- -k INT4` narrows the conformance run."""
    site = SANITIZE / "asan" / "site"
    env = _asan_env(site)
    # In build order: the backends' CMake imports kt_core (the instrumented one, hence
    # LD_PRELOAD) for its CMake config, kt-backend-amx kt_backend_avx for its kernels.
    for package in NATIVE_PACKAGES:
        session.run("python", "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--upgrade",
                    "--target", str(site), f"--config-settings=build-dir={SANITIZE / 'asan' / 'build' / package}",
                    "--config-settings=cmake.build-type=RelWithDebInfo",
                    f"--config-settings=cmake.define.CMAKE_CXX_FLAGS={ASAN_FLAGS}",
                    f"--config-settings=cmake.define.CMAKE_MODULE_LINKER_FLAGS={ASAN_FLAGS}",
                    str(ROOT / "packages" / package), env={**env, **AMX_EMULATION})
    session.run("python", "-c", "import importlib.metadata as m, kt_core; "
                "eps = m.entry_points(group='kt.backends'); "
                "assert all('.sanitize' in str(e.dist.locate_file('')) for e in eps), [e.dist._path for e in eps]; "
                "print('instrumented:', sorted(e.name for e in eps))", env=env)
    session.run("python", "-m", "pytest", "-q", "-p", "kt_core.testing.plugin", "--pyargs", "kt_core.testing.conformance",
                *session.posargs, env={**env, **AMX_EMULATION})
    session.run("python", "-m", "pytest", "-q", "packages/kt-core/tests/test_concurrency.py",
                "packages/kt/tests/test_weights_packed.py", "packages/kt-core/tests/test_forward_arguments.py", env=env)


TSAN_SOURCES = ["pool/thread_pool.cpp", "host/topology.cpp", "host/cpu_features.cpp", "memory/numa_allocator.cpp",
                "moe/moe_layer.cpp", "moe/gated_activation.cpp", "abi/host_api.cpp"]


@nox.session
def tsan(session):
    """ThreadSanitizer on the thread pool, racing submit()/sync() and MoE forwards (different
    layers, one layer from several threads, reloads during forwards): sanitize/tsan_stress.cpp
    compiled with kt-core's native sources (CPython is not TSan-instrumented, so no Python).
    `nox -s tsan -- 20` runs 20 rounds (the long run) instead of 1."""
    native = ROOT / "packages" / "kt-core" / "native"
    out = SANITIZE / "tsan"
    out.mkdir(parents=True, exist_ok=True)
    hwloc = subprocess.run(["pkg-config", "--cflags", "--libs", "hwloc"], capture_output=True, text=True,
                           check=True).stdout.split()
    session.run("g++", "-std=c++20", "-O1", "-g", "-fsanitize=thread", "-fno-omit-frame-pointer", "-Wall", "-Wextra",
                "-Wno-unused-parameter", "-Wno-switch", f"-I{native}", f"-I{ROOT / 'packages' / 'kt-core' / 'include'}",
                str(ROOT / "sanitize" / "tsan_stress.cpp"), *(str(native / s) for s in TSAN_SOURCES), *hwloc,
                "-lpthread", "-o", str(out / "tsan_stress"), external=True)
    session.run(str(out / "tsan_stress"), *(session.posargs or ["1"]),
                env={"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}, external=True)


@nox.session
def abi(session):
    """kt/plugin.h against packages/kt-core/plugin-abi.lock: a header change without a version
    bump fails (after a deliberate bump: python tools/abi_hash.py --record), then the ABI
    matrix (plugins compiled against the 1.0 header and claiming newer versions)."""
    session.run("python", "tools/abi_hash.py")
    session.run("python", "-m", "pytest", "-q", "packages/kt-core/tests/test_abi_matrix.py", *session.posargs)


FUZZ_TARGETS = ("gguf", "checkpoint", "converted", "plugin")


@nox.session
def fuzz(session):
    """Each fuzz target (fuzz/fuzz_*.py; needs pip install atheris) for a bounded time on its
    seed corpus (rebuilt by fuzz/seeds.py into .fuzz/corpus, which keeps what earlier runs found).
    A crash leaves its input in .fuzz/crashes/<target>/: fix the reader, then add the input to
    fuzz/regressions/<target>/ (tests/test_fuzz_regressions.py replays them).
    `nox -s fuzz -- 300 plugin` runs only the plugin target, for 300 s."""
    seconds = session.posargs[0] if session.posargs else "30"   # four targets in about 4 minutes
    targets = session.posargs[1:] or FUZZ_TARGETS
    corpus, crashes = ROOT / ".fuzz" / "corpus", ROOT / ".fuzz" / "crashes"
    session.run("python", "fuzz/seeds.py", str(corpus), *targets)
    failed = []
    for target in targets:
        (crashes / target).mkdir(parents=True, exist_ok=True)
        try:
            session.run("python", f"fuzz/fuzz_{target}.py", str(corpus / target), f"-max_total_time={seconds}",
                        "-timeout=10", "-rss_limit_mb=4096", f"-artifact_prefix={crashes / target}/",
                        "-print_final_stats=1")
        except nox.command.CommandFailed:
            failed.append(target)
    if failed:
        session.error(f"fuzz targets that crashed: {', '.join(failed)}; inputs in {crashes}")


# qemu-aarch64 CPU models, what kt-core must detect on each (KT_EXPECT_*: tests/test_host_aarch64.py)
# and the kml variants the conformance suite runs there (None: every one the model has; (): none).
# The SVE targets run their SVE kernels at 256 and 512 bits and their NEON ones at 128 (kml's own
# tests cover that width); armv8.0 and armv8.2's conformance runs on the models made for them,
# armv8.6's on `max` at 512 bits.
_SVE = ("kml/sve", "kml/sve-i8mm-bf16")
AARCH64_CPUS = {
    "cortex-a72": ("neon", "", None),                                          # ARMv8.0: NEON only
    "neoverse-n1": ("asimddp,neon", "", None),                                 # ARMv8.2 + dotprod
    "max,sve-max-vq=1": ("asimddp,bf16,i8mm,neon,sve,sve2", "128", ()),        # SVE2, I8MM, BF16 at 128 bits
    "max,sve-max-vq=2": ("asimddp,bf16,i8mm,neon,sve,sve2", "256", _SVE),      # ... at 256 bits
    "max,sve-max-vq=4": ("asimddp,bf16,i8mm,neon,sve,sve2", "512", ("kml/armv8.6-i8mm-bf16", *_SVE)),   # ... and 512
}


# Conformance tests a CPU model leaves out (pytest -k): test_many_tokens (2000 tokens, kml and the
# reference oracle both emulated) took 14 of the 24.5 min of the 512-bit run on the AMX CI host —
# its chunking does not depend on the vector width, so the 256-bit run leaves it to the 512-bit one.
AARCH64_DESELECT = {"max,sve-max-vq=2": "not many_tokens"}


@nox.session
def aarch64(session):
    """kt on aarch64 without an ARM machine: aarch64 wheels of kt-core and kt-backend-kml cross-compiled
    with g++-aarch64-linux-gnu against an arm64 Debian root and pip-installed by the root's pip into an
    arm64 venv (tools/aarch64/), run under qemu-aarch64 on
    several CPU models: host detection (features, ISA level, SVE vector length), kt-backend-kml's
    tests and the conformance suite of every backend on each (a target the model lacks is skipped
    naming the feature, never SIGILL); the reference backend's conformance and kt-core's LoRA loops once."""
    session.run("tools/aarch64/build.sh", "kt-core", "kt-backend-kml", external=True)
    root = ROOT / ".aarch64" / "root"
    python = ROOT / ".aarch64" / "venv" / "bin" / "python"   # the arm64 venv the wheels were pip-installed into

    def qemu(cpu, *args, **extra):
        session.run("qemu-aarch64", "-cpu", cpu, "-L", str(root), str(python), *args, env=extra, external=True)

    for cpu, (features, sve_bits, variants) in AARCH64_CPUS.items():
        qemu(cpu, "-m", "pytest", "-q", "-p", "no:cacheprovider", "packages/kt-core/tests/test_host_aarch64.py",
             KT_EXPECT_ARM_FEATURES=features, KT_EXPECT_SVE_BITS=sve_bits)
        qemu(cpu, "-m", "kt_core.cli", "doctor")
        qemu(cpu, "-m", "kt_core.cli", "backends")
        qemu(cpu, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "packages/kt-backend-kml/tests")
        if variants == ():
            continue
        only = [arg for v in variants or () for arg in ("--kt-variant", v)]
        deselect = ["-k", AARCH64_DESELECT[cpu]] if cpu in AARCH64_DESELECT else []
        qemu(cpu, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "kt_core.testing.plugin", "--kt-backend",
             "kml", *only, *deselect, "--pyargs", "kt_core.testing.conformance", *session.posargs)
    qemu("neoverse-n1", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "kt_core.testing.plugin", "--kt-backend",
         "reference", "--pyargs", "kt_core.testing.conformance", *session.posargs)
    # kt-core's training loops (kt_core.lora: compiled for the baseline ISA on aarch64)
    qemu("neoverse-n1", "-m", "pytest", "-q", "-p", "no:cacheprovider", "packages/kt-core/tests/test_grouped_lora.py",
         "-k", "in_process or refuses")
