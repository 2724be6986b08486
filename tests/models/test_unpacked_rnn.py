"""Recurrent layers read unpacked for the ONNX export give packing's numbers
(:mod:`dbspec.models.unpacked_rnn`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from dbspec.models.unpacked_rnn import exporting, run_unpacked


@pytest.mark.parametrize("kind", [nn.GRU, nn.LSTM])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_unpacked_equals_packed(kind, layers, bidirectional):
    torch.manual_seed(0)
    rnn = kind(5, 4, num_layers=layers, bidirectional=bidirectional, batch_first=True).eval()
    x = torch.randn(6, 7, 5)
    lengths = torch.tensor([1, 7, 3, 5, 2, 1])
    with torch.no_grad():
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        expected = pad_packed_sequence(rnn(packed)[0], batch_first=True, total_length=7)[0]
        got = run_unpacked(rnn, x, lengths)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert got[0, 1:].abs().sum() == 0  # past a row's end: zeros, as packing leaves them


def test_not_exporting_outside_torch_export():
    assert exporting() is False
