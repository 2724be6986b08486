"""``dbspec init``: a commented first spec, inferred from a sample of a data file (CSV with the
csv module; Parquet or Delta with pyarrow, the ``train`` extra; never torch, MLflow or Spark).

Target: ``--label``, else the first column named like a label, else the last. Task: ``--task``,
else binary for two distinct values, multiclass for at most :data:`MAX_CLASSES` whole-number or
text values, else regression. Features: every numeric column but the target (the others are
named in a comment). Then ``impute`` where values are missing, ``standard_scale``, and two
hidden layers sized from the feature count.
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dbspec.errors import DbspecError, did_you_mean
from dbspec.spec.metrics import no_worse_sign

SAMPLE_ROWS = 10_000
MAX_CLASSES = 20
#: More features than this are not listed in the spec when every column but the target is one.
MAX_LISTED = 1_000
_LABEL_NAMES = ("target", "label", "labels", "y", "class", "outcome", "response")
_MISSING = {"", "na", "nan", "null", "none", "n/a", "?"}
#: Per task: the promotion gate's metric, and why the task was inferred.
_TASKS = {"regression": ("test_rmse", "the target holds numbers with more than a few distinct "
                                      "values"),
          "binary": ("test_roc_auc", "the target has two distinct values"),
          "multiclass": ("test_accuracy", "the target has {classes} distinct values")}


class ScaffoldError(DbspecError):
    """The data file cannot be read or gives nothing to train on."""


@dataclass
class Column:
    """What the sample says about one column."""

    name: str
    numeric: bool = True
    missing: int = 0
    values: set = field(default_factory=set)  # distinct non-missing values, up to MAX_CLASSES+1
    whole: bool = True  # every numeric value is a whole number

    def add(self, value: Any) -> None:
        if value is None or (isinstance(value, float) and math.isnan(value)) or \
                (isinstance(value, str) and value.strip().lower() in _MISSING):
            self.missing += 1
            return
        if self.numeric:
            try:
                number = float(value)
            except (TypeError, ValueError):
                self.numeric = False
            else:
                if not math.isfinite(number) or number != int(number):
                    self.whole = False
                value = number
        if len(self.values) <= MAX_CLASSES:
            self.values.add(value if self.numeric else str(value))


@dataclass
class Scaffold:
    """The inferred parts of the spec."""

    source: dict[str, Any]
    target: str
    task: str
    features: list[str]
    skipped: list[str]
    classes: int
    impute: bool
    rows: int


def infer(path: Path, *, target: Optional[str] = None, task: Optional[str] = None,
          delimiter: str = ",") -> Scaffold:
    """Read a sample of ``path`` and infer the spec's data section.

    Raises:
        ScaffoldError: unreadable file, unknown target, or no numeric feature.
    """
    columns, rows, source = _sample(path, delimiter)
    names = [c.name for c in columns]
    if target is None:
        target = next((n for n in names if n.strip().lower() in _LABEL_NAMES), names[-1])
    elif target not in names:
        raise ScaffoldError(f"--label {target!r} is not a column of {path}"
                            f"{did_you_mean(target, names)}; columns: {', '.join(names)}")
    label = next(c for c in columns if c.name == target)
    if label.missing:
        raise ScaffoldError(f"{path}: the target column {target!r} has {label.missing} missing "
                            "value(s) in the rows read; drop those rows first")
    distinct = len(label.values)
    if task is None:
        if distinct == 2:
            task = "binary"
        elif distinct <= MAX_CLASSES and (not label.numeric or label.whole):
            task = "multiclass"
        else:
            task = "regression"
    if task == "regression" and not label.numeric:
        raise ScaffoldError(f"{path}: the target column {target!r} holds text; regression "
                            "needs numbers (use --task binary or multiclass)")
    features = [c.name for c in columns if c.name != target and c.numeric]
    skipped = [c.name for c in columns if c.name != target and not c.numeric]
    if not features:
        raise ScaffoldError(f"{path}: no numeric column besides the target {target!r}; dbspec "
                            "trains on numeric features")
    impute = any(c.missing for c in columns if c.name != target and c.numeric)
    return Scaffold(source, target, task, features, skipped, distinct, impute, rows)


def _sample(path: Path, delimiter: str) -> tuple[list[Column], int, dict[str, Any]]:
    if not path.exists():
        raise ScaffoldError(f"{path} does not exist")
    shown = path.as_posix()
    if path.is_dir() and (path / "_delta_log").is_dir():
        return (*_arrow_sample(path, delta=True), {"kind": "delta", "path": shown})
    if path.suffix.lower() in (".parquet", ".pq") or path.is_dir():
        return (*_arrow_sample(path, delta=False), {"kind": "parquet", "path": shown})
    source = {"kind": "csv", "path": shown, **({"delimiter": delimiter} if delimiter != ","
                                                 else {})}
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle, delimiter=delimiter)
            header = next(reader, None)
            if not header:
                raise ScaffoldError(f"{path}: empty file, no header row")
            repeated = sorted(n for n, count in Counter(header).items() if count > 1)
            if repeated:
                raise ScaffoldError(f"{path}:1: repeated column name(s) "
                                    f"{', '.join(map(repr, repeated))}")
            columns = [Column(name) for name in header]
            rows = 0
            for line, row in enumerate(reader, start=2):
                if rows >= SAMPLE_ROWS:
                    break
                if not row:
                    continue
                if len(row) != len(header):
                    raise ScaffoldError(f"{path}:{line}: {len(row)} fields, the header has "
                                        f"{len(header)}")
                for column, value in zip(columns, row):
                    column.add(value)
                rows += 1
    except UnicodeDecodeError as exc:
        raise ScaffoldError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                            "for Parquet give a .parquet file") from None
    except csv.Error as exc:
        raise ScaffoldError(f"{path}: cannot read it as CSV: {exc}") from None
    if rows == 0:
        raise ScaffoldError(f"{path}: a header and no rows")
    return columns, rows, source


def _arrow_sample(path: Path, *, delta: bool) -> tuple[list[Column], int]:
    try:
        import pyarrow.dataset as ds
    except ImportError:
        raise ScaffoldError("reading Parquet or Delta needs pyarrow: pip install "
                            "'dbspec[train]'") from None
    try:
        if delta:
            from deltalake import DeltaTable

            dataset = DeltaTable(str(path)).to_pyarrow_dataset()
        else:
            dataset = ds.dataset(str(path), format="parquet")
        table = dataset.head(SAMPLE_ROWS)
    except Exception as exc:  # pyarrow and delta-rs raise several types for bad files
        raise ScaffoldError(f"{path}: cannot read it: {str(exc).splitlines()[0]}") from None
    import pyarrow.types as pat

    columns = []
    for name, values in zip(table.column_names, table.columns):
        column = Column(name, numeric=pat.is_integer(values.type) or
                        pat.is_floating(values.type) or pat.is_boolean(values.type))
        for value in values.to_pylist():
            column.add(float(value) if isinstance(value, bool) else value)
        columns.append(column)
    if table.num_rows == 0:
        raise ScaffoldError(f"{path}: no rows")
    return columns, table.num_rows


def render(scaffold: Scaffold, *, name: str) -> str:
    """The spec text: YAML with comments saying what was inferred and what to change."""
    width = len(scaffold.features)
    hidden = max(16, min(128, 2 ** math.ceil(math.log2(max(2, width) * 2))))
    outputs = {"regression": 1, "binary": 1}.get(scaffold.task, scaffold.classes)
    metric, task_note = _TASKS[scaffold.task]
    compare = no_worse_sign(metric)
    features = f"  features: [{_wrapped([_quoted(f) for f in scaffold.features], indent=' ' * 13)}]"
    if width > MAX_LISTED and not scaffold.skipped:  # the default names the same columns
        features = f"  # features: every column but the target ({width:,}, too many to list)"
    skipped = (f"  # not numeric, left out: {', '.join(scaffold.skipped)}\n"
               if scaffold.skipped else "")
    steps = (["impute"] if scaffold.impute else []) + ["standard_scale"]
    source = ", ".join(f"{k}: {_quoted(str(v))}" for k, v in scaffold.source.items())
    return f"""\
# Written by `dbspec init` from {scaffold.rows:,} rows of {scaffold.source['path']}.
# Check it with `dbspec validate {name}.yaml`; try it end to end with
# `dbspec run {name}.yaml --smoke` (a tiny slice, one epoch), then without --smoke.
# Editor help: `dbspec schema -o dbspec.schema.json`, and a first line
# `# yaml-language-server: $schema=dbspec.schema.json`.
name: {name}
data:
  source: {{{source}}}
  target: {_quoted(scaffold.target)}
  task: {scaffold.task}  # inferred: {task_note.format(classes=scaffold.classes)}
{features}
{skipped}  # fitted on the training rows only and saved inside the model, so the registered
  # model takes raw rows exactly as they are in the file
  preprocessing: [{", ".join(steps)}]
model:
  layers:  # {width} feature(s) in, {outputs} out
    - linear: {{out: {hidden}}}
    - relu
    - dropout: {{p: 0.1}}
    - linear: {{out: {max(8, hidden // 2)}}}
    - relu
    - linear: {{out: {outputs}}}
training:
  optimizer: {{name: adam, lr: 0.001}}
  batch_size: 64
  epochs: 200
  early_stopping: {{monitor: val_loss, patience: 20}}
registry:
  name: {name.replace("-", "_")}
  promotion:
    alias: production
    gates:
      # a new version takes @production only if it is at least as good as the holder
      - {{metric: {metric}, better_than: production}}  # {metric} {compare} @production
"""


def _wrapped(items: list[str], *, indent: str, width: int = 96) -> str:
    """``a, b, c`` broken into lines of at most ``width`` characters (YAML flow style)."""
    lines, line = [], ""
    for item in items:
        if line and len(indent) + len(line) + len(item) + 2 > width:
            lines.append(line + ",")
            line = item
        else:
            line = f"{line}, {item}" if line else item
    lines.append(line)
    return f"\n{indent}".join(lines)


def _quoted(text: str) -> str:
    """A YAML scalar for ``text``: bare where that reads back as the same string."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-/]*", text) and text.lower() not in (
            "true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def default_names(path: Path, *, name: Optional[str] = None,
                  output: Optional[str] = None) -> tuple[str, Path]:
    """The spec's name and file for the data at ``path``, unless given: ``Churn Data.csv``
    gives the name ``churn-data`` and the file ``Churn Data.yaml`` (the data file's stem)."""
    stem = path.name.split(".")[0] if path.is_file() else path.name
    if name is None:
        name = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")
        name = name if name and name[0].isalnum() else f"model-{name}".rstrip("-")
    return name, Path(output or f"{stem or name}.yaml")
