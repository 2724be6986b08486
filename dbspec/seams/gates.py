"""The promotion-gate seam: what a version must show before an alias moves to it.

A gate kind is one module (``dbspec/gates/<kind>.py``, or an installed plugin registering an
entry point in ``dbspec.gates``) that evaluates the spec's gates it recognises
(:meth:`GateKind.applies`) from the inputs it names (:attr:`GateKind.needs`) and returns one
typed :class:`GateResult` per gate. The gates stay as the user writes them
(``registry.promotion.gates: [{metric, min, max, better_than, tolerance} | {diagnosis}]``);
one spec gate may be evaluated by several kinds (``{metric, max, better_than}`` is a bound and
a comparison with the champion: two results).

The promotion service (:mod:`dbspec.registry.promotion`) gathers the inputs once, in one
function, and asks every kind; ``dbspec run``, ``promote``, ``approve`` and the generated jobs
all go through it. Callers never switch on a kind's name.

Adding a kind: write its module with a ``KIND`` object implementing :class:`GateKind`, then
add one line to ``GATES`` below (built-in) or register it as an entry point in the
``dbspec.gates`` group of your own package (plugin).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import (TYPE_CHECKING, Any, Callable, FrozenSet, Mapping, Optional, Protocol,
                    runtime_checkable)

from dbspec.plugins import KindRegistry

if TYPE_CHECKING:
    from dbspec.spec.sections.lifecycle import Gate

__all__ = ["CHAMPION", "DIAGNOSIS", "GATES", "INPUTS", "METRICS", "Champion", "ChampionLookup",
           "GateInputs", "GateKind", "GateResult"]

#: The inputs a gate kind may need (:attr:`GateKind.needs`); the service gathers these.
METRICS, CHAMPION, DIAGNOSIS = "metrics", "champion", "diagnosis"
INPUTS: FrozenSet[str] = frozenset({METRICS, CHAMPION, DIAGNOSIS})


@dataclass(frozen=True)
class GateResult:
    """The outcome of one gate for one version (recorded as JSON in a ``dbspec.gate.N`` tag).

    Attributes:
        metric: The metric gated (``diagnosis`` for a learning-curve gate).
        condition: The condition in words (``<= 65``, ``<= @production ± 2``).
        value: The candidate's figure; None when it has none (the gate then fails).
        reference: What it was compared with (the champion's figure), if anything.
        passed: Whether the gate holds.
        note: Why, where the figures alone do not say.
        stage: The promotion stage (alias) the gate belongs to; empty for a single promotion.
        label: A diagnosis gate's diagnosis (None: unknown).
    """

    metric: str
    condition: str
    value: Optional[float]
    reference: Optional[float]
    passed: bool
    note: str = ""
    stage: str = ""
    label: Optional[str] = None

    def describe(self) -> str:
        """``test_rmse=54.21 <= 65: pass``; a stage's gate starts with ``@staging:``."""
        if self.metric == "diagnosis":
            shown = self.label or "unknown"
        else:
            shown = "missing" if self.value is None else f"{self.value:.6g}"
        verdict = "pass" if self.passed else "FAIL"
        note = f" ({self.note})" if self.note else ""
        where = f"@{self.stage}: " if self.stage else ""
        return f"{where}{self.metric}={shown} {self.condition}: {verdict}{note}"

    def to_tag(self) -> dict[str, Any]:
        """The JSON recorded for it (``stage`` and ``label`` only where set, so a single
        promotion's records read as before)."""
        return {k: v for k, v in asdict(self).items()
                if k not in ("stage", "label") or v not in ("", None)}


@dataclass(frozen=True)
class Champion:
    """What a ``better_than`` gate compares with.

    Attributes:
        version: The version compared with; None when the registry confirmed that nothing
            holds the alias (the gate then passes).
        value: Its metric; None when it has none that can be compared (the gate then fails).
        note: Said instead of the default (who holds the alias, and how it was found).
    """

    version: Optional[str]
    value: Optional[float] = None
    note: str = ""


#: ``(alias, metric) -> Champion``; may raise ``RegistryError`` (the champion cannot be read).
ChampionLookup = Callable[[str, str], Champion]


@dataclass(frozen=True)
class GateInputs:
    """Everything a gate kind may read about one candidate at one stage, gathered once by the
    promotion service.

    Attributes:
        metrics: The candidate's metrics (``test_rmse``...).
        diagnosis: Its learning-curve label (``overfitting``, ``underfitting``, ``converged``,
            ``undetermined``); None when unknown.
        champion: The alias holders' figures, looked up when a gate asks (None: not gathered,
            because no kind that applies needs it).
        stage: The stage's alias, recorded with each result (empty for a single promotion).
    """

    metrics: Mapping[str, float] = field(default_factory=dict)
    diagnosis: Optional[str] = None
    champion: Optional[ChampionLookup] = None
    stage: str = ""


@runtime_checkable
class GateKind(Protocol):
    """What the promotion service asks of a gate kind.

    Attributes:
        name: The kind's name in :data:`GATES`.
        needs: The inputs it reads (a subset of :data:`INPUTS`): the service gathers only
            what the kinds that apply need, and refuses a kind that needs anything else.
    """

    @property
    def name(self) -> str: ...

    @property
    def needs(self) -> FrozenSet[str]: ...

    def applies(self, gate: Gate) -> bool:
        """Whether this kind evaluates ``gate`` (a spec gate may be evaluated by several)."""

    def evaluate(self, gate: Gate, inputs: GateInputs) -> GateResult:
        """The gate's result for the candidate; a missing input fails it (fail closed)."""


#: The gate kinds: dbspec's own, plus those of installed plugins.
GATES: KindRegistry[GateKind] = KindRegistry("dbspec.gates", "promotion gate kind", {
    "threshold": "dbspec.gates.threshold:KIND",
    "champion": "dbspec.gates.champion:KIND",
    "diagnosis": "dbspec.gates.diagnosis:KIND",
})
