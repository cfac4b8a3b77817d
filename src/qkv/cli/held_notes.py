"""Notes come after the input is checked: while a verb starts, the ``note:`` lines written to stderr are held.

A bad input gets one line and exit code 2, nothing before it. But some notes are written before a verb has
checked everything (how many threads a busy machine leaves, which checkpoint a run folder opens). So
:func:`qkv.cli.main` runs each verb with stderr wrapped in :class:`HeldNotes`: text made only of lines that
begin with ``note:`` is held back; the first other text on stderr (a progress bar, a log line), a note the verb
prints itself once its input is checked (:func:`qkv.cli.options.note`), or the verb's normal end releases the held
notes in their order. A refused input (:class:`~qkv.errors.QkvError`) drops them: the error is the one line.
"""

from __future__ import annotations

import sys
from typing import TextIO

PREFIX = "note:"


def _only_notes(text: str) -> bool:
    """Every line of ``text`` begins with ``note:`` (the last one may be an unfinished start of it)."""
    lines = text.split("\n")
    return all(line.startswith(PREFIX) or (i == len(lines) - 1 and PREFIX.startswith(line))
               for i, line in enumerate(lines))  # fmt: skip


class HeldNotes:
    """A stderr that holds notes until :meth:`release` (or until something else is written); :meth:`drop`
    forgets them. Every other attribute is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.held = ""
        self.holding = True

    def write(self, text: str) -> int:
        if not self.holding:
            return self.stream.write(text)
        if _only_notes(self.held + text):
            self.held += text
            return len(text)
        self.held += text
        self.release()
        return len(text)

    def release(self) -> None:
        """Write the held notes now and stop holding."""
        held, self.held, self.holding = self.held, "", False
        if held:
            sys.stdout.flush()  # what the verb printed so far comes first, as it was written
            self.stream.write(held)
            self.stream.flush()

    def drop(self) -> None:
        """Forget the held notes (the input was refused) and stop holding."""
        self.held, self.holding = "", False

    def flush(self) -> None:
        if not self.holding:
            self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def release_notes() -> None:
    """Write the notes held so far (the verb has checked its input)."""
    if isinstance(sys.stderr, HeldNotes):
        sys.stderr.release()
