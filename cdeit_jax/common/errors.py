"""The project's own error types: problems with the user's input or environment that cdeit-jax
detects and explains in one message naming the file, field or flag and how to fix it.

The commands (`cdeit_jax.cli`) print these as one line; any other exception is not ours to
summarise and keeps its traceback. Each also subclasses the matching built-in type, so callers
may catch `ValueError`, `FileNotFoundError` or `MemoryError` as before.
"""


class CdeitError(Exception):
  """Base of the errors the commands print as one line."""


class InputError(CdeitError, ValueError):
  """A bad value: a config key, flag, file content or argument."""


class MissingFile(CdeitError, FileNotFoundError):
  """A path the user gave does not exist or holds nothing usable."""


class DoesNotFit(CdeitError, MemoryError):
  """A program that does not fit the devices' memory (with advice)."""
