"""A recurrent layer read over padded rows without packing them, for the ONNX export.

Packed shapes depend on the data, so ``torch.export`` cannot trace
:class:`~dbspec.models.typed.Recurrent`'s ``pack_padded_sequence``. Here each direction of each
layer runs as a one-layer module of the same kind over the whole padded length, on the layer's
own weights (``torch.func.functional_call``): the forward direction never reads past a row's
end into a real output; the reverse one reads each row reversed within its length. Outputs past
each row's end are zeros, as ``pad_packed_sequence`` leaves them.
"""

from __future__ import annotations

import torch
from torch import nn

_WEIGHTS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def exporting() -> bool:
    """Whether ``torch.export`` is tracing the module (``torch.compiler.is_exporting``, torch
    2.6 and later; an older torch is never exporting here: its export fails earlier and the
    model is served with torch)."""
    check = getattr(torch.compiler, "is_exporting", None)
    return bool(check is not None and check())


def run_unpacked(rnn: nn.RNNBase, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``rnn`` (batch first, eval mode) over ``x`` (B, L, E), each row read up to ``lengths``
    (B,) items; (B, L, hidden x directions), zeros past each row's end."""
    steps = torch.arange(x.shape[1], device=x.device)
    last = lengths.unsqueeze(1) - 1
    valid = steps <= last
    # the step each position is read at when the row runs backwards; padding keeps its place
    order = torch.where(valid, last - steps, steps)
    out = x
    for layer in range(rnn.num_layers):
        forward = _direction(rnn, layer, "", out)
        parts = [forward]
        if rnn.bidirectional:
            parts.append(_reorder(_direction(rnn, layer, "_reverse", _reorder(out, order)),
                                  order))
        out = torch.cat(parts, dim=-1)
    return out * valid.unsqueeze(-1).to(out.dtype)


def _direction(rnn: nn.RNNBase, layer: int, suffix: str, x: torch.Tensor) -> torch.Tensor:
    """One direction of one layer of ``rnn`` over ``x``, read from the first step."""
    kind = nn.LSTM if isinstance(rnn, nn.LSTM) else nn.GRU  # the two Recurrent builds
    single = kind(x.shape[-1], rnn.hidden_size, bias=rnn.bias, batch_first=True,
                  device="meta")  # its own weights are never used: no memory, no RNG
    weights = {f"{name}_l0": getattr(rnn, f"{name}_l{layer}{suffix}")
               for name in _WEIGHTS if rnn.bias or name.startswith("weight")}
    return torch.func.functional_call(single, weights, (x,))[0]


def _reorder(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``x`` (B, L, E) with each row's steps taken in ``order`` (B, L)."""
    return torch.gather(x, 1, order.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
