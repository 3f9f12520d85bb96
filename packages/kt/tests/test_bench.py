"""`kt bench` behaviour on tiny shapes: flags, JSON schema, plot, refusal. Not its speed."""

import json

import pytest

from conftest import run_python

TINY = ["--hidden", "64", "--intermediate", "32", "--experts", "4", "--top-k", "2", "--tokens", "1", "--tokens", "40",
        "--threads", "1", "--repeats", "2", "--warmup", "1", "--bandwidth-mib", "16"]


def kt(*args, **env):
    return run_python(f"import sys; from kt_core.cli import main; sys.exit(main([*{list(args)!r}]))", **env)


def test_json_schema_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    r = kt("bench", *TINY, "--method", "BF16", "--method", "FP32", "--json", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr + r.stdout
    data = json.loads(out.read_text())
    assert data["schema_version"] == 2
    assert data["shape"] == {"name": "custom", "hidden": 64, "intermediate": 32, "experts": 4, "top_k": 2, "moe_layers": 1}
    assert set(data["bandwidth"]) == {"1"} and data["bandwidth"]["1"]["median_gbps"] > 0
    assert [g["group"] for g in data["bandwidth"]["1"]["per_group"]] == [0]
    assert set(data["peak"]) == {"BF16 N=1", "FP32 N=1"}      # kt's kernel peak, apart from the hardware's roof
    from kt_core import probes

    assert list(data["compute_roof"]["1"]) == probes.compute_peak_kinds()
    assert all(v > 0 for v in data["compute_roof"]["1"].values())
    kinds = {r["method"]: r["roof_kind"] for r in data["rows"]}
    assert kinds["FP32"] in ("f32_fma", "kernel_peak")
    assert kinds["BF16"] == next((k for k in ("bf16_dot", "f32_fma") if k in data["compute_roof"]["1"]), "kernel_peak")
    assert {(r["method"], r["tokens"]) for r in data["rows"]} == {("BF16", 1), ("BF16", 40), ("FP32", 1), ("FP32", 40)}
    for row in data["rows"]:
        assert row["median_ms"] > 0 and row["gbps"] > 0 and 0 < row["roofline_fraction"]
        # the bound is the nearer limit, read from the two ratios, not from the token count
        fractions = {"memory": row["bandwidth_fraction"], "compute": row["compute_fraction"]}
        assert row["bound"] == max(fractions, key=fractions.get)
        assert row["roofline_fraction"] == fractions[row["bound"]]
    assert set(data["estimate"]["decode_tokens_per_s"]) == {"BF16", "FP32"}
    assert "all routed experts on this CPU" in data["estimate"]["assumption"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fast_activations_reach_the_layers(tmp_path):
    out = tmp_path / "bench.json"
    r = kt("bench", *TINY, "--method", "INT8", "--fast-activations", "--json", str(out))
    assert r.returncode == 0, r.stderr + r.stdout
    data = json.loads(out.read_text())
    assert data["config"]["fast_activations"] is True
    assert data["layers"]["INT8"]["fast_activations"] is True   # read back from the layer itself
    assert "kt: fast_activations" in r.stdout
    default = tmp_path / "default.json"
    assert kt("bench", *TINY, "--method", "INT8", "--json", str(default)).returncode == 0
    assert json.loads(default.read_text())["layers"]["INT8"]["fast_activations"] is False


def test_preset_shapes_are_used():
    from kt.models.shapes import SHAPES

    assert SHAPES["deepseek-v3"].experts == 256 and SHAPES["qwen3-30b-a3b"].intermediate == 768


def test_the_kt_kernel_harness_shapes_restate_the_presets():
    """moe_data.py runs in kt-kernel's venv without kt, so it keeps its own rows: they must agree."""
    from kt.bench.kt_kernel import moe_data
    from kt.models.shapes import SHAPES

    q, d = moe_data.SHAPES["qwen3-30b-a3b"], moe_data.SHAPES["deepseek-v3-64e"]
    assert (q.hidden, q.intermediate, q.experts, q.top_k) == tuple(getattr(SHAPES["qwen3-30b-a3b"], f) for f in
                                                                   ("hidden", "intermediate", "experts", "top_k"))
    v3 = SHAPES["deepseek-v3"]
    assert (d.hidden, d.intermediate, d.top_k) == (v3.hidden, v3.intermediate, v3.top_k)   # cut to 64 experts


def test_oversized_shape_is_refused_with_what_would_fit():
    r = kt("bench", "--hidden", "8192", "--intermediate", "8192", "--experts", "512", "--top-k", "8", "--tokens", "1",
           "--method", "BF16")
    assert r.returncode == 2
    assert "needs about" in r.stderr and "GiB is available" in r.stderr and "--experts" in r.stderr


def test_fewer_experts_advice_stays_below_the_model_s_count():
    from kt.bench import BenchConfig, MemoryRefusal, run
    from kt.models.shapes import MoEShape

    shape = MoEShape("m", 2048, 1024, 64, 8, 1)
    cfg = BenchConfig(shape=shape, methods=["BF16"], tokens=[1], threads=[1], memory_limit_bytes=200 * 2**20)
    with pytest.raises(MemoryRefusal, match=r"--experts (\d+)") as e:
        run(cfg)
    import re

    assert int(re.search(r"--experts (\d+)", str(e.value)).group(1)) < 64


@pytest.mark.parametrize(("args", "message"), [
    (["--tokens", "0"], "Invalid value for '--tokens'"),
    (["--method", "INT5"], "INT5: not a method of any installed backend"),
    (["--threads", "0"], "Invalid value for '--threads'"),
])
def test_bad_flags_are_refused_before_any_work(args, message):
    r = kt("bench", "--model", "olmoe-1b-7b", *args)
    assert r.returncode == 2 and message in r.stdout + r.stderr, r.stdout + r.stderr


def test_plot_without_matplotlib_is_refused_before_the_benchmark(tmp_path):
    code = ("import sys, importlib.util; real = importlib.util.find_spec; "
            "importlib.util.find_spec = lambda n, *a: None if n == 'matplotlib' else real(n, *a); "
            f"from kt_core.cli import main; sys.exit(main(['bench', *{TINY!r}, '--plot', 'x.png']))")
    r = run_python(code)
    assert r.returncode == 2 and "needs matplotlib: pip install 'kt[plot]'" in r.stdout + r.stderr
    assert "bandwidth" not in r.stdout   # nothing ran


def test_unknown_model_and_missing_shape_flags():
    r = kt("bench", "--model", "gpt-9")
    assert r.returncode != 0 and "unknown model 'gpt-9'" in (r.stdout + r.stderr)
    r = kt("bench", "--hidden", "64")
    assert r.returncode != 0 and "missing --intermediate, --experts, --top-k" in (r.stdout + r.stderr)


def test_method_no_backend_provides_is_refused():
    r = kt("bench", *TINY, "--method", "MXFP3", "--method", "FP32")
    assert r.returncode == 2, r.stderr + r.stdout
    assert "MXFP3: not a method of any installed backend" in r.stderr


def test_compare_kt_kernel_needs_a_venv(tmp_path):
    r = kt("bench", *TINY, "--method", "BF16", "--compare-kt-kernel", str(tmp_path / "nowhere"))
    assert r.returncode == 1
    assert "benchmarks/setup_kt_kernel.sh" in r.stderr


def test_compare_kt_kernel_adds_its_column(tmp_path):
    from pathlib import Path

    venv = Path(__file__).resolve().parents[3] / ".bench" / "kt-kernel-venv"
    if not (venv / "bin" / "python").is_file():
        pytest.skip(f"needs kt-kernel 0.7.2 in {venv} (benchmarks/setup_kt_kernel.sh)")
    out = tmp_path / "bench.json"
    r = kt("bench", "--hidden", "256", "--intermediate", "128", "--experts", "4", "--top-k", "2", "--tokens", "1",
           "--threads", "1", "--repeats", "2", "--bandwidth-mib", "16", "--method", "BF16",
           "--compare-kt-kernel", str(venv), "--json", str(out))
    assert r.returncode == 0, r.stderr + r.stdout
    row = json.loads(out.read_text())["rows"][0]
    assert row["kt_kernel_ms"] > 0 and row["speedup_vs_kt_kernel"] > 0


def test_presets_and_model_folders_go_through_the_registry(tmp_path):
    import json

    from kt.models.shapes import SHAPES, shape_for

    assert (SHAPES["deepseek-v3"].moe_layers, SHAPES["kimi-k2"].experts, SHAPES["glm-4.5"].moe_layers) == (58, 384, 89)
    cfg = {"model_type": "minimax_m2", "hidden_size": 64, "intermediate_size": 32, "num_local_experts": 4,
           "num_experts_per_tok": 2, "num_hidden_layers": 3}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = shape_for(str(tmp_path))
    assert (shape.hidden, shape.intermediate, shape.experts, shape.top_k, shape.moe_layers) == (64, 32, 4, 2, 3)


def test_bandwidth_per_numa_group(tmp_path):
    # Two virtual NUMA groups on this host's cores: one figure per group, all measured at once.
    out = tmp_path / "bench.json"
    args = list(TINY)
    args[args.index("--threads") + 1] = "2"
    r = kt("bench", *args, "--method", "FP32", "--json", str(out), KT_VIRTUAL_NUMA="2")
    assert r.returncode == 0, r.stderr + r.stdout
    groups = json.loads(out.read_text())["bandwidth"]["2"]["per_group"]
    assert [(g["group"], g["threads"]) for g in groups] == [(0, 1), (1, 1)]
    assert all(g["median_gbps"] > 0 for g in groups)
    assert "per NUMA group, all at once" in r.stdout


def test_the_harness_mxfp4_matches_kt_core_s_rule():
    """moe_data.py's MXFP4 decode (it runs in kt-kernel's venv too) and the bf16 scales it hands
    kt-kernel restate docs/formats.md: equal to kt_core's dequantizer, scales exact in bf16."""
    import numpy as np
    import torch

    from kt.bench.kt_kernel import moe_data
    from kt_core.testing.quantize import dequantize_mxfp4

    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    blocks, scales = moe_data.pack_mxfp4(w)
    scales[0, :3] = (0, 1, 254)   # E8M0's ends: 2^-127 is a bf16 subnormal
    np.testing.assert_array_equal(moe_data.dequantize_mxfp4(blocks, scales), dequantize_mxfp4(blocks, scales))
    as_bf16 = torch.from_numpy(moe_data.e8m0_as_bf16_bits(scales)).view(torch.bfloat16).double().numpy()
    np.testing.assert_array_equal(as_bf16, np.ldexp(1.0, scales.astype(np.int64) - 127))
    assert moe_data.format_bytes_per_expert(moe_data.Shape("s", 256, 128, 4, 2), "MXFP4") == 3 * (128 * 256 // 2 + 128 * 8)


def test_the_harness_nvfp4_and_mxfp8_match_kt_core_s_rules():
    """moe_data.py's NVFP4 / MXFP8 decoders (they run in kt-kernel's venv too) restate
    docs/formats.md: equal to kt_core's dequantizers on the bytes the harness writes."""
    import numpy as np
    import torch

    from kt.bench.kt_kernel import moe_data
    from kt_core.testing.quantize import dequantize_mxfp8, dequantize_nvfp4

    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    blocks, scales, glob = moe_data.pack_nvfp4(w)
    np.testing.assert_array_equal(moe_data.dequantize_nvfp4(blocks, scales, glob), dequantize_nvfp4(blocks, scales, glob))
    codes, exps = moe_data.pack_mxfp8(w)
    np.testing.assert_array_equal(moe_data.dequantize_mxfp8(codes, exps), dequantize_mxfp8(codes, exps))
    shape = moe_data.Shape("s", 256, 128, 4, 2)
    assert moe_data.format_bytes_per_expert(shape, "NVFP4") == 3 * (128 * 256 // 2 + 128 * 16 + 4)
    assert moe_data.format_bytes_per_expert(shape, "MXFP8") == 3 * (128 * 256 + 128 * 8)
