"""The data-source seam: where a spec's rows come from.

A source kind is one module (``dbspec/sources/<kind>.py``, or an installed plugin registering
an entry point in ``dbspec.sources``) holding everything about that kind: its spec section
(``data.source``), its checks at validate, what it tells about the data without reading it,
and the one reader every path uses: the local run (:meth:`DataSource.read`), shard conversion
for ``data.streaming`` (:meth:`DataSource.open`), the Spark executor
(:meth:`DataSource.read_spark`) and the data version that enters fingerprints
(:meth:`DataSource.version`). Callers ask the kind (``source_kind(data)``); they never switch
on its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional, Protocol, runtime_checkable

from dbspec.plugins import KindRegistry
from dbspec.seams.compute import ComputeFinding as Finding

if TYPE_CHECKING:
    from pathlib import Path

    from dbspec.data.convert import OpenedSource
    from dbspec.data.sources import SourceData
    from dbspec.spec.sections import Spec
    from dbspec.spec.sections.data import DataSpec

__all__ = ["DataSource", "Finding", "SOURCES", "source_kind"]


@runtime_checkable
class DataSource(Protocol):
    """What dbspec asks of a data-source kind.

    Attributes:
        name: The ``data.source.kind`` value.
        model: The pydantic model of its ``data.source`` section (``kind: Literal[name]``).
    """

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> type[Any]: ...

    def check(self, spec: Spec) -> Iterable[Finding]:
        """Problems of the spec that types alone cannot express, found at validate."""

    def known_width(self, source: Any) -> Optional[int]:
        """Feature columns when known without reading the data, else None."""

    def known_classes(self, source: Any) -> Optional[int]:
        """Classes of a classification task when known without reading the data, else None."""

    def version(self, data: DataSpec, *, base: Path) -> str:
        """What identifies the rows, cheaply (metadata or a digest), before any stage runs."""

    def read(self, data: DataSpec, *, base: Path) -> SourceData:
        """Every row into a pandas frame, in this process."""

    def open(self, data: DataSpec, *, base: Path, spark: Any = None) -> OpenedSource:
        """An Arrow dataset over the rows, without reading them (shard conversion)."""

    def read_spark(self, spark: Any, data: DataSpec, *, base: Path) -> SourceData:
        """Every row through a Spark session, collected for training."""

    def spark_version(self, spark: Any, data: DataSpec, *, base: Path) -> str:
        """:meth:`version`, where only a Spark session can tell it."""


#: The data-source kinds: dbspec's own, plus those of installed plugins.
SOURCES: KindRegistry[DataSource] = KindRegistry("dbspec.sources", "data source kind", {
    "sklearn": "dbspec.sources.sklearn:SOURCE",
    "csv": "dbspec.sources.csv:SOURCE",
    "parquet": "dbspec.sources.parquet:SOURCE",
    "delta": "dbspec.sources.delta:SOURCE",
    "synthetic": "dbspec.sources.synthetic:SOURCE",
    "spark_table": "dbspec.sources.spark_table:SOURCE",
})


def source_kind(data: DataSpec) -> DataSource:
    """The kind of ``data.source``."""
    return SOURCES.get(data.source.kind)
