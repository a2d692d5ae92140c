"""The error for bad input files."""

from __future__ import annotations


class DataError(ValueError):
    """A bad input record or file. The message starts with `file:line:` (or `file:`) and names the field."""
