"""Folders kt-kernel 0.7.2 quantized (AMXINT8 / AMXINT4, `convert_cpu_weights.py`'s merged
safetensors or the wrapper's `_layer_L/_numa_N` dumps) load into kt exactly: the same codes and
scales, decoded once from kt-kernel's tiles. The cross-check against kt-kernel itself needs its
venv (benchmarks/setup_kt_kernel.sh; KT_KERNEL_VENV, default .bench/kt-kernel-venv)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from kt.testing.kt_kernel_folders import tile, write_kt_kernel_folder
from kt.weights.kt_kernel_folder import KtKernelFolder, untile
from kt_core import KTMoEWrapper
from kt_core.errors import KTError
from kt_core.testing.quantize import bf16_round
from kt_core.testing.reference import moe_reference, random_moe, random_routing, relative_error

ROOT = Path(__file__).resolve().parents[3]
E, H, TOP_K = 4, 256, 2


def run(folder, method, intermediate, tokens=9, seed=1):
    rng = np.random.default_rng(seed)
    kt = KTMoEWrapper(0, E, TOP_K, H, intermediate, weight_path=str(folder), method=method, chunked_prefill_size=64)
    kt.load_weights()
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids, w = random_routing(rng, tokens, E, TOP_K)
    out = kt.forward(torch.from_numpy(x), torch.from_numpy(ids), torch.from_numpy(w)).double().numpy()
    return kt, x, ids, w, out


@pytest.mark.parametrize("bits,n,k", [(8, 64, 128), (8, 96, 192), (4, 64, 256), (4, 32, 384)])
def test_tiles_round_trip(bits, n, k):
    q = np.random.default_rng(n + k).integers(-7 if bits == 4 else -127, 8 if bits == 4 else 128, (n, k)).astype(np.int8)
    raw = tile(q, bits)
    assert raw.nbytes == n * k * bits // 8
    np.testing.assert_array_equal(untile(raw, n, k, bits), q)


def test_tiles_refuse_partial_blocks():
    with pytest.raises(KTError, match=r"tiles cover 32 rows x 128 k; a \[32, 64\] slice"):
        untile(np.zeros(32 * 32, np.int8), 32, 64, 4)


# (method, bits, NUMA slices, intermediate, merged safetensors or dumps, bound on the error vs
# the codes' own weights): kt computes with exactly those weights, so only its kernel error is
# left — except INT8 down of several slices, requantized per row (one more rounding).
CASES = [("AMXINT8", 8, 1, 128, True, 5e-3), ("AMXINT8", 8, 2, 128, True, 3e-2), ("AMXINT4", 4, 1, 128, True, 5e-3),
         ("AMXINT4", 4, 2, 256, False, 5e-3), ("AMXINT8", 8, 1, 128, False, 5e-3)]


@pytest.mark.parametrize("method,bits,slices,inter,merged,bound", CASES)
def test_folder_loads_as_its_codes(tmp_path, method, bits, slices, inter, merged, bound):
    weights = random_moe(np.random.default_rng(slices + bits), E, H, inter)
    truth = write_kt_kernel_folder(tmp_path, *weights, bits=bits, slices=slices, merged=merged)
    kt, x, ids, w, out = run(tmp_path, method, inter)
    assert kt._moe.method == ("INT8" if bits == 8 else "INT4")
    err = relative_error(out, moe_reference(x, *truth, ids, w))
    fmt = relative_error(out, moe_reference(x, *weights, ids, w))
    print(f"\n{method} slices={slices} merged={merged}: vs stored codes {err:.2e}, vs floats {fmt:.2e}")
    assert err < bound, err


def test_geometry_comes_from_the_files(tmp_path):
    """Hidden from down's row scales, intermediate from the slices' gate scales, the method from the
    bytes; INT4's group is the largest kt group inside one slice (kt-kernel's INT4 slices are
    whole 128-k tiles, so 128)."""
    write_kt_kernel_folder(tmp_path, *random_moe(np.random.default_rng(0), E, H, 256), bits=4, slices=2, merged=False)
    assert KtKernelFolder.open(tmp_path).geometry(0) == (H, 256, "INT4", 128)
    kt, *_ = run(tmp_path, "AMXINT4", 256)
    assert (kt._moe.method, kt._moe.group_size) == ("INT4", 128)
    with pytest.raises(KTError, match=r"has hidden=256, intermediate=256; the layer was created with .*intermediate_size=128"):
        run(tmp_path, "AMXINT4", 128)


def test_wrong_method_and_incomplete_folders_are_named(tmp_path):
    write_kt_kernel_folder(tmp_path, *random_moe(np.random.default_rng(0), E, H, 128), bits=8, merged=False)
    with pytest.raises(KTError, match=r"holds kt-kernel AMXINT8 experts, kt's INT8; the layer asks for INT4"):
        run(tmp_path, "AMXINT4", 128)
    next((tmp_path / "_layer_0" / "_numa_0").glob("INT8_up_2_*quant_.kt")).unlink()
    with pytest.raises(KTError, match=r"lacks up weight of expert 2, NUMA slice 0"):
        run(tmp_path, "AMXINT8", 128)


def _kt_kernel_python():
    venv = Path(os.environ.get("KT_KERNEL_VENV", ROOT / ".bench" / "kt-kernel-venv"))
    py = venv / "bin" / "python"
    if not py.is_file():
        pytest.skip(f"needs kt-kernel 0.7.2's venv at {venv} (benchmarks/setup_kt_kernel.sh, or KT_KERNEL_VENV)")
    return py


@pytest.mark.parametrize("method,slices,inter", [("AMXINT8", 1, 128), ("AMXINT8", 2, 128), ("AMXINT4", 1, 128),
                                                 ("AMXINT4", 2, 256)])
def test_against_kt_kernel(tmp_path, method, slices, inter):
    """kt-kernel quantizes and saves a layer and runs it; kt loads the saved files. Both compute
    with the same stored weights, so they differ by their activation rounding only: kt-kernel's
    one int8 pass and bf16 output cost it 7-8 % against the floats on INT8, where kt's two passes
    leave 5 % of INT8's own; measured kt vs kt-kernel 7.5-8.6 % on all four, INT4 included, whose
    format error against the floats is ~100 % on both sides (a misread tile would be that far off)."""
    py = _kt_kernel_python()
    rng = np.random.default_rng(5)
    weights = [bf16_round(m).astype(np.float32) for m in random_moe(rng, E, H, inter)]
    x = bf16_round(rng.standard_normal((16, H))).astype(np.float32)
    ids, w = random_routing(rng, 16, E, TOP_K)
    np.savez(tmp_path / "w.npz", gate=weights[0], up=weights[1], down=weights[2])
    np.savez(tmp_path / "x.npz", hidden=x, ids=ids, weights=w)
    script = ROOT / "packages/kt/src/kt/bench/kt_kernel/kt_kernel_dump.py"
    r = subprocess.run([str(py), str(script), "--weights", str(tmp_path / "w.npz"), "--inputs", str(tmp_path / "x.npz"),
                        "--method", method, "--slices", str(slices), "--out", str(tmp_path / "kk")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    theirs = np.load(tmp_path / "kk" / "output.npy").astype(np.float64)
    kt = KTMoEWrapper(0, E, TOP_K, H, inter, weight_path=str(tmp_path / "kk"), method=method, chunked_prefill_size=64)
    kt.load_weights()
    ours = kt.forward(torch.from_numpy(x), torch.from_numpy(ids), torch.from_numpy(w)).double().numpy()
    diff = relative_error(ours, theirs)
    fmt = relative_error(ours, moe_reference(x, *weights, ids, w))
    print(f"\n{method} slices={slices}: kt vs kt-kernel {diff:.2e} (each vs the floats: kt {fmt:.2e}, kt-kernel "
          f"{relative_error(theirs, moe_reference(x, *weights, ids, w)):.2e})")
    assert diff < 0.15, diff


def test_patch_model_serves_a_kt_kernel_folder(tmp_path):
    """patch_model(weight_path=<kt-kernel AMXINT4 folder>) takes the folder's group and computes
    with its codes: the logits of a tiny Qwen3-MoE whose experts are those codes' weights."""
    from kt.integrations.transformers import patch_model

    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3MoeConfig(vocab_size=64, hidden_size=H, intermediate_size=256, moe_intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      num_experts=E, num_experts_per_tok=TOP_K, decoder_sparse_step=1,
                                      mlp_only_layers=[], norm_topk_prob=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    truth = {}
    for layer in range(2):
        weights = random_moe(np.random.default_rng(layer), E, H, 128)
        truth[layer] = write_kt_kernel_folder(tmp_path, *weights, bits=4, slices=1, layer=layer, merged=False)
    with torch.no_grad():
        for layer, block in enumerate(model.model.layers):
            gate, up, down = truth[layer]
            block.mlp.experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([gate, up], axis=1)))
            block.mlp.experts.down_proj.copy_(torch.from_numpy(down))
        ids = torch.arange(12).reshape(1, 12) % 64
        ref = model(ids).logits
        p = patch_model(model, method="AMXINT4", weight_path=tmp_path)
        got = model(ids).logits
    assert {m.moe.group_size for m in p.layers.values()} == {128}
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert err < 2e-3, err
