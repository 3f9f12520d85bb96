"""LoRAExperts: a layer's routed experts on kt, frozen, with trainable per-expert LoRA.

    experts = LoRAExperts(moe, rank=8, alpha=16)             # moe: kt_core.MoE(..., trainable=True), loaded
    out = experts(hidden [T, H], top_k_index [T, k], top_k_weights [T, k])
    out.sum().backward()     # gradients of hidden, top_k_weights and the LoRA factors

The LoRA sits where PEFT's `target_parameters` puts it on a transformers 5 experts module: one
adapter on the fused gate_up projection (A [E, r, H] shared by gate and up, B [E, 2I, r]) and one
on down (A [E, r, I], B [E, H, r]), delta W_e = scaling * B_e A_e, scaling = alpha / rank — so
an adapter trained here is a PEFT adapter of the same model (kt.training.peft_format).
Experts with biases and GPT-OSS's clamped SwiGLU (a MoE made with expert_bias=True, swiglu_limit=)
train the same way, their biases frozen. The whole block runs on kt as one autograd node
(kt.training.routed_experts over kt_core.training_step), in float32 on the CPU, whatever the device
and dtype of the hidden states (the output goes back to both).

Full fine-tuning (`expert_weights=(gate_up, down)`, the model's own parameters — kt's orientation,
[E, 2I, H] with gate above up and [E, H, I], or GPT-OSS's input-first interleaved one with
`input_first=True`, `interleaved_gate_up=True` and its two biases after them: kt.integrations.
transformers.expert_layout): the experts' weights (and biases) train too — registered here under
`weight_names` (the model's, so the model's state dict keeps its keys and save_pretrained writes an
ordinary checkpoint), their gradients from kt's backward. kt computes with its packed copy (the
method's precision: FP32, or BF16 from the parameters' values); each forward re-packs it when the
parameters changed since the last: an optimizer stepped them (a global optimizer step hook marks
the layer: fused optimizers update in place without bumping version counters) or anything else
wrote them in place (load_state_dict, an edit under no_grad: their version counters say). rank=0
then trains the weights alone.
With GPU-resident experts (`moe.gpu_experts_mask`), their weights train where they live: the
resident_* tensors become parameters on the model's device (their gradients, and an optimizer's
state for them, stay there), while kt trains the model's parameters for the others. The model's
parameters hold every expert, so the resident experts' rows there are a copy, brought up to date
whenever the state dict is taken (save_pretrained, a Trainer checkpoint) and read back into the
resident parameters when one is loaded.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from kt_core.errors import KTError
from kt_core.moe import MoE
from kt_core.training_step import ExpertStep

from ..integrations.transformers.expert_layout import ExpertLayout
from ..integrations.transformers.experts import resident_biases as resident_biases_of
from ..integrations.transformers.experts import resident_picks, resident_slots
from ..integrations.transformers.experts import resident_weights as resident_weights_of
from .routed_experts import RoutedExperts

TARGETS = ("gate_up", "gate", "up", "down")
DEFAULT_TARGET = ("gate_up", "down")
MAX_RANK = 64   # kt_core.lora's loops (kt-core's kMaxLoraRank)
TRAINABLE_WEIGHT_METHODS = ("BF16", "FP32")
RESIDENT_WEIGHTS = ("resident_gate_up", "resident_down", "resident_gate_up_bias", "resident_down_bias")


def check_trainable_weights(method: str) -> None:
    """Whether kt trains the routed experts' own weights with this method (patch_model(train_experts=True)
    asks before touching the model, LoRAExperts per layer): a float one, as kt packs them again after
    each optimizer step."""
    if method.upper() not in TRAINABLE_WEIGHT_METHODS:
        raise KTError(f"training the expert weights needs a float method ({' or '.join(TRAINABLE_WEIGHT_METHODS)}): "
                      f"kt packs them again after every optimizer step; got {method}")


def is_adapter(name: str) -> bool:
    """Whether a LoRAExperts parameter (or a state-dict key ending in one) is an adapter factor; the
    others are the expert weights, when they train."""
    return name.endswith(("_A", "_B"))


# id(expert weight parameter) -> the LoRAExperts training it, for the optimizer step hook below.
_TRAINED_WEIGHTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_step_hook = None


def _mark_stepped(optimizer, args, kwargs) -> None:
    """After any optimizer's step: the layers whose expert weights it holds must re-pack them."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            layer = _TRAINED_WEIGHTS.get(id(p))
            if layer is not None and any(w is p for w in layer.expert_weights()):
                layer._stepped = True


def lora_targets(target: Sequence[str]) -> tuple[str, ...]:
    """The adapters a `target` list asks for, in canonical order. "gate_up" is one adapter on the fused
    gate/up projection (an A shared by gate and up: PEFT's target_parameters on gate_up_proj);
    "gate" and "up" are one adapter each (kt-kernel's SFT layout); "down" is the down projection's."""
    names = set(target)
    unknown = names - set(TARGETS)
    if unknown:
        raise KTError(f"LoRA target {sorted(unknown)} is not one of {', '.join(TARGETS)}")
    if "gate_up" in names and names & {"gate", "up"}:
        raise KTError("LoRA target 'gate_up' (one adapter on the fused gate/up projection) and 'gate' / 'up' "
                      "(one adapter each) are alternatives: name one or the other")
    out = tuple(t for t in TARGETS if t in names)
    if not out:
        raise KTError(f"LoRA target is empty: name at least one of {', '.join(TARGETS)}")
    return out


class LoRAExperts(nn.Module):
    """resident_gate_up [G, 2I, H] / resident_down [G, H, I] (on the model's device, in its dtype): the
    weights of the experts `moe.gpu_experts_mask` marks GPU-resident, computed by torch there with
    their rows of the same adapters (autograd carries their gradients); kt computes the rest."""

    def __init__(self, moe: MoE, *, rank: int, alpha: float, target: Sequence[str] = DEFAULT_TARGET,
                 recompute: bool = False, resident_gate_up: torch.Tensor | None = None,
                 resident_down: torch.Tensor | None = None, interleaved_gate_up: bool = False,
                 expert_weights: tuple[nn.Parameter, ...] | None = None,
                 weight_names: tuple[str, ...] = ("gate_up_proj", "down_proj"), input_first: bool = False,
                 resident_bias: tuple[torch.Tensor, torch.Tensor] | None = None, expert_modules: bool = False,
                 peft_in_out_swapped: bool = False):
        super().__init__()
        if not moe.trainable:
            raise KTError("LoRAExperts needs a kt_core.MoE made with trainable=True (kernels with transposed tiles)")
        lowest = 0 if expert_weights is not None else 1   # no adapters: the expert weights alone train
        if isinstance(rank, bool) or not isinstance(rank, int) or not lowest <= rank <= MAX_RANK:
            raise KTError(f"lora_rank must be an integer in [{lowest}, {MAX_RANK}], got {rank!r}"
                          + (" (0, no adapters, only when the expert weights train)" if lowest else ""))
        if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
            raise KTError(f"lora_alpha must be a positive number, got {alpha!r}")
        self.moe = moe
        self.rank, self.alpha, self.scaling = rank, float(alpha), float(alpha) / max(rank, 1)
        self.targets = lora_targets(target) if rank else ()
        if "gate" in self.targets and "up" in self.targets and 2 * rank > MAX_RANK:
            raise KTError(f"lora_rank {rank} with separate gate and up adapters: they run as one adapter of rank "
                          f"{2 * rank} on the fused projection, and kt takes ranks up to {MAX_RANK}")
        # Recompute: keep only the inputs and run the experts' forward again in backward — memory of a
        # step without the rows' intermediate activations.
        self.recompute = bool(recompute)
        # The model's fused gate_up parameter holds gate and up as even / odd outputs (GPT-OSS): PEFT's
        # gate_up B follows it, kt's is [gate | up] (peft_format reorders B's rows).
        self.interleaved_gate_up = bool(interleaved_gate_up)
        self.layout = ExpertLayout(input_first=bool(input_first), interleaved=self.interleaved_gate_up)
        # PEFT reads a 3-D expert parameter as [E, out, in] unless its module says `is_transposed`
        # (GPT-OSS does; Llama 4's [E, in, out] does not): PEFT's A then acts on the output side and
        # its B on the input, kt's factors swapped and transposed (peft_format converts).
        self.peft_in_out_swapped = bool(peft_in_out_swapped)
        # The model held these experts as one Linear module each (DeepSeek's / Kimi-K2's remote code):
        # PEFT's adapters for them are per module (peft_expert_modules.py).
        self.expert_modules = bool(expert_modules)
        self.step = ExpertStep(moe)
        resident = [e for e, g in enumerate(moe.gpu_experts_mask) if g]
        if resident and moe.expert_bias and resident_bias is None:
            raise KTError("the layer's experts have biases: give the GPU-resident ones' as resident_bias "
                          "(gate|up [G, 2I], down [G, H])")
        if len(resident) == moe.num_experts:
            raise KTError("every expert of this layer is GPU-resident: nothing is left for kt (lower num_gpu_experts)")
        if resident and (resident_gate_up is None or resident_down is None
                         or resident_gate_up.shape[0] != len(resident) or resident_down.shape[0] != len(resident)):
            raise KTError(f"the layer's gpu_experts_mask marks {len(resident)} experts GPU-resident; give their weights "
                          "as resident_gate_up [G, 2I, H] and resident_down [G, H, I]")
        device = resident_gate_up.device if resident else torch.device("cpu")
        # Buffers, so model.to(device) takes the resident experts and their slot map along.
        self.register_buffer("resident_slot", resident_slots(moe.gpu_experts_mask).to(device), persistent=False)
        self.register_buffer("resident_experts", torch.tensor(resident, dtype=torch.int64), persistent=False)
        # The resident experts' weights: frozen buffers, or parameters when the expert weights train
        # (never in the state dict: the model's own expert parameters hold them under their names).
        weights = dict(zip(RESIDENT_WEIGHTS, (resident_gate_up, resident_down) + (resident_bias or (None, None))))
        for name, w in weights.items():
            w = w if resident else None
            if expert_weights is not None and w is not None:
                self.register_parameter(name, nn.Parameter(w.detach()))
            else:
                self.register_buffer(name, w, persistent=False)
        E, H, I = moe.num_experts, moe.hidden_size, moe.intermediate_size
        shapes = {"gate_up": ((E, rank, H), (E, 2 * I, rank)), "gate": ((E, rank, H), (E, I, rank)),
                  "up": ((E, rank, H), (E, I, rank)), "down": ((E, rank, I), (E, H, rank))}
        for t in self.targets:
            a_shape, b_shape = shapes[t]
            # PEFT's default: A ~ kaiming_uniform(a=sqrt(5)) over its input features = U(±1/sqrt(in)), B = 0.
            bound = 1.0 / math.sqrt(a_shape[2])
            self.register_parameter(f"{t}_A", nn.Parameter(torch.empty(a_shape).uniform_(-bound, bound)))
            self.register_parameter(f"{t}_B", nn.Parameter(torch.zeros(b_shape)))
        self.weight_names = None
        if expert_weights is not None:
            self._take_expert_weights(expert_weights, weight_names)

    def _take_expert_weights(self, weights: tuple[nn.Parameter, ...], names: tuple[str, ...]) -> None:
        moe = self.moe
        E, H, I = moe.num_experts, moe.hidden_size, moe.intermediate_size
        check_trainable_weights(moe.method)
        shapes = self.layout.shapes(E, H, I) + (((E, 2 * I), (E, H)) if moe.expert_bias else ())
        if len(weights) != len(shapes) or len(names) != len(shapes):
            raise KTError(f"expert weights: this layer's experts {'have' if moe.expert_bias else 'have no'} biases, so "
                          f"{len(shapes)} parameters train (gate_up, down{', their biases' if moe.expert_bias else ''}); "
                          f"got {len(weights)} parameters and {len(names)} names")
        for w, shape, name in zip(weights, shapes, names):
            if not isinstance(w, nn.Parameter) or tuple(w.shape) != shape:
                raise KTError(f"expert weight {name}: expected an nn.Parameter of shape {list(shape)}, got "
                              f"{type(w).__name__} {list(getattr(w, 'shape', []))}")
        self.weight_names = tuple(names)
        for name, w in zip(names, weights):
            self.register_parameter(name, w)
            _TRAINED_WEIGHTS[id(w)] = self
        global _step_hook
        if _step_hook is None:
            _step_hook = register_optimizer_step_post_hook(_mark_stepped)
        self._packed_from, self._stepped = self._weights_key(), False   # the caller loaded the layer from them

    def expert_weights(self) -> tuple[nn.Parameter, ...] | None:
        """(gate_up, down[, gate_up bias, down bias]) in the model's layout when they train, else None."""
        return None if self.weight_names is None else tuple(getattr(self, n) for n in self.weight_names)

    def resident_weights(self) -> tuple[nn.Parameter, ...]:
        """The GPU-resident experts' weights when they train (gate|up [G, 2I, H], down [G, H, I][, their
        biases]), else ()."""
        return tuple(p for n, p in self._parameters.items() if n in RESIDENT_WEIGHTS and p is not None)

    def sync_resident_weights(self) -> None:
        """Write the trained GPU-resident experts' weights into their rows of the model's expert
        parameters (which then hold every expert as trained: what the state dict gives)."""
        resident = self.resident_weights()
        if not resident:
            return
        rows = self.resident_experts
        model_form = (self.layout.model_gate_up, self.layout.model_down, self.layout.model_gate_up_bias, lambda b: b)
        with torch.no_grad():
            for w, r, to_model in zip(self.expert_weights(), resident, model_form):
                w.index_copy_(0, rows.to(w.device), to_model(r.detach()).to(w.device, w.dtype))

    def _read_resident_weights(self) -> None:
        """The trained GPU-resident parameters from their rows of the model's expert parameters (after
        a state dict was loaded into those), in place: an optimizer holding them keeps them."""
        resident = self.resident_weights()
        if not resident:
            return
        weights = self.expert_weights()
        mask = self.moe.gpu_experts_mask
        gate_up, down = resident_weights_of(*self.layout.kt_weights(*weights[:2]), mask)
        biases = resident_biases_of(self.layout.kt_biases(*weights[2:]), mask) if len(weights) == 4 else ()
        with torch.no_grad():
            for r, w in zip(resident, (gate_up, down, *biases)):
                r.copy_(w)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """The model's expert parameters, brought up to date with the resident experts' training, under
        their own names; the resident parameters themselves are not keys of the model's checkpoint."""
        self.sync_resident_weights()
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in RESIDENT_WEIGHTS:
            destination.pop(prefix + name, None)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        trained_resident = [n for n in RESIDENT_WEIGHTS if self._parameters.get(n) is not None]
        for name in trained_resident:   # not expected: the model's expert parameters hold them
            if prefix + name in missing_keys:
                missing_keys.remove(prefix + name)
        if trained_resident and all(prefix + n in state_dict for n in self.weight_names):
            self._read_resident_weights()

    def _weights_key(self) -> tuple:
        return tuple((w.data_ptr(), w._version) for w in self.expert_weights())

    def _repack_if_changed(self) -> None:
        """Pack the trained weights again when they changed since kt last packed them."""
        key = self._weights_key()
        if key == self._packed_from and not self._stepped:
            return
        weights = [w.detach().cpu() for w in self.expert_weights()]
        biases = self.layout.kt_biases(*weights[2:]) if len(weights) == 4 else None
        with torch.no_grad():
            self.moe.load(*self.layout.kt_weights(*weights[:2]), biases=biases)
        self._packed_from, self._stepped = key, False

    def _apply(self, fn, recurse=True):
        """model.to(device / dtype) reaches this module's buffers and the trained GPU-resident
        parameters — the GPU-resident experts and their slot map, which belong on the model's device
        in its dtype — but not the other parameters: kt computes with the adapters (and trained expert
        weights) on the CPU in float32, so a model moved to a GPU trains its attention there and its
        routed experts here."""
        for name, buf in self._buffers.items():
            if buf is not None:
                self._buffers[name] = fn(buf)
        for p in self.resident_weights():   # moved in place, as nn.Module moves parameters
            with torch.no_grad():
                p.data = fn(p.data)
            if p.grad is not None:
                p.grad = fn(p.grad)
        return self

    def extra_repr(self) -> str:
        return (f"experts={self.moe.num_experts}, kt={self.moe.method} on {self.moe.backend}, rank={self.rank}, "
                f"alpha={self.alpha:g}, target={self.targets}, recompute={self.recompute}, "
                f"gpu_resident={self.resident_experts.numel()}, trains_weights={self.weight_names is not None}")

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        device, dtype = hidden_states.device, hidden_states.dtype
        x = hidden_states.to("cpu", torch.float32)
        ids, weights = top_k_index.to("cpu"), top_k_weights.to("cpu", torch.float32)
        slot = None
        if self.resident_experts.numel():
            slot = self.resident_slot[top_k_index.to(self.resident_slot.device)]   # resident slot of each pick
            ids = ids.masked_fill(slot.to("cpu") >= 0, -1)   # those picks are torch's, not kt's
        gate_up = self._gate_up_lora()
        gu_a, gu_b, blocks = gate_up if gate_up is not None else (None, None, 1)
        down_a, down_b = (self.down_A, self.down_B) if "down" in self.targets else (None, None)
        trained = (None,) * 4
        if self.weight_names is not None:
            self._repack_if_changed()
            trained = (*self.expert_weights(), None, None)[:4]
        out = RoutedExperts.apply(x, weights, gu_a, gu_b, down_a, down_b, *trained, self.step, ids, self.scaling,
                                  blocks, self.recompute and torch.is_grad_enabled(), self.layout).to(device, dtype)
        if slot is not None:
            out = out + self._resident(hidden_states, slot, top_k_weights)
        return out

    def _resident(self, hidden: torch.Tensor, slot: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The GPU-resident picks, by torch on the model's device in its dtype, each with its expert's
        rows of the adapters (moved there; autograd takes their gradients back to the CPU factors)."""
        dense = self.gate_up_adapter()
        dev, dt = hidden.device, hidden.dtype

        def delta(s: int, product: str, x: torch.Tensor) -> torch.Tensor | None:
            e = int(self.resident_experts[s])
            if product == "gate_up":
                a, b = (None, None) if dense is None else dense
            else:
                a, b = (self.down_A, self.down_B) if "down" in self.targets else (None, None)
            if a is None:
                return None
            return self.scaling * F.linear(F.linear(x, a[e].to(dev, dt)), b[e].to(dev, dt))

        biases = None if self.resident_gate_up_bias is None else (self.resident_gate_up_bias, self.resident_down_bias)
        return resident_picks(hidden, slot, weights, self.resident_gate_up, self.resident_down, delta, biases=biases,
                              swiglu=self.moe.swiglu)

    def _gate_up_lora(self) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """What the forward runs on the fused gate/up product: (A, B, blocks). Separate gate and up
        adapters go as A's stacked and B's concatenated along the outputs, blocks=2 (kt_core.lora's
        block-diagonal B: each half of the product its own adapter, no zero blocks computed)."""
        if "gate" in self.targets and "up" in self.targets:
            return (torch.cat([self.gate_A, self.up_A], dim=1), torch.cat([self.gate_B, self.up_B], dim=1), 2)
        adapter = self.gate_up_adapter()
        return None if adapter is None else (*adapter, 1)

    def gate_up_adapter(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(A [E, r', H], B [E, 2I, r']) of the fused gate/up projection: the gate_up adapter itself, or
        the separate gate and up adapters as one of rank 2r (A's stacked, B block-diagonal: the same
        products, and autograd routes each block's gradient back to its own factor)."""
        if "gate_up" in self.targets:
            return self.gate_up_A, self.gate_up_B
        parts = [t for t in ("gate", "up") if t in self.targets]
        if not parts:
            return None
        E, I, r = self.moe.num_experts, self.moe.intermediate_size, self.rank
        a = torch.cat([getattr(self, f"{t}_A") for t in parts], dim=1)
        rows = []
        for t in ("gate", "up"):   # B's row blocks: gate's outputs, then up's
            blocks = [getattr(self, f"{t}_B") if t == u else torch.zeros(E, I, r) for u in parts]
            rows.append(torch.cat(blocks, dim=2))
        return a, torch.cat(rows, dim=1)
