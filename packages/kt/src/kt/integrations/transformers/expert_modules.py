"""MoE blocks that hold one MLP module per routed expert and loop over them themselves: the modeling
code DeepSeek-V2 / V3 and Kimi-K2 ship beside their checkpoints (loaded with trust_remote_code=True).

Such a block's `experts` is an nn.ModuleList of MLPs (gate_proj, up_proj, down_proj Linear layers —
the class its shared experts and the dense layers' MLPs are built from too); its router returns
(top-k indices, top-k weights[, aux loss]) and, in eval mode, its forward hands them to
`self.moe_infer(x [T, H], indices [T, k], weights [T, k]) -> [T, H]`. kt replaces `experts` with its
own module (called as transformers 5's experts are: experts(x, indices, weights)) and answers the
block's moe_infer with it, so the block's routing, shared experts and scaling stay the model's code.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import nn

from kt_core.errors import KTError

from ...models import ExpertNames


def holds_expert_modules(block: nn.Module, attr: str) -> bool:
    return isinstance(getattr(block, attr, None), nn.ModuleList)


def _moe_infer_on_kt(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weight: torch.Tensor) -> torch.Tensor:
    # An instance attribute: it shadows the class's @torch.no_grad() loop, so kt's training experts
    # get their gradients through it.
    return self.experts(x, topk_ids, topk_weight).to(x.dtype)


def run_moe_infer_on(block: nn.Module, experts: nn.Module) -> None:
    """Put kt's `experts` module in the block and route its moe_infer to it."""
    block.experts = experts
    if not callable(getattr(type(block), "moe_infer", None)):
        raise KTError(f"{type(block).__name__} holds its experts as a module list but has no moe_infer(x, "
                      "topk_ids, topk_weight) method; kt knows only blocks that loop over their experts there")
    block.moe_infer = types.MethodType(_moe_infer_on_kt, block)   # MethodType: deepcopy rebinds it


class _AddAuxiliaryLoss(torch.autograd.Function):
    """y unchanged forward; backward also hands the loss a gradient of 1, so minimising the model's
    loss minimises the router's auxiliary loss with it (what DeepSeek-V2's training branch does)."""

    @staticmethod
    def forward(ctx, y, loss):
        ctx.loss_shape, ctx.loss_dtype, ctx.loss_device = loss.shape, loss.dtype, loss.device
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.ones(ctx.loss_shape, dtype=ctx.loss_dtype, device=ctx.loss_device)


def _computes_aux_loss(gate) -> bool:
    """DeepSeek-V2's router in training mode with aux_loss_alpha > 0 returns a balance loss third;
    routers with aux-loss-free balancing (noaux_tc: DeepSeek-V3, Kimi-K2) have no training branch."""
    return (isinstance(gate, nn.Module) and gate.training and float(getattr(gate, "alpha", 0.0) or 0.0) > 0.0
            and getattr(gate, "topk_method", None) != "noaux_tc")


def _forward_routing_as_in_eval(self, *args, **kwargs):
    # Such a block runs its eval branch in training too: its own training branch loops over the expert
    # modules kt replaced, and DeepSeek-V3's / Kimi-K2's router has no training branch (it asserts not
    # training). The eval branch is differentiable — the routing weights are gathered scores and
    # moe_infer is kt's autograd node. A router that computes an auxiliary loss in training
    # (DeepSeek-V2's) keeps its training mode; the loss it returns, which the eval branch drops, is
    # added as the training branch adds it.
    gate = getattr(self, "gate", None)
    keep = _computes_aux_loss(gate)
    modules = [m for m in (self, gate) if isinstance(m, nn.Module) and not (keep and m is gate)]
    modes = [m.training for m in modules]
    returned = []
    hook = gate.register_forward_hook(lambda module, inputs, output: returned.append(output)) if keep else None
    for m in modules:
        m.training = False
    try:
        y = type(self).forward(self, *args, **kwargs)
    finally:
        for m, mode in zip(modules, modes):
            m.training = mode
        if hook is not None:
            hook.remove()
    aux = [o[2] for o in returned if isinstance(o, tuple) and len(o) > 2 and isinstance(o[2], torch.Tensor)]
    if aux and aux[0].requires_grad and torch.is_grad_enabled():
        y = _AddAuxiliaryLoss.apply(y, aux[0])
    return y


def train_through_moe_infer(block: nn.Module) -> None:
    """Let a block whose experts kt runs (run_moe_infer_on) train: its forward takes the eval branch."""
    block.forward = types.MethodType(_forward_routing_as_in_eval, block)


def expert_module_weights(experts: nn.ModuleList, names: ExpertNames, layer: int):
    """(shape (E, I, H), the per-expert weight tensors, whether they are meta, and a function giving
    gate [E, I, H], up [E, I, H], down [E, H, I] stacked — made when asked: one layer's copy at a time)."""
    weights = []
    for e, expert in enumerate(experts):
        if expert is None:
            raise KTError(f"layer {layer}: expert {e} is None (the model was built for expert parallelism, "
                          "ep_size > 1); build it with all experts in this process")
        row = []
        for proj in (names.gate, names.up, names.down):
            linear = getattr(expert, proj, None)
            w = getattr(linear, "weight", None)
            if not isinstance(w, torch.Tensor) or w.dim() != 2:
                raise KTError(f"layer {layer}: expert {e} has no {proj} Linear layer (found "
                              f"{type(linear).__name__}); kt reads experts as gate_proj / up_proj / down_proj")
            if getattr(linear, "bias", None) is not None:
                raise KTError(f"layer {layer}: expert {e}'s {proj} has a bias; kt's experts compute without biases "
                              "in this layout")
            if not w.dtype.is_floating_point or w.element_size() < 2:
                raise KTError(f"layer {layer}: expert {e}'s {proj} holds {w.dtype} weights (a quantized layer); "
                              "load the model with kt's load_model and give patch_model weight_path= the folder, "
                              "which kt reads as stored")
            row.append(w)
        weights.append(row)
    if not weights:
        raise KTError(f"layer {layer}: the block's expert list is empty")
    (g, u, d) = weights[0]
    shape = (len(weights), g.shape[0], g.shape[1])
    for e, (ge, ue, de) in enumerate(weights):
        if ge.shape != g.shape or ue.shape != g.shape or tuple(de.shape) != (g.shape[1], g.shape[0]):
            raise KTError(f"layer {layer}: expert {e}'s gate / up / down are {list(ge.shape)} / {list(ue.shape)} / "
                          f"{list(de.shape)}; expected [{g.shape[0]}, {g.shape[1]}] twice and "
                          f"[{g.shape[1]}, {g.shape[0]}], as expert 0's")
    meta = any(w.is_meta for row in weights for w in row)

    def stacked() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(torch.stack([row[i].detach() for row in weights]) for i in range(3))

    params = tuple(w for row in weights for w in row)
    return shape, params, meta, stacked


def unload_expert_modules(block: nn.Module, attr: str, to_meta: Callable[[nn.Module], None]) -> nn.ModuleList:
    """Every expert module of a block built by load_model loses its parameters (`to_meta` each); the list."""
    experts = getattr(block, attr)
    for expert in experts:
        for module in expert.modules():
            to_meta(module)
    return experts
