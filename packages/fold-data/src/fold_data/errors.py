"""Errors for bad input. Every message names the file, the record and what was expected."""

from __future__ import annotations

import os

__all__ = ["InputError", "InputWarning"]


class InputError(ValueError):
    """Bad input data: a malformed file, a missing record, inconsistent sequences.

    ``path`` is the offending file, ``record`` the entry in it (chain ID, sequence name, line
    number, hit index, ...) and the message says what was expected.
    """

    def __init__(self, path: str | os.PathLike | None, record: str | None, message: str):
        self.path = None if path is None else os.fspath(path)
        self.record = record
        self.reason = message
        where = self.path or "<input>"
        if record:
            where += f" [{record}]"
        super().__init__(f"{where}: {message}")


class InputWarning(UserWarning):
    """Input skipped with a documented warning (e.g. template hits whose mmCIF is missing)."""
