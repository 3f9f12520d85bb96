"""Training's row passes around the expert products (what kt.training's autograd nodes run).

One pass over memory each, on kt's pool; arrays float32 (indices int64), C-contiguous, on the CPU,
outputs written in place:

    gather_rows(x [T, W], token [S], rows [S, W])                     rows[i] = x[token[i]]
    sum_rows(rows [S, W], row_of_slot [T, K], out [T, W])             out[t] = sum_j rows[row_of_slot[t, j]] (-1 skipped)
    gated_rows_forward(gate_up [S, 2I], w [S], h [S, I])              h = SiLU(gate) * up * w
    gated_rows_backward(dh, gate_up, w, dgate_up [S, 2I], dw [S])     its gradients

gather_rows and sum_rows are each other's backward; sum_rows adds a token's rows in slot order, so
the result does not depend on the thread count.
"""

from __future__ import annotations

from . import _native, pool


def gather_rows(x, token, rows) -> None:
    pool.ensure()
    _native.gather_rows(x, token, rows)


def sum_rows(rows, row_of_slot, out) -> None:
    pool.ensure()
    _native.sum_rows(rows, row_of_slot, out)


def gated_rows_forward(gate_up, w, h) -> None:
    pool.ensure()
    _native.gated_rows_forward(gate_up, w, h)


def gated_rows_backward(dh, gate_up, w, dgate_up, dw) -> None:
    pool.ensure()
    _native.gated_rows_backward(dh, gate_up, w, dgate_up, dw)
