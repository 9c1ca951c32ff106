"""User-facing errors: every one names where in the user's source it comes from.

A `TileLinkError` carries an optional `SourceLoc` and hint; `str(err)` renders the
compiler-style message (file:line:col, the source line with a caret, the fix), so the
CLI prints it as is and never shows a traceback for bad input.

What an error echoes is bounded: a long source line is shown as a window around the
column, and a message or hint line longer than `MAX_LINE` keeps its two ends, so a
one-line file of a gigabyte (or a name as long) cannot make a gigabyte message.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass

# The longest source line an error shows whole; a longer one is cut to a window of this
# many characters around the column (a terminal's width, with room for the "...").
ECHO_WIDTH = 100
# The longest line of a message or hint kept whole (a hang report's records are ~200).
MAX_LINE = 2000


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

    def echo(self) -> tuple[str, int] | None:
        """(the source line as shown, the caret's 1-based column in it), or None.

        A line longer than ECHO_WIDTH is cut to a window around the column, with "..." on
        each cut side; the caret moves with it.
        """
        line = self.source_line()
        if line is None:
            return None
        line = _visible(line)
        col = max(self.col, 1)
        if len(line) <= ECHO_WIDTH:
            return line, col
        start = max(0, min(col - 1 - ECHO_WIDTH // 2, len(line) - ECHO_WIDTH))
        end = start + ECHO_WIDTH
        head, tail = ("..." if start else ""), ("..." if end < len(line) else "")
        return head + line[start:end] + tail, col - start + len(head)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


def _visible(line: str) -> str:
    """`line` with control and format characters (CR, ESC, NUL, bidi overrides) shown as
    '?', one for one so the caret stays in place: an echoed line must not move the cursor,
    recolour the terminal or reorder what is shown."""
    if line.isprintable():
        return line
    return "".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in line)


def _tidy(text: str) -> str:
    """A message or hint as shown: long lines shortened, control characters visible."""
    return "\n".join(_visible(line) for line in shorten(text).split("\n"))


def shorten(text: str, limit: int = MAX_LINE) -> str:
    """`text` with every line longer than `limit` cut in the middle (its ends are kept)."""
    if len(text) <= limit and "\n" not in text:
        return text
    lines = text.split("\n")
    keep = limit // 2
    return "\n".join(
        line if len(line) <= limit
        else f"{line[:keep]} ... ({len(line) - 2 * keep} characters left out) ... {line[-keep:]}"
        for line in lines)


def show_int(n: int) -> str:
    """`n` for a message: in digits up to 128 bits, else its size as a power of two (Python
    refuses to print integers of more than 4300 digits, and nobody reads them)."""
    if isinstance(n, bool) or not isinstance(n, int) or n.bit_length() <= 128:
        return str(n)
    return f"{'-' if n < 0 else ''}2**{n.bit_length() - 1}+ (a {n.bit_length()}-bit integer)"


class TileLinkError(Exception):
    """Base class for errors caused by user input (patterns, configs, tensors)."""

    kind = "error"

    def __init__(self, message: str, loc: SourceLoc | None = None, hint: str | None = None):
        message = _tidy(str(message))
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.hint = _tidy(str(hint)) if hint is not None else None

    def __str__(self) -> str:
        head = f"{self.loc}: {self.kind}: {self.message}" if self.loc else f"{self.kind}: {self.message}"
        parts = [head]
        shown = self.loc.echo() if self.loc else None
        if shown is not None:
            line, col = shown
            parts.append("    " + line)
            parts.append("    " + " " * (col - 1) + "^")
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


class UsageError(TileLinkError, TypeError, ValueError):
    """A Python API was called with an argument it does not take (wrong kind or value).

    Also a TypeError and a ValueError, so code that catches those for bad arguments keeps
    working; the message names what is accepted.
    """


class TileLinkWarning(UserWarning):
    """Something in the user's input that is valid but probably not meant (e.g. an unused
    input). Shown with the user's file and line (`warnings.warn_explicit`)."""


# Names longer than this get no 'did you mean' hint: comparing long strings costs time
# quadratic in their length, and no misspelling of a real name is that long.
_MAX_SUGGEST = 100


def closest(name: str, options) -> str | None:
    """The option most similar to `name` (for 'did you mean' hints), or None."""
    import difflib

    if not isinstance(name, str) or len(name) > _MAX_SUGGEST:
        return None
    options = [o for o in options if isinstance(o, str) and len(o) <= _MAX_SUGGEST]
    found = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return found[0] if found else None
