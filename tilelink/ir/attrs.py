"""Op attributes: which values each one takes, checked once, for every op, at bind time.

`Pattern.bind` evaluates an op's attributes (sizes become ints), then checks each value
against its `Attr` and normalises it, so the op's shape rule and every later layer (plan,
schedule, codegen, references) see checked values: a `dim` is an int with
0 <= dim < rank of its tensor (`dim = -1` is the last one, as in torch), a flag is 0 or 1.

An op declares the kind of an attribute in its `OpSpec` through an `attr_kinds` mapping
(attribute name -> `Attr`); an attribute it does not declare follows the naming
convention in `CONVENTIONS` (`dim` is a dim of the op's first tensor, `causal` a flag),
else it is `INT`,
any integer. A value of None means "not given" (an attribute whose default is None) and is
left to the op's rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import PatternError


@dataclass(frozen=True)
class Attr:
    """The values one op attribute takes.

    kind: "int" (an integer in [low, high], bounds inclusive, None: unbounded), "dim" (a
    dim of tensor operand `of`; negative counts from the end; normalised to
    0 <= dim < rank) or "flag" (0 or 1; True and False in the Python DSL).
    """

    kind: str = "int"
    of: int = 0
    low: int | None = None
    high: int | None = None

    def describe(self) -> str:
        """What the attribute takes, in words (for messages)."""
        if self.kind == "flag":
            return "a flag: 0 or 1"
        if self.kind == "dim":
            return "a dim (an integer; negative counts from the last dim)"
        if self.low is not None and self.high is not None:
            return f"an integer from {self.low} to {self.high}"
        if self.low is not None:
            return f"an integer >= {self.low}"
        if self.high is not None:
            return f"an integer <= {self.high}"
        return "an integer"


INT = Attr("int")
POSITIVE = Attr("int", low=1)
FLAG = Attr("flag")
DIM = Attr("dim")

# attribute name -> kind, for attributes an op's spec does not declare: names that mean
# the same in every op (`dim`: a dim of the first tensor; `causal`: on or off)
CONVENTIONS: dict[str, Attr] = {"dim": DIM, "causal": FLAG}


def attr_kind(sp, name: str) -> Attr:
    """The declared kind of attribute `name` of the op spec `sp` (see the module doc)."""
    declared = getattr(sp, "attr_kinds", None) or {}
    return declared.get(name) or CONVENTIONS.get(name, INT)


def takes_bool(sp, name: str) -> bool:
    """Whether the Python DSL may pass True / False for this attribute (flags only)."""
    return attr_kind(sp, name).kind == "flag"


def check_attr(op, name: str, value: Any, kind: Attr, tensors: list) -> Any:
    """The value of attribute `name` of `op`, checked against `kind` and normalised.

    `tensors` are the op's bound tensor operands (a dim is checked against the rank of
    `tensors[kind.of]`). Raises a `PatternError` located at the op.
    """
    if value is None:
        return None
    if isinstance(value, bool) and kind.kind == "flag":
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PatternError(f"{op.kind}({name} = {value!r}): {name} takes {kind.describe()}, "
                           f"not a {type(value).__name__}", op.loc,
                           f"write e.g. {name} = {1 if kind.kind == 'flag' else 0}")
    if kind.kind == "flag":
        if value not in (0, 1):
            raise PatternError(f"{op.kind}({name} = {value}): {name} is a flag (0 or 1)",
                               op.loc, f"write {name} = 1 to turn it on, {name} = 0 (or "
                               "nothing) to leave it off")
        return value
    if kind.kind == "dim":
        if kind.of >= len(tensors):
            return value  # an arity error: the caller reports it
        x = tensors[kind.of]
        rank = len(x.shape)
        if not -rank <= value < rank:
            raise PatternError(f"{name} = {value} is out of range for {x.name}, which has "
                               f"{rank} dim{'s' if rank != 1 else ''}", op.arg_loc(kind.of),
                               f"use a dim between 0 and {rank - 1} (or -{rank} to -1, "
                               "counting from the last)" if rank else
                               f"{x.name} has no dims to choose from")
        return value % rank
    if (kind.low is not None and value < kind.low) or (kind.high is not None
                                                       and value > kind.high):
        raise PatternError(f"{op.kind}({name} = {value}): {name} takes {kind.describe()}",
                           op.loc)
    return value
