"""User-facing errors: every one names where in the user's source it comes from.

A `TileLinkError` carries an optional `SourceLoc` and hint; `str(err)` renders the
compiler-style message (file:line:col, the source line with a caret, the fix), so the
CLI prints it as is and never shows a traceback for bad input.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    """A position in the user's pattern source (1-based line and column)."""

    file: str
    line: int
    col: int = 1
    text: str | None = None  # the source line; read from `file` when None

    def source_line(self) -> str | None:
        if self.text is not None:
            return self.text
        line = linecache.getline(self.file, self.line)
        return line.rstrip("\n") if line else None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class TileLinkError(Exception):
    """Base class for errors caused by user input (patterns, configs, tensors)."""

    kind = "error"

    def __init__(self, message: str, loc: SourceLoc | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.hint = hint

    def __str__(self) -> str:
        head = f"{self.loc}: {self.kind}: {self.message}" if self.loc else f"{self.kind}: {self.message}"
        parts = [head]
        line = self.loc.source_line() if self.loc else None
        if line is not None:
            parts.append("    " + line)
            parts.append("    " + " " * (max(self.loc.col, 1) - 1) + "^")
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)


class DSLSyntaxError(TileLinkError):
    """The text DSL could not be parsed."""

    kind = "syntax error"


class PatternError(TileLinkError):
    """The pattern parses but means nothing valid (shapes, names, placements)."""


class ConfigError(TileLinkError):
    """A schedule config value is outside its space."""

    kind = "config error"


class NotSupportedError(TileLinkError):
    """A valid request that this version cannot do yet (says what can be done instead)."""

    kind = "not supported"


class RuntimeCheckError(TileLinkError):
    """Bad tensors handed to a compiled op, or a world that does not match."""


class HangError(TileLinkError):
    """A bounded wait expired: carries the decoded diagnostic report."""

    kind = "hang"


def closest(name: str, options) -> str | None:
    """The option most similar to `name` (for 'did you mean' hints), or None."""
    import difflib

    found = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return found[0] if found else None
