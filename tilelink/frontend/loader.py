"""Load a pattern from disk: `file.tl` (text DSL) or `file.py:name` (Python DSL)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from ..errors import SourceLoc, TileLinkError, closest
from ..ir import Pattern
from .text import parse_text


class LoadError(TileLinkError):
    """A pattern file is missing, unreadable, or does not hold the pattern asked for."""

    kind = "error"


def load_text(path: str | Path) -> Pattern:
    """Read and parse a `.tl` file (errors name the file and line)."""
    path = Path(path)
    return parse_text(_read(path), str(path))


def load_pattern(spec: str | os.PathLike) -> Pattern:
    """Load `path/file.tl` or `path/file.py:function` (a `@tk.pattern` function).

    For a `.py` file without `:function`, the file's only pattern is taken; a path object
    works too. Raises `LoadError` for a missing file, a wrong suffix or a missing pattern.
    """
    spec = os.fspath(spec)
    path_part, sep, attr = spec.rpartition(":")
    if not sep or not path_part.endswith(".py") or not attr.isidentifier():
        path_part, attr = spec, None
    path = Path(path_part)
    if path.suffix == ".tl" and attr is None:
        return load_text(path)
    if path.suffix != ".py":
        raise LoadError(f"cannot load a pattern from '{spec}'",
                        hint="give a text pattern (file.tl) or a Python one (file.py:function)")
    module = _import(path)
    patterns = {k: v for k, v in vars(module).items() if isinstance(v, Pattern)}
    if attr is None:
        if len(patterns) != 1:
            found = ", ".join(sorted(patterns)) or "none"
            raise LoadError(f"{path} holds {len(patterns)} patterns ({found})",
                            hint=f"say which one: {path}:NAME")
        return next(iter(patterns.values()))
    if attr not in vars(module):
        hint = closest(attr, patterns)
        raise LoadError(f"{path} has no pattern '{attr}'",
                        hint=f"did you mean '{hint}'?" if hint else
                        "patterns here: " + (", ".join(sorted(patterns)) or "none"))
    value = getattr(module, attr)
    if not isinstance(value, Pattern):
        raise LoadError(f"{path}:{attr} is a {type(value).__name__}, not a pattern",
                        hint="decorate the function with @tk.pattern")
    return value


def _read(path: Path) -> str:
    if not path.is_file():
        raise LoadError(f"no such pattern file: {path}" if not path.exists()
                        else f"{path} is not a file", hint="check the path")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LoadError(f"cannot read {path}: {e}") from None


def _import(path: Path):
    _read(path)  # the same checks and messages as for a .tl file
    resolved = path.resolve()
    tag = hashlib.sha1(str(resolved).encode()).hexdigest()[:8]
    name = f"_tilelink_user_{resolved.stem}_{tag}"
    spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton.jit and dataclasses look modules up by name
    try:
        spec.loader.exec_module(module)
    except TileLinkError:
        sys.modules.pop(name, None)
        raise
    except SyntaxError as e:
        sys.modules.pop(name, None)
        loc = SourceLoc(str(path), e.lineno or 1, e.offset or 1) if e.lineno else None
        raise LoadError(f"{path} is not valid Python: {e.msg}", loc) from e
    except Exception as e:  # the user's code failed: say where, keep the cause chained
        sys.modules.pop(name, None)
        raise LoadError(f"importing {path} failed: {type(e).__name__}: {e}",
                        _innermost(e, resolved)) from e
    return module


def _innermost(e: BaseException, path: Path) -> SourceLoc | None:
    tb, loc = e.__traceback__, None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == path:
            loc = SourceLoc(str(path), tb.tb_lineno)
        tb = tb.tb_next
    return loc
