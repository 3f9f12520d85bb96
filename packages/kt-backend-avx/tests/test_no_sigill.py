"""Target selection never executes an instruction the CPU lacks: import and a forward under
qemu-user emulating older CPUs (Haswell: AVX2 only; Westmere: no AVX at all)."""

import platform
import shutil
import subprocess
import sys
import textwrap

import pytest

QEMU = shutil.which("qemu-x86_64")
PROBE = textwrap.dedent("""
    import numpy as np, kt_core
    from kt_core.testing.reference import bf16_round, moe_reference, random_moe, random_routing, relative_error
    rng = np.random.default_rng(0)
    w = random_moe(rng, 4, 64, 32)
    m = kt_core.MoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32, method="BF16")
    m.load(*w)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    ids, wt = random_routing(rng, 3, 4, 2)
    want = moe_reference(x, *[bf16_round(a) for a in w], ids, wt)
    print(kt_core.host().isa_level, m.backend, relative_error(m(x, ids, wt), want))
""")

pytestmark = [
    pytest.mark.skipif(platform.machine() != "x86_64", reason="emulates x86 CPUs on an x86-64 host"),
    pytest.mark.skipif(QEMU is None, reason="needs qemu-x86_64 (Debian package qemu-user)"),
]


@pytest.mark.parametrize("cpu,isa,backend", [("Haswell", "x86-64-v3", "avx/x86-64-v3"),
                                              ("Westmere", "x86-64-v2", "reference/baseline")])
def test_older_cpu_gets_a_variant_it_can_run(cpu, isa, backend):
    r = subprocess.run([QEMU, "-cpu", cpu, sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode} under -cpu {cpu} (SIGILL is -4):\n{r.stderr[-2000:]}"
    got_isa, got_backend, err = r.stdout.split()
    assert (got_isa, got_backend) == (isa, backend)
    assert float(err) < 1e-4
