"""The registry's error, apart so that its lock module can raise it too."""

from dbspec.errors import DbspecError


class RegistryError(DbspecError):
    """A registry operation cannot be done (unknown model, version or alias)."""
