"""Op attributes: which values each one takes, checked once, for every op, at bind time.

`Pattern.bind` evaluates an op's attributes (sizes become ints), then checks each value
against its `Attr` and normalises it, so the op's shape rule and every later layer (plan,
schedule, codegen, references) see checked values: a `dim` is an int with
0 <= dim < rank of its tensor (`dim = -1` is the last one, as in torch), a flag is 0 or 1.

An op declares the kind of an attribute in its `OpSpec` through an `attr_kinds` mapping
(attribute name -> `Attr`, `register(..., attr_kinds=...)`); an attribute it does not declare
follows the naming convention in `CONVENTIONS` (`dim` is a dim of the op's first tensor,
`causal` a flag), else it is `INT`, any integer. A value of None means "not given" (an
attribute whose default is None) and is left to the op's rule, except for a `count`, where
it means one block per rank (W).

A `count` also checks the value's provenance: where the pattern shows how its tensor was
stacked (lse_combine's partials: one per rank from attention_partial, gathered along dim 0),
the count must be the number of blocks stacked there (`Attr.expected`, asked with a
`Graph` of the ops bound so far), or the op would combine rows of different blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import PatternError, show_int


@dataclass(frozen=True)
class Attr:
    """The values one op attribute takes.

    kind: "int" (an integer in [low, high], bounds inclusive, None: unbounded), "dim" (a
    dim of tensor operand `of`; negative counts from the end; normalised to
    0 <= dim < rank), "flag" (0 or 1; True and False in the Python DSL) or "value" (an int,
    a finite float or a bool, kept as given: a constant handed to user code).
    """

    kind: str = "int"
    of: int = 0
    low: int | None = None
    high: int | None = None
    # kind "count": expected(graph, tensor name) -> (blocks, how they were stacked) where the
    # pattern shows how the tensor's dim 0 was stacked, (None, how, hint) where it shows the
    # blocks stacked on another dim, else None
    expected: Callable | None = field(default=None, compare=False)
    what: str = "blocks"  # kind "count": what the blocks are, for messages

    def describe(self) -> str:
        """What the attribute takes, in words (for messages)."""
        if self.kind == "flag":
            return "a flag: 0 or 1"
        if self.kind == "value":
            return "a number (an int, a float or a bool)"
        if self.kind == "dim":
            return "a dim (an integer; negative counts from the last dim)"
        if self.kind == "count":
            return (f"the number of {self.what} stacked on dim 0 (an integer >= 1 that "
                    "divides its rows)")
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
VALUE = Attr("value")


@dataclass(frozen=True)
class Graph:
    """What `check_attr` may ask about the pattern bound so far: the world size, the op that
    computed each tensor (inputs have none) and each op's checked attributes."""

    world: int
    producer: dict
    attrs: dict

# attribute name -> kind, for attributes an op's spec does not declare: names that mean
# the same in every op (`dim`: a dim of the first tensor; `causal`: on or off)
CONVENTIONS: dict[str, Attr] = {"dim": DIM, "causal": FLAG}


def attr_kind(sp, name: str) -> Attr:
    """The declared kind of attribute `name` of the op spec `sp` (see the module doc); an
    op that declares "*" gives every attribute it does not name that kind (map: the
    parameters of its tile function, which mean nothing to the conventions)."""
    declared = getattr(sp, "attr_kinds", None) or {}
    return declared.get(name) or declared.get("*") or CONVENTIONS.get(name, INT)


def takes_bool(sp, name: str) -> bool:
    """Whether the Python DSL may pass True / False for this attribute (flags, values)."""
    return attr_kind(sp, name).kind in ("flag", "value")


def check_attr(op, name: str, value: Any, kind: Attr, tensors: list,
               graph: Graph | None = None) -> Any:
    """The value of attribute `name` of `op`, checked against `kind` and normalised.

    `tensors` are the op's bound tensor operands (a dim is checked against the rank of
    `tensors[kind.of]`); `graph` (None: not known) lets a `count` check its provenance.
    Raises a `PatternError` located at the op.
    """
    if value is None:
        if kind.kind == "count" and graph is not None:
            _check_count(op, name, None, kind, tensors, graph)
        return None
    if kind.kind == "value":
        return _check_value(op, name, value, kind)
    if isinstance(value, bool) and kind.kind == "flag":
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PatternError(f"{op.kind}({name} = {value!r}): {name} takes {kind.describe()}, "
                           f"not a {type(value).__name__}", op.loc,
                           f"write e.g. {name} = {_example(kind)}")
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
    if kind.kind == "count":
        _check_count(op, name, value, kind, tensors, graph)
        return value
    if (kind.low is not None and value < kind.low) or (kind.high is not None
                                                       and value > kind.high):
        raise PatternError(f"{op.kind}({name} = {value}): {name} takes {kind.describe()}",
                           op.loc)
    return value


def _check_value(op, name: str, value: Any, kind: Attr) -> Any:
    """A "value" attribute: an int, a bool or a finite float (it is written into generated
    code as a literal, where inf and nan are no Python literals)."""
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    what = "an infinite or NaN float" if isinstance(value, float) else f"a {type(value).__name__}"
    raise PatternError(f"{op.kind}({name} = {value!r}): {name} takes {kind.describe()}, not "
                       f"{what}", op.loc, f"write e.g. {name} = 1.0")


def _example(kind: Attr):
    """A value of this kind, for hints."""
    if kind.kind == "flag":
        return 1
    if kind.kind == "count":
        return "W"
    return kind.low if kind.low is not None else 0


def _check_count(op, name: str, value: int | None, kind: Attr, tensors: list,
                 graph: Graph | None) -> None:
    """A `count` attribute: >= 1, divides the rows of its tensor, and is the number of blocks
    the pattern stacked there (where it shows). None is one block per rank (W)."""
    given = f"{op.kind}({name} = {show_int(value)})" if value is not None else \
        f"{op.kind}'s {name} (not given: W = {graph.world if graph else '?'})"
    if value is not None and value < 1:
        raise PatternError(f"{given}: {name} is {kind.describe()}", op.loc,
                           f"write {name} = W, one {kind.what[:-1]} per rank, or leave it out")
    if kind.of >= len(tensors) or not tensors[kind.of].local_shape:
        return  # an arity or rank error: the op's rule reports it
    x = tensors[kind.of]
    count = value if value is not None else (graph.world if graph is not None else None)
    if count is None:
        return
    expected = kind.expected(graph, x.name) if kind.expected and graph is not None else None
    if expected is not None and expected[0] is None:
        _, how, hint = expected
        raise PatternError(f"{given}: {op.kind} combines {kind.what} stacked on dim 0, but "
                           f"{x.name} holds them along another dim: {how}",
                           op.arg_loc(kind.of), hint)
    if expected is not None and expected[0] != count:
        n, how = expected
        blocks = kind.what if n != 1 else kind.what[:-1]
        default = " or leave it out (it defaults to W)" if n == graph.world else ""
        raise PatternError(f"{given}: {x.name} stacks {n} {blocks} on dim 0 ({how}), not "
                           f"{count}: {name} = {count} would combine the wrong rows",
                           op.arg_loc(kind.of), f"write {name} = {n}{default}")
    rows = x.local_shape[0]
    if rows % count:
        raise PatternError(f"{given}: {show_int(count)} does not divide the {show_int(rows)} "
                           f"rows of {x.name}, so they cannot be {count} stacked {kind.what}",
                           op.arg_loc(kind.of), f"{name} is {kind.describe()}")
