"""How a transformers model holds its routed experts' weights, against kt's orientation.

kt's: gate_up [E, 2I, H] with gate's I outputs above up's, down [E, H, I] (output-first, as torch's
Linear), biases (gate [E, I], up [E, I], down [E, H]). Most families store exactly that. GPT-OSS
stores them input-first — gate_up [E, H, 2I] with gate and up interleaved (even / odd outputs),
down [E, I, H] — with biases gate_up [E, 2I] (interleaved) and down [E, H]. ExpertLayout gives kt's
views of the model's tensors (to pack them) and puts kt's gradients back into the model's shapes (to
hand them to autograd), so the model's own parameters train whatever their layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def interleave(t: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] from kt's [gate | up] rows to even (gate) / odd (up) ones."""
    half = t.shape[1] // 2
    return torch.stack([t[:, :half], t[:, half:]], dim=2).reshape(t.shape)


def deinterleave(t: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] from even / odd rows to kt's [gate | up]."""
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)


@dataclass(frozen=True)
class ExpertLayout:
    input_first: bool = False   # [E, H, 2I] / [E, I, H]: x @ W (GPT-OSS)
    interleaved: bool = False   # gate and up as even / odd outputs of gate_up

    def shapes(self, E: int, H: int, I: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The model's gate_up and down shapes for experts of hidden H, intermediate I."""
        return ((E, H, 2 * I), (E, I, H)) if self.input_first else ((E, 2 * I, H), (E, H, I))

    def kt_weights(self, gate_up: torch.Tensor, down: torch.Tensor):
        """(gate [E, I, H], up [E, I, H], down [E, H, I]): views of the model's tensors."""
        g = gate_up.transpose(1, 2) if self.input_first else gate_up
        half = g.shape[1] // 2
        gate, up = (g[:, 0::2], g[:, 1::2]) if self.interleaved else (g[:, :half], g[:, half:])
        return gate, up, down.transpose(1, 2) if self.input_first else down

    def kt_biases(self, gate_up_bias: torch.Tensor, down_bias: torch.Tensor):
        """(gate [E, I], up [E, I], down [E, H]): views of the model's biases."""
        half = gate_up_bias.shape[1] // 2
        b = gate_up_bias
        return (b[:, 0::2], b[:, 1::2], down_bias) if self.interleaved else (b[:, :half], b[:, half:], down_bias)

    def model_gate_up(self, d: torch.Tensor) -> torch.Tensor:
        """kt's [E, 2I, H] ([gate | up]) gradient in the model's gate_up shape."""
        d = interleave(d) if self.interleaved else d
        return d.transpose(1, 2) if self.input_first else d

    def model_down(self, d: torch.Tensor) -> torch.Tensor:
        """kt's [E, H, I] gradient in the model's down shape."""
        return d.transpose(1, 2) if self.input_first else d

    def model_gate_up_bias(self, d: torch.Tensor) -> torch.Tensor:
        """kt's [E, 2I] ([gate | up]) bias gradient in the model's order."""
        return interleave(d) if self.interleaved else d
