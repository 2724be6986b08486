"""``data``: where rows come from, the task, the split and the preprocessing."""

from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import AfterValidator, Field

from dbspec.spec.sections.features import FeatureEntry
from dbspec.spec.sections.base import (
    OneKeyModel,
    SpecModel,
    d,
    one_key_entry,
    section,
    shorthand,
)

Task = Literal["regression", "binary", "multiclass"]
BuiltinDataset = Literal["diabetes", "digits", "breast_cancer", "iris", "wine"]


def _iso_timestamp(value: str) -> str:
    from datetime import datetime

    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO-8601 timestamp, e.g. 2024-05-01T12:00:00Z") \
            from None
    return value


class SklearnSource(SpecModel):
    """A data set that ships with scikit-learn (no download)."""

    kind: Literal["sklearn"] = d("Source kind: a scikit-learn built-in data set.")
    name: BuiltinDataset = d("Which built-in data set: diabetes, digits, breast_cancer, iris, wine.")


class CsvSource(SpecModel):
    """A CSV file with a header row."""

    kind: Literal["csv"] = d("Source kind: a CSV file.")
    path: str = d("Path or URI of the CSV file.", min_length=1)
    delimiter: str = d("Field delimiter.", default=",", min_length=1, max_length=1)


class ParquetSource(SpecModel):
    """A Parquet file or a directory of Parquet files."""

    kind: Literal["parquet"] = d("Source kind: Parquet.")
    path: str = d("Path or URI of a Parquet file or directory.", min_length=1)


class DeltaSource(SpecModel):
    """A Delta Lake table, optionally at an earlier version (time travel)."""

    kind: Literal["delta"] = d("Source kind: a Delta Lake table.")
    path: str = d("Path or URI of the Delta table.", min_length=1)
    version: Optional[int] = d("Table version to read; the latest when neither version nor "
                               "timestamp is set. The resolved version is recorded in the run.",
                               default=None, ge=0)
    timestamp: Optional[Annotated[str, AfterValidator(_iso_timestamp)]] = d("Read the table as of this ISO-8601 timestamp "
                                 "(e.g. 2024-05-01T12:00:00Z). Exclusive with version.",
                                 default=None, min_length=1)


class SyntheticSource(SpecModel):
    """Generated data with a known structure, reproducible from the seed."""

    kind: Literal["synthetic"] = d("Source kind: generated data.")
    rows: int = d("Number of rows.", default=10_000, ge=10, le=100_000_000)
    features: int = d("Number of feature columns (named f0, f1, ...).", default=100, ge=1,
                      le=100_000)
    informative: Optional[int] = d("How many features carry signal; default: all, up to 10.",
                                   default=None, ge=1)
    generator: Literal["tabular", "text", "mixed"] = d(
        "tabular: numeric columns f0..fN; text: a 'text' column of generated sentences whose "
        "class depends on words and their order; mixed: numeric columns plus high-cardinality "
        "categorical ID columns whose effect only an embedding can learn.", default="tabular")
    cardinality: int = d("Distinct IDs per categorical column (generator: mixed).",
                         default=2_000, ge=2, le=10_000_000)
    classes: int = d("Classes for binary/multiclass tasks.", default=2, ge=2, le=10_000)
    noise: float = d("Noise level added to the signal.", default=0.1, ge=0)
    seed: int = d("Random seed of the generator.", default=0, ge=0)


class SparkTableSource(SpecModel):
    """A table of the Spark catalog (Unity Catalog ``catalog.schema.table`` on Databricks)."""

    kind: Literal["spark_table"] = d("Source kind: a Spark catalog table.")
    table: str = d("Table name, e.g. main.ml.features.", pattern=r"^[A-Za-z0-9_`][\w`\-]*(\.[\w`\-]+){0,2}$")
    version: Optional[int] = d("Delta version of the table to read.", default=None, ge=0)


Source = Annotated[
    Union[SklearnSource, CsvSource, ParquetSource, DeltaSource, SyntheticSource, SparkTableSource],
    Field(discriminator="kind"),
]

Columns = Union[Literal["all"], list[str]]


class ScaleArgs(SpecModel):
    """Arguments of a scaling step."""

    columns: Columns = d("'all' feature columns, or a list of column names.", default="all")


class ImputeArgs(SpecModel):
    """Fill missing values, with statistics of the training split."""

    columns: Columns = d("'all' feature columns, or a list of column names.", default="all")
    strategy: Literal["mean", "median", "constant"] = d("How to fill.", default="mean")
    fill_value: float = d("Value used by the constant strategy.", default=0.0)


class ClipArgs(SpecModel):
    """Clip values to quantiles of the training split."""

    columns: Columns = d("'all' feature columns, or a list of column names.", default="all")
    lower_quantile: float = d("Lower quantile.", default=0.01, ge=0, le=1)
    upper_quantile: float = d("Upper quantile.", default=0.99, ge=0, le=1)


_scale = shorthand("columns", Columns)


class PreprocessingStepSpec(OneKeyModel):
    """One preprocessing step: its name as the key, columns or settings as the value."""

    entry_word: ClassVar[str] = "preprocessing step"
    model_config = OneKeyModel.model_config | {
        "json_schema_extra": {"minProperties": 1, "maxProperties": 1}}

    standard_scale: Optional[_scale(ScaleArgs)] = d(
        "Subtract the mean, divide by the standard deviation.", default=None)
    minmax_scale: Optional[_scale(ScaleArgs)] = d("Scale to [0, 1] with the training split's "
                                                  "range.", default=None)
    robust_scale: Optional[_scale(ScaleArgs)] = d(
        "Subtract the median, divide by the interquartile range.", default=None)
    impute: Optional[_scale(ImputeArgs)] = d("Fill missing values.", default=None)
    clip: Optional[_scale(ClipArgs)] = d("Clip outliers to training quantiles.", default=None)


PreprocessStep = one_key_entry(PreprocessingStepSpec, bare=[
    "standard_scale", "minmax_scale", "robust_scale", "impute", "clip"])


class SplitSpec(SpecModel):
    """Train/validation/test fractions; the rest of the rows train."""

    validation: float = d("Fraction of rows for validation.", default=0.2, ge=0, lt=1)
    test: float = d("Fraction of rows for the test split.", default=0.2, ge=0, lt=1)
    seed: int = d("Seed of the shuffle.", default=42, ge=0)
    stratify: Optional[bool] = d("Keep class proportions in every split; default: on for "
                                 "classification tasks.", default=None)


class StreamingSpec(SpecModel):
    """Train from shards streamed off disk instead of one in-memory array, for data larger than
    memory.

    The source (a Delta table at its pinned version, Parquet, CSV, a Spark table) is converted
    once into Arrow shards, one set per split; an unchanged rerun finds them and reuses them.
    Splits are assigned by a hash of the row key (or of the row's position within the pinned
    version), preprocessing statistics come from one pass over the training shards, and each
    rank of a distributed training reads its own shards, shuffled by seed and epoch.
    """

    enabled: Union[Literal["auto"], bool] = d(
        "auto: stream when the data would take more than in_memory_limit_mb in memory, else "
        "train in memory (on the same hash split); true: always stream; false: never.",
        default="auto")
    in_memory_limit_mb: Optional[int] = d(
        "Largest feature matrix (rows x features x 4 bytes, in MB) trained in memory under "
        "enabled: auto; default: 1/20 of the memory available when the run starts (the "
        "in-memory path peaks near 10x its feature matrix).", default=None, ge=1)
    format: Literal["arrow"] = d("Shard format: Arrow IPC files (uncompressed, memory-mapped "
                                 "when read).", default="arrow")
    location: Optional[str] = d(
        "Directory the shard sets are written to (every node must see it: the shared dir, a "
        "Unity Catalog volume, a mounted bucket); default: <shared dir>/shards, else "
        ".dbspec/shards in the project.", default=None, min_length=1)
    cache_dir: Optional[str] = d(
        "A node-local directory each process copies shards into before reading them (for a "
        "slow or remote location); default: read the shards where they are.",
        default=None, min_length=1)
    shard_size_mb: int = d("Target size of one shard file.", default=32, ge=1, le=4096)
    shuffle: bool = d("Shuffle every epoch: the shard order, and rows within each window of "
                      "shuffle_window shards, by training.seed and the epoch.", default=True)
    shuffle_window: int = d("Shards whose rows are mixed together when shuffling (more mixes "
                            "better and takes more memory).", default=4, ge=1, le=1024)
    prefetch: int = d("Windows of shards read ahead in a background thread while the current "
                      "one trains (0: read on demand).", default=1, ge=0, le=16)
    key: Optional[str] = d(
        "Column whose value decides a row's split (a stable ID keeps a row in its split when "
        "the table changes); default: the row's position within the pinned data version.",
        default=None, min_length=1)
    sample_rows: int = d(
        "Training rows sampled uniformly in the statistics pass, for the quantile-based "
        "preprocessing steps (median, clip, robust_scale) and the monitoring reference "
        "profile; means, deviations, minima and maxima are exact.", default=200_000,
        ge=1_000, le=10_000_000)


class DataSpec(SpecModel):
    """Where the rows come from and what to predict."""

    source: Source = d("The data source, selected by 'kind'.")
    task: Task = d("What the model predicts: regression, binary or multiclass classification.")
    target: str = d("Name of the target column.", default="target", min_length=1)
    features: Optional[list[FeatureEntry]] = d(
        "Feature columns: a name (numeric, or the type its column's values make unambiguous) "
        "or a typed feature {name, type: numeric | categorical | text | sequence | image, ...}; "
        "default: every column but the target, each typed by its values.",
        default=None, min_length=1)
    split: SplitSpec = section("How rows are split.")
    preprocessing: list[PreprocessStep] = d(
        "Steps fitted on the training split only and shipped inside the logged model.",
        default=[])
    streaming: Optional[StreamingSpec] = d(
        "Stream the data from shards instead of holding it in memory (data larger than "
        "memory); left out: in memory, with a random (stratified) split.", default=None)

    @property
    def feature_names(self) -> Optional[list[str]]:
        """The names in ``features`` (typed entries by their name), or None when unset."""
        if self.features is None:
            return None
        return [f if isinstance(f, str) else f.name for f in self.features]

    @property
    def declared_types(self) -> dict[str, Any]:
        """The typed entries of ``features``, by name (plain names are typed by their data)."""
        return {f.name: f for f in self.features or () if not isinstance(f, str)}
