"""A network that fails on purpose after a number of forward passes (for resume tests).

Set DBSPEC_TEST_FAIL_AFTER=N in the environment of the training processes to make every rank
raise on its N-th forward pass in training mode.
"""

from __future__ import annotations

import os

from torch import nn


class FlakyNet(nn.Module):
    """A linear model whose training forward pass raises after DBSPEC_TEST_FAIL_AFTER calls."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.calls = 0

    def forward(self, x):
        limit = int(os.environ.get("DBSPEC_TEST_FAIL_AFTER", "0"))
        if self.training:
            self.calls += 1
            if limit and self.calls > limit:
                raise RuntimeError("injected failure")
        return self.linear(x)
