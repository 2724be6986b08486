"""A batch scoring input read through the data-source kinds (:data:`dbspec.seams.sources.SOURCES`).

The input's shape says which kind reads it (:data:`INPUT_KINDS`: a Delta table's directory, CSV
files, else Parquet), and that kind's own reader opens it, as for training: an Arrow dataset for
the local engine, a DataFrame for Spark. Errors name the input (``input x: ...``), not the spec
section a training run reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

from dbspec.data.sources import DataError


def is_delta_table(path: Path) -> bool:
    """Whether ``path`` is a Delta table's directory."""
    return (path / "_delta_log").is_dir()


def is_csv_input(path: Path) -> bool:
    """A ``.csv`` (or ``.csv.gz``) file, or a directory of them and nothing else to score."""
    def csv(p: Path) -> bool:
        return p.name.lower().endswith((".csv", ".csv.gz"))

    if path.is_file():
        return csv(path)
    files = [p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_"))] \
        if path.is_dir() else []
    return bool(files) and all(csv(p) for p in files)


#: How an input path shows the source kind that reads it, tried in order: (kind, test).
INPUT_KINDS: tuple[tuple[str, Callable[[Path], bool]], ...] = (
    ("delta", is_delta_table), ("csv", is_csv_input), ("parquet", lambda path: True))


class _Input(NamedTuple):
    """What a source kind's reader reads of a spec's ``data`` section: its ``source``."""

    source: Any


def input_kind(path: Path) -> str:
    """The source kind that reads the input at ``path``."""
    return next(kind for kind, test in INPUT_KINDS if test(path))


def input_section(path: Path, source: str, version: Optional[int]) -> tuple[Any, Any]:
    """(the source kind, its ``data.source`` section) for the input at ``path``.

    Raises:
        DataError: a version asked of a kind that has none.
    """
    from dbspec.seams.sources import SOURCES

    kind = SOURCES.get(input_kind(path))
    settings: dict[str, Any] = {"kind": kind.name, "path": str(path.resolve())}
    if version is not None:
        if "version" not in kind.model.model_fields:
            raise DataError(f"input {source} is not a Delta table, so it has no version "
                            f"{version}")
        settings["version"] = version
    return kind, kind.model(**settings)


def open_input(source: str, version: Optional[int]) -> tuple[Any, Optional[str]]:
    """A pyarrow dataset over ``source`` and its version label (``delta-vN``, None for files).
    CSV (with a header row) streams like Parquet, its types inferred from its first rows.

    Raises:
        DataError: the input does not exist, is not Parquet, CSV or Delta, or has no such
            version.
    """
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(f"input {source} does not exist (a Spark table needs --engine spark)")
    kind, section = input_section(path, source, version)
    if kind.name == "csv":
        return _open_csv(path, source), None
    try:
        opened = kind.open(_Input(section), base=path.parent)
    except DataError as refused:
        raise input_error(refused, source, version) from None
    return opened.dataset, opened.version


def open_table(path: Path) -> Any:
    """The Arrow dataset of the Delta table, Parquet or CSV at ``path``, for readers that word
    errors themselves (monitoring's inference table and labels).

    Raises:
        DataError: the kind's, naming ``data.source``: the caller words it for its own input.
    """
    kind, section = input_section(path, str(path), None)
    if kind.name == "csv":
        return _open_csv(path, str(path))
    return kind.open(_Input(section), base=path.parent).dataset


def reason_of(refused: DataError) -> str:
    """A source kind's error without its ``data.source`` location: what went wrong."""
    return str(refused).split(": ", 1)[-1]


def _open_csv(path: Path, source: str) -> Any:
    """CSV read by pyarrow, not by the CSV kind, which types the spec's feature columns as
    float64: a scoring input has no spec, every column's type is inferred."""
    import pyarrow.dataset as ds

    try:
        dataset = ds.dataset(str(path), format="csv")
        dataset.schema  # reads the header and infers the types now
        return dataset
    except Exception as exc:  # ArrowInvalid: a CSV pyarrow cannot parse
        raise DataError(f"input {source} is not a CSV file pyarrow can read: "
                        f"{str(exc).splitlines()[0]}") from None


def input_error(refused: DataError, source: str, version: Optional[int]) -> DataError:
    """A source kind's error about ``data.source`` as one about the batch input."""
    text = str(refused)
    if " has no data files " in text:
        return DataError(f"input {source} has no data files "
                         f"{text.split(' has no data files ', 1)[1]}")
    if " at version " in text and version is not None:
        reason = text.split(f" at version {version}: ", 1)[-1]
        return DataError(f"input {source}: cannot open Delta version {version}: "
                         f"{reason.splitlines()[0]}")
    if ": cannot read " in text:
        reason = text.split(" as ", 1)[-1].split(": ", 1)[-1]
        return DataError(f"input {source} is not a Delta table, Parquet or CSV: "
                         f"{reason.splitlines()[0]}")
    return DataError(f"input {source}: {reason_of(refused)}")


def spark_input(spark, source: str,
                version: Optional[int]) -> Optional[tuple[Any, Optional[str]]]:
    """(a Spark DataFrame over the path, its version label), read by its source kind; None for
    a path that is not there (a table name)."""
    path = Path(source).expanduser()
    if not path.exists():
        return None
    kind, section = input_section(path, source, version)
    try:
        return kind.spark_frame(spark, _Input(section), path), (
            kind.version(_Input(section), base=path.parent)
            if "version" in kind.model.model_fields else None)
    except DataError as refused:
        raise input_error(refused, source, version) from None
