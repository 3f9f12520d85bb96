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

Full fine-tuning: the expert weights themselves (gate_up, down and, for experts with biases, their
biases; in the model's layout, device and dtype: `layout`, kt.integrations.transformers.expert_layout)
come in as inputs too. The forward does not read them — the step computes with the packed copy kt made of them
(LoRAExperts re-packs after each change) — but backward gives their gradients
(training_step.expert_weight_grads / expert_bias_grads, in kt's orientation, then put in the model's
shapes), so autograd accumulates them like any parameter's.
"""

from __future__ import annotations

import weakref

import torch

from kt_core.training_step import Adapters, ExpertStep, Saved, expert_bias_grads, expert_weight_grads

from ..integrations.transformers.expert_layout import ExpertLayout


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
    weights and biases when they train (or None; in `layout`) -> out [T, H].

    What backward needs goes through ctx.save_for_backward (saved-tensor hooks see it: offloading,
    memory accounting); the routing's small index tensors ride on ctx."""

    @staticmethod
    def forward(ctx, x, weights, gate_up_a, gate_up_b, down_a, down_b, gate_up_w, down_w, gate_up_bias, down_bias,
                step: ExpertStep, ids: torch.Tensor, scaling: float, blocks: int, recompute: bool,
                layout: ExpertLayout):
        factors = (gate_up_a, gate_up_b, down_a, down_b)
        adapters = None
        if any(f is not None for f in factors):
            gu_a, gu_b, d_a, d_b = (None if f is None else f.detach().contiguous() for f in factors)
            adapters = Adapters(scaling, gu_a, gu_b, blocks, d_a, d_b)
        ctx.step, ctx.has, ctx.adapters, ctx.consumed = weakref.ref(step), tuple(f is not None for f in factors), \
            adapters, False
        ctx.recompute = recompute
        # Only their shape, dtype and device are read.
        ctx.expert_weights, ctx.layout = (gate_up_w, down_w, gate_up_bias, down_bias), layout
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
        gate_up_w, down_w, gate_up_b, down_b = ctx.expert_weights
        layout: ExpertLayout = ctx.layout
        weight_grads = None
        expert_grads = (None, None, None, None)
        if any(ctx.needs_input_grad[6:10]):
            E, H, I = step.moe.num_experts, step.moe.hidden_size, step.moe.intermediate_size
            d_gate_up = torch.zeros((E, 2 * I, H), dtype=torch.float32)   # kt's orientation, then the model's
            d_down = torch.zeros((E, H, I), dtype=torch.float32)
            biased = gate_up_b is not None
            d_gate_up_b = torch.zeros((E, 2 * I), dtype=torch.float32) if biased else None
            d_down_b = torch.zeros((E, H), dtype=torch.float32) if biased else None

            def weight_grads(routing, rows, dgate_up, h, dy, picked):
                for e, dgu, dd in expert_weight_grads(routing, rows, dgate_up, h, dy):
                    d_gate_up[e], d_down[e] = dgu, dd
                if biased:
                    for e, dgub, ddb in expert_bias_grads(routing, dgate_up, dy, picked):
                        d_gate_up_b[e], d_down_b[e] = dgub, ddb

        grads = step.backward(saved, dout, weight_grads=weight_grads)
        if weight_grads is not None:
            def like(g, p):
                return g.to(p.device, p.dtype)

            expert_grads = (like(layout.model_gate_up(d_gate_up), gate_up_w), like(layout.model_down(d_down), down_w),
                            None if d_gate_up_b is None else like(layout.model_gate_up_bias(d_gate_up_b), gate_up_b),
                            None if d_down_b is None else like(d_down_b, down_b))
        factor_grads = (grads.gate_up_a, grads.gate_up_b, grads.down_a, grads.down_b)
        return (grads.x, grads.weights, *(g if has else None for g, has in zip(factor_grads, ctx.has)),
                *expert_grads, None, None, None, None, None, None)
