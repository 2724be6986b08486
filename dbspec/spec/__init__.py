"""The spec language: models, loading, templating, validation and the JSON schema.

Imports only pydantic and PyYAML.
"""

from dbspec.spec.loader import LoadedSpec, apply_values, load_spec, validate_file
from dbspec.spec.sections import Spec

__all__ = ["LoadedSpec", "Spec", "apply_values", "load_spec", "validate_file"]
