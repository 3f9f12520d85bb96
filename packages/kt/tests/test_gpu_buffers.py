"""Layerwise prefill's weight writes (kt-kernel's submit_/sync_write_weight_scale_to_buffer, which
SGLang's kt integration calls per expert): each GPU rank's host buffers receive exactly its rows of
gate and up and its columns of down, with their scales, in the checkpoint's own format."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from kt.testing.checkpoints import write_checkpoint  # noqa: E402
from kt.weights import Checkpoint  # noqa: E402
from kt.weights.experts import checkpoint_experts  # noqa: E402
from kt_core import KTError, KTMoEWrapper  # noqa: E402

H, I, E, TP = 256, 512, 4, 2


def raw(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    elif t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    return t.numpy()


def expected(folder, layer, expert, r):
    """(w13, w13 scale, w2, w2 scale) bytes of rank r, sliced here from the checkpoint's tensors."""
    gate, up, down, scales, _ = checkpoint_experts(Checkpoint(folder), layer, expert)
    share = I // TP
    rows = slice(r * share, (r + 1) * share)
    unit = 8 if gate.dtype == torch.int32 else 1   # RAWINT4 packs 8 codes per int32 along K
    w13 = np.concatenate([raw(gate)[rows], raw(up)[rows]]).tobytes()
    w2 = raw(down)[:, r * share // unit:(r + 1) * share // unit].copy().tobytes()
    if scales is None:
        return w13, b"", w2, b""
    gs, us, ds = (raw(s) for s in scales)
    per = I // gs.shape[0]          # rows of gate per scale row: 128 (FP8 blocks) or 1 (RAWINT4)
    srows = slice(r * share // per, (r + 1) * share // per)
    kcols = I // ds.shape[1]        # columns of down per scale column: 128 or the group size
    w2s = ds[:, r * share // kcols:(r + 1) * share // kcols].copy().tobytes()
    return w13, np.concatenate([gs[srows], us[srows]]).tobytes(), w2, w2s


@pytest.mark.parametrize(("model_type", "quant", "method"), [("qwen3_moe", None, "BF16"), ("deepseek_v3", "fp8", "FP8"),
                                                             ("kimi_k2", "rawint4", "RAWINT4")])
def test_each_rank_receives_its_slices(tmp_path, model_type, quant, method):
    write_checkpoint(tmp_path, model_type, hidden=H, intermediate=I, experts=E, quant=quant, keep_truth=False)
    layer = Checkpoint(tmp_path).spec.moe_layers[0]
    kt = KTMoEWrapper(layer_idx=layer, num_experts=E, num_experts_per_tok=2, hidden_size=H, moe_intermediate_size=I,
                      weight_path=str(tmp_path), chunked_prefill_size=16, method=method, backend="reference")
    for expert in (0, E - 1):
        want = [expected(tmp_path, layer, expert, r) for r in range(TP)]
        bufs = [[np.full(len(part) + 64, 0xAB, np.uint8) for part in rank] for rank in want]
        ptrs = [[b.ctypes.data if len(p) else 0 for b, p in zip(rank_bufs, rank)] for rank_bufs, rank in zip(bufs, want)]
        kt.submit_write_weight_scale_to_buffer(TP, expert, *[[ptrs[r][i] for r in range(TP)] for i in range(4)])
        kt.sync_write_weight_scale_to_buffer()
        for r in range(TP):
            for part, buf in zip(want[r], bufs[r]):
                assert buf[:len(part)].tobytes() == part, (method, expert, r)
                assert (buf[len(part):] == 0xAB).all(), "wrote past its part"


def test_bad_requests_say_what_is_wrong(tmp_path):
    write_checkpoint(tmp_path, "qwen3_moe", hidden=H, intermediate=I, experts=E, keep_truth=False)
    layer = Checkpoint(tmp_path).spec.moe_layers[0]
    kw = dict(layer_idx=layer, num_experts=E, num_experts_per_tok=2, hidden_size=H, moe_intermediate_size=I,
              chunked_prefill_size=16, backend="reference")
    kt = KTMoEWrapper(weight_path=str(tmp_path), method="BF16", **kw)
    buf = np.zeros(1 << 20, np.uint8)
    with pytest.raises(ValueError, match="w13_weight_ptrs lists 1 addresses; gpu_tp_count is 2"):
        kt.submit_write_weight_scale_to_buffer(2, 0, [buf.ctypes.data], [0, 0], [buf.ctypes.data] * 2, [0, 0])
        kt.sync_write_weight_scale_to_buffer()
    with pytest.raises(ValueError, match=r"expert_id 9 is outside \[0, 4\)"):
        kt.submit_write_weight_scale_to_buffer(1, 9, [0], [0], [0], [0])
    int8 = KTMoEWrapper(weight_path=str(tmp_path), method="AMXINT8", cpu_save=True, **kw)
    with pytest.raises(KTError, match="method INT8 keeps only its own packed layout"):
        int8.submit_write_weight_scale_to_buffer(1, 0, [buf.ctypes.data], [0], [buf.ctypes.data], [0])
        int8.sync_write_weight_scale_to_buffer()
    none = KTMoEWrapper(method="BF16", **kw)
    with pytest.raises(KTError, match="reads the expert from weight_path, and this KTMoEWrapper has none"):
        none.submit_write_weight_scale_to_buffer(1, 0, [0], [0], [0], [0])
