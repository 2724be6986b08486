"""``data``: where rows come from, the task, the split and the preprocessing."""

from typing import Annotated, Any, ClassVar, Literal, Optional, Union


from dbspec.seams.sources import SOURCES
from dbspec.spec.kinds import kind_union
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


#: ``data.source``: the union of every data-source kind's section (dbspec.seams.sources).
Source: Any = kind_union(SOURCES)

Columns = Union[Literal["all"], list[str]]


class ScaleArgs(SpecModel):
    """Arguments of a scaling step."""

    columns: Columns = d("'all' feature columns, or a list of column names.", default="all")


class ImputeArgs(ScaleArgs):
    """Fill missing values, with statistics of the training split."""

    strategy: Literal["mean", "median", "constant"] = d("How to fill.", default="mean")
    fill_value: float = d("Value used by the constant strategy.", default=0.0)


class ClipArgs(ScaleArgs):
    """Clip values to quantiles of the training split."""

    lower_quantile: float = d("Lower quantile.", default=0.01, ge=0, le=1)
    upper_quantile: float = d("Upper quantile.", default=0.99, ge=0, le=1)


_Scale = Annotated[ScaleArgs, shorthand(ScaleArgs, "columns")]


class PreprocessingStepSpec(OneKeyModel):
    """One preprocessing step: its name as the key, columns or settings as the value."""

    entry_word: ClassVar[str] = "preprocessing step"
    model_config = OneKeyModel.model_config | {
        "json_schema_extra": {"minProperties": 1, "maxProperties": 1}}

    standard_scale: Optional[_Scale] = d("Subtract the mean, divide by the standard deviation.",
                                         default=None)
    minmax_scale: Optional[_Scale] = d("Scale to [0, 1] with the training split's range.",
                                       default=None)
    robust_scale: Optional[_Scale] = d("Subtract the median, divide by the interquartile range.",
                                       default=None)
    impute: Optional[Annotated[ImputeArgs, shorthand(ImputeArgs, "columns")]] = d(
        "Fill missing values.", default=None)
    clip: Optional[Annotated[ClipArgs, shorthand(ClipArgs, "columns")]] = d(
        "Clip outliers to training quantiles.", default=None)


PreprocessStep = one_key_entry(PreprocessingStepSpec, bare=list(PreprocessingStepSpec.model_fields))


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
