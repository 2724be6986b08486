"""``data.source.kind: toy``: a data source from an installed package (dbspec's plugin test).

A line through the origin with noise, made in memory like ``kind: synthetic``: one setting of
its own (``rows``) and one check at validate that can fail.
"""

from __future__ import annotations

from typing import Literal

from dbspec.seams.sources import Finding
from dbspec.sources.common import GeneratedSource
from dbspec.spec.sections.base import SpecModel, d


class ToySource(SpecModel):
    """``rows`` rows of y = 3x + noise."""

    kind: Literal["toy"] = d("The toy plugin's data source.")
    rows: int = d("Rows to make; at least 50.", default=200, ge=1)


class ToyKind(GeneratedSource):
    """Made on the driver."""

    name = "toy"
    model = ToySource
    uri = "toy"

    def check(self, spec):
        """Too few rows to split is refused."""
        if spec.data.source.rows < 50:
            yield Finding(("data", "source", "rows"), f"{spec.data.source.rows} rows are too "
                          "few to split; give at least 50")

    def known_width(self, source) -> int:
        """One feature, x."""
        return 1

    def version(self, data, *, base) -> str:
        """The settings are the data."""
        return f"toy-{data.source.rows}"

    def frame(self, data):
        """x in [0, 1), y = 3x + N(0, 0.1)."""
        import numpy as np
        import pandas as pd

        random = np.random.default_rng(0)
        x = random.random(data.source.rows)
        return pd.DataFrame({"x": x, "target": 3 * x + random.normal(0, 0.1, len(x))})


SOURCE = ToyKind()
