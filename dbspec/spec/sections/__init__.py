"""The spec models: the one source of truth for what a spec may say.

The root is :class:`~dbspec.spec.sections.root.Spec`; sections live in the sibling modules,
the compute and data-source sections in their kinds' modules (:mod:`dbspec.compute`). Every
model forbids unknown keys and is frozen.
"""

from dbspec.spec.sections.root import SECTION_NAMES, SparkSpec, Spec, TargetSpec

__all__ = ["SECTION_NAMES", "SparkSpec", "Spec", "TargetSpec"]
