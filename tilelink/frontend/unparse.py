"""Patterns back to text-DSL source: `format_text(p)` parses back to `p`."""

from __future__ import annotations

from ..errors import NotSupportedError, UsageError
from ..ir import Bin, Pattern


def format_text(pattern: Pattern) -> str:
    """Render a pattern as text-DSL source (`parse_text(format_text(p)) == p`)."""
    if not isinstance(pattern, Pattern):
        raise UsageError(f"format_text takes a Pattern, got {type(pattern).__name__}",
                         hint="e.g. format_text(load_pattern('examples/ag_gemm.tl'))")
    params = ", ".join(p.name if p.default is None else f"{p.name} = {p.default}"
                       for p in pattern.params)
    lines = [f"pattern {pattern.name}({params})"]
    for t in pattern.inputs:
        placement = "" if t.placement.kind == "local" else f" {t.placement}"
        dims = ", ".join(expr_text(d) for d in t.shape)
        lines.append(f"    {t.name} : [{dims}] {t.dtype}{placement}")
    for op in pattern.ops:
        if op.fn is not None:
            raise NotSupportedError(f"{op.result} = map({op.fn}, ...) has no text form",
                                    op.loc, "keep patterns with map in the Python DSL")
        args = list(op.args) + [f"{k} = {expr_text(v)}" for k, v in op.attrs]
        lines.append(f"    {op.result} = {op.kind}({', '.join(args)})")
    lines.append("    return " + ", ".join(pattern.outputs))
    return "\n".join(lines) + "\n"


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2, "%": 2}


def expr_text(e, leaf=str) -> str:
    """A size (int or Expr) as text that parses back to the same tree; `leaf` spells a number
    or symbol (the Python DSL's spelling of the world size differs).

    Unlike `str(Bin)`, a right operand of equal precedence is always parenthesised:
    `M * (N / K)` is not `M * N / K` when `/` must divide exactly.
    """
    if not isinstance(e, Bin):
        return leaf(e)
    lhs, rhs = expr_text(e.lhs, leaf), expr_text(e.rhs, leaf)
    if isinstance(e.lhs, Bin) and _PREC[e.lhs.op] < _PREC[e.op]:
        lhs = f"({lhs})"
    if isinstance(e.rhs, Bin) and _PREC[e.rhs.op] <= _PREC[e.op]:
        rhs = f"({rhs})"
    return f"{lhs} {e.op} {rhs}"
