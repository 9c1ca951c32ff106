"""Free text in generated source: docstrings and comments that cannot be broken out of.

A generated module quotes text the user chose: the pattern file's path (any characters a
file name may hold), and, defensively, every line of its docstrings and comments. A newline,
a triple quote or a backslash there would end the docstring or comment and make the rest
of the text code, which importing the module (`tilelink run`, `--emit ptx`) would run.

Both functions leave printable ASCII as it is (so ordinary text renders unchanged) and
write every other character as a Python escape (`\\n`, `\\x0c`, `\\u2028`); a docstring
also escapes `\\` and `"`, so its value (`__doc__`) is the original text again.
"""

from __future__ import annotations

_PRINTABLE = frozenset(chr(c) for c in range(0x20, 0x7F))


def _escaped(ch: str) -> str:
    return ch.encode("unicode_escape").decode("ascii")


def doc_text(text: str) -> str:
    """`text` as the content of a `\"\"\"...\"\"\"` docstring line (no quote, backslash or
    line break can end it)."""
    return "".join(ch if ch in _PRINTABLE and ch not in '\\"' else
                   ("\\" + ch if ch == '"' else _escaped(ch)) for ch in str(text))


def comment_text(text: str) -> str:
    """`text` as the rest of a `#` comment line (no line break can end it)."""
    return "".join(ch if ch in _PRINTABLE and ch != "\\" else _escaped(ch)
                   for ch in str(text))
