"""User-facing errors.

Everything a person can get wrong (a missing file, a tokenizer that does not match a checkpoint,
hyperparameters that contradict each other) raises :class:`QkvError` with one sentence that names the
problem and the fix. The command line prints that sentence and exits with code 2; it never shows a
traceback for these.
"""

from __future__ import annotations


class QkvError(Exception):
    """A problem with the user's input, stated together with how to fix it."""

    exit_code = 2
