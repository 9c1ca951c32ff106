"""Symbolic integer sizes: `M`, `N / W`, `2 * K`.

Shapes in a pattern are expressions over its parameters and the world size `W`; they get
values when a pattern is bound (defaults, `-D NAME=VALUE`, `--world-size`). `/` is exact
division (binding fails with a located error if it leaves a remainder); `//` floors.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ..errors import PatternError, SourceLoc, UsageError, show_int

WORLD = "W"  # the reserved name of the world size in every pattern

# The deepest expression tree allowed. Evaluating, printing and comparing an expression
# recurse on it, and a real size is a handful of operations; a bound far below Python's
# recursion limit turns a runaway expression into an error, not a RecursionError.
MAX_DEPTH = 200


class DivisionError(ValueError):
    """`a / b` with a remainder: the caller turns it into a located PatternError."""

    def __init__(self, expr: Expr, lhs: int, rhs: int):
        what = "divides by zero" if rhs == 0 else "does not divide evenly"
        super().__init__(f"{expr} = {show_int(lhs)} {expr.op} {show_int(rhs)} {what}")
        self.expr, self.lhs, self.rhs = expr, lhs, rhs


class Expr:
    """Base of symbolic integer expressions; supports + - * / // % with ints and Exprs."""

    depth = 0  # operations on the longest path to a leaf (a Bin sets its own)

    def evaluate(self, env: dict[str, int]) -> int:
        raise NotImplementedError

    def symbols(self) -> set[str]:
        raise NotImplementedError

    # Operator sugar so the Python DSL can write `N / tk.W`.
    def _bin(self, op: str, other, swap: bool = False) -> Expr:
        try:
            other = as_expr(other)
        except TypeError:
            shown = f"{other!r} {op} {self}" if swap else f"{self} {op} {other!r}"
            raise UsageError(f"{shown}: a size is combined with ints and sizes only, not a "
                             f"{type(other).__name__}", _caller_loc(),
                             "use // to divide and round down; write whole numbers") from None
        return Bin(op, other, self) if swap else Bin(op, self, other)

    def __neg__(self):
        return Const(0)._bin("-", self)

    def __pos__(self):
        return self

    # Sizes have no value while a pattern is traced: what needs one is refused by name.
    def _no_value(self, what: str):
        raise UsageError(f"{what} needs the value of {self}, and sizes have none while the "
                         "pattern is traced", _caller_loc(),
                         "build the pattern from sizes alone (no if, range or int() on them); "
                         "values come when it is bound (-D, values=)")

    def __lt__(self, other):
        self._no_value(f"comparing {self} < {other!r}")

    def __le__(self, other):
        self._no_value(f"comparing {self} <= {other!r}")

    def __gt__(self, other):
        self._no_value(f"comparing {self} > {other!r}")

    def __ge__(self, other):
        self._no_value(f"comparing {self} >= {other!r}")

    def __index__(self):
        self._no_value(f"using {self} as an int")

    def __int__(self):
        self._no_value(f"int({self})")

    def __float__(self):
        self._no_value(f"float({self})")

    def __pow__(self, other):
        self._no_value(f"{self} ** {other!r}")

    def __add__(self, o):
        return self._bin("+", o)

    def __radd__(self, o):
        return self._bin("+", o, True)

    def __sub__(self, o):
        return self._bin("-", o)

    def __rsub__(self, o):
        return self._bin("-", o, True)

    def __mul__(self, o):
        return self._bin("*", o)

    def __rmul__(self, o):
        return self._bin("*", o, True)

    def __truediv__(self, o):
        return self._bin("/", o)

    def __rtruediv__(self, o):
        return self._bin("/", o, True)

    def __floordiv__(self, o):
        return self._bin("//", o)

    def __rfloordiv__(self, o):
        return self._bin("//", o, True)

    def __mod__(self, o):
        return self._bin("%", o)


@dataclass(frozen=True, eq=True)
class Const(Expr):
    """An integer literal."""

    value: int

    def evaluate(self, env):
        return self.value

    def symbols(self):
        return set()

    def __str__(self):
        return str(self.value)


@dataclass(frozen=True, eq=True)
class Sym(Expr):
    """A named size: a pattern parameter or `W`."""

    name: str

    def evaluate(self, env):
        if self.name not in env:
            raise KeyError(self.name)
        return int(env[self.name])

    def symbols(self):
        return {self.name}

    def __str__(self):
        return self.name


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2, "%": 2}


@dataclass(frozen=True, eq=True)
class Bin(Expr):
    """A binary operation on two expressions."""

    op: str
    lhs: Expr
    rhs: Expr
    depth: int = field(default=0, init=False, compare=False, repr=False)

    def __post_init__(self):
        depth = 1 + max(self.lhs.depth, self.rhs.depth)
        if depth > MAX_DEPTH:
            raise PatternError(f"a size expression nests more than {MAX_DEPTH} operations",
                               _caller_loc(), "compute the size in Python and pass an int, "
                               "or make it a pattern parameter")
        object.__setattr__(self, "depth", depth)

    def evaluate(self, env):
        a, b = self.lhs.evaluate(env), self.rhs.evaluate(env)
        if self.op == "+":
            return a + b
        if self.op == "-":
            return a - b
        if self.op == "*":
            return a * b
        if b == 0:
            raise DivisionError(self, a, b)
        if self.op == "/":
            if a % b:
                raise DivisionError(self, a, b)
            return a // b
        if self.op == "//":
            return a // b
        return a % b

    def symbols(self):
        return self.lhs.symbols() | self.rhs.symbols()

    def __str__(self):
        def side(e: Expr, right: bool) -> str:
            if isinstance(e, Bin):
                weaker = _PREC[e.op] < _PREC[self.op]
                # a right operand of equal precedence needs brackets (M * (N / K) stays so)
                same_noncomm = right and _PREC[e.op] == _PREC[self.op]
                if weaker or same_noncomm:
                    return f"({e})"
            return str(e)

        return f"{side(self.lhs, False)} {self.op} {side(self.rhs, True)}"


def _caller_loc() -> SourceLoc | None:
    """Where user code built the expression: the first frame outside this module."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return SourceLoc(frame.f_code.co_filename, frame.f_lineno) if frame is not None else None


def as_expr(value) -> Expr:
    """Wrap an int (or pass through an Expr); anything else is a TypeError."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a size must be an int or a size expression, got {value!r}")
    return Const(value)


W = Sym(WORLD)
