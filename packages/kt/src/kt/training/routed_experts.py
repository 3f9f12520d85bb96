"""The routed experts with their LoRA as one autograd node over kt_core.training_step.ExpertStep.

kt computes the whole block — the products with the frozen packed weights forward and transposed,
the per-expert adapters, the gated activation, gathering the tokens and summing the picks — as one
explicit forward and backward (kt_core.training_step: buffers reused across steps, the adapters'
input gradients added in place); autograd sees one node whose inputs are the hidden states, the
routing weights and the adapters' factors. The factors come in as the step runs them: separate gate
and up adapters as A's stacked and B's concatenated (blocks=2), built by torch ops outside the node,
so autograd routes each block's gradient back to its own parameter.

recompute=True keeps only the node's inputs between forward and backward and runs the forward again
inside backward (what torch.utils.checkpoint would do, without the activations ever being kept).

Full fine-tuning: the expert weights themselves (gate_up [E, 2I, H], down [E, H, I], whatever their
device and dtype) come in as inputs too. The forward does not read them — the step computes with the
packed copy kt made of them (LoRAExperts re-packs after each change) — but backward gives their
gradients (training_step.expert_weight_grads), so autograd accumulates them like any parameter's.
"""

from __future__ import annotations

import weakref

import torch

from kt_core.training_step import Adapters, ExpertStep, Saved, expert_weight_grads


def _step(ctx) -> ExpertStep:
    # The graph holds the layer weakly: a strong reference from an autograd node keeps the native
    # layer alive past interpreter shutdown whenever a graph outlives its script (nanobind reports
    # it as a leak). The experts module that ran the forward owns the step.
    step = ctx.step()
    if step is None:
        raise RuntimeError("backward through kt experts whose layer has been freed (the LoRAExperts module that ran "
                           "the forward was deleted)")
    return step


class RoutedExperts(torch.autograd.Function):
    """x [T, H], weights [T, k] (float32, CPU), the adapters' factors (float32, or None), the expert
    weights when they train (or None) -> out [T, H].

    What backward needs goes through ctx.save_for_backward (saved-tensor hooks see it: offloading,
    memory accounting); the routing's small index tensors ride on ctx."""

    @staticmethod
    def forward(ctx, x, weights, gate_up_a, gate_up_b, down_a, down_b, gate_up_w, down_w, step: ExpertStep,
                ids: torch.Tensor, scaling: float, blocks: int, recompute: bool):
        factors = (gate_up_a, gate_up_b, down_a, down_b)
        adapters = None
        if any(f is not None for f in factors):
            gu_a, gu_b, d_a, d_b = (None if f is None else f.detach().contiguous() for f in factors)
            adapters = Adapters(scaling, gu_a, gu_b, blocks, d_a, d_b)
        ctx.step, ctx.has, ctx.adapters, ctx.consumed = weakref.ref(step), tuple(f is not None for f in factors), \
            adapters, False
        ctx.recompute = recompute
        ctx.expert_weights = gate_up_w, down_w   # only their shape, dtype and device are read
        keep = any(ctx.needs_input_grad) and not recompute
        out, saved = step.forward(x.detach(), ids, weights.detach(), adapters, save=keep)
        if recompute:
            ctx.ids = ids
            ctx.save_for_backward(x.detach(), weights.detach())
        elif saved is not None:
            ctx.routing = saved.routing
            ctx.save_for_backward(saved.x, saved.gate_up, saved.picked, saved.xa_gate_up, saved.xa_down)
        return out

    @staticmethod
    def backward(ctx, dout):
        if ctx.consumed:   # its buffers went back to the pool the first time
            raise RuntimeError("backward through kt experts a second time (retain_graph) is not supported: the step's "
                               "activations were consumed by the first")
        ctx.consumed = True
        step = _step(ctx)
        if ctx.recompute:   # the forward again, kept this time
            x, weights = ctx.saved_tensors
            _, saved = step.forward(x, ctx.ids, weights, ctx.adapters, save=True)
        else:
            x, gate_up, picked, xa_gate_up, xa_down = ctx.saved_tensors
            saved = Saved(x, ctx.routing, gate_up, picked, ctx.adapters, xa_gate_up, xa_down)
        gate_up_w, down_w = ctx.expert_weights
        weight_grads = None
        if ctx.needs_input_grad[6] or ctx.needs_input_grad[7]:
            d_gate_up = torch.zeros(gate_up_w.shape, dtype=torch.float32)
            d_down = torch.zeros(down_w.shape, dtype=torch.float32)

            def weight_grads(routing, rows, dgate_up, h, dy):
                for e, dgu, dd in expert_weight_grads(routing, rows, dgate_up, h, dy):
                    d_gate_up[e], d_down[e] = dgu, dd

        grads = step.backward(saved, dout, weight_grads=weight_grads)
        factor_grads = (grads.gate_up_a, grads.gate_up_b, grads.down_a, grads.down_b)
        expert_grads = (None, None) if weight_grads is None else \
            (d_gate_up.to(gate_up_w.device, gate_up_w.dtype), d_down.to(down_w.device, down_w.dtype))
        return (grads.x, grads.weights, *(g if has else None for g, has in zip(factor_grads, ctx.has)),
                *expert_grads, None, None, None, None, None)
