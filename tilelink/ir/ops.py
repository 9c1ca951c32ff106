"""Ops in the IR: the record of one op application and the registry of op families.

An `Op` is a frozen record (what the user wrote); an `OpSpec` says what arguments and
attributes an op family takes, whether it communicates or computes, and how its result's
shape, dtype and placement follow from its bound inputs (its shape rule).

The families themselves live in `tilelink.ops`, one module each, which registers here
(`register`) and in the other layers' registries (region rule, torch references,
lowerings); this module holds only the registry and the helpers shape rules share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import PatternError, SourceLoc, closest
from .tensor import FLOAT_DTYPES, LOCAL, PARTIAL, REPLICATED, BoundTensor, Placement, shard


@dataclass(frozen=True)
class Op:
    """One op application: `result = kind(args..., attr=value...)`."""

    kind: str
    result: str
    args: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    fn: str | None = None  # the user tile function of a `map`
    loc: SourceLoc | None = field(default=None, compare=False)
    arg_locs: tuple[SourceLoc | None, ...] = field(default=(), compare=False)

    def attr(self, name: str, default=None):
        return dict(self.attrs).get(name, default)

    def arg_loc(self, i: int) -> SourceLoc | None:
        return self.arg_locs[i] if i < len(self.arg_locs) and self.arg_locs[i] else self.loc

    def __str__(self) -> str:
        parts = ([self.fn] if self.fn else []) + list(self.args)
        parts += [f"{k} = {v}" for k, v in self.attrs]
        return f"{self.result} = {self.kind}({', '.join(parts)})"


@dataclass(frozen=True)
class Inferred:
    shape: tuple[int, ...]
    dtype: str
    placement: Placement


ShapeRule = Callable[[Op, list[BoundTensor], dict, int], Inferred]


@dataclass(frozen=True)
class OpDoc:
    """An op family's entry in the op reference (`tilelink ops`, docs/ops.md), written in its
    module next to the shape rule it describes; the reference adds what the registries say
    (signature, defaults, attribute kinds, operand dtypes, lowerings).

    args: each operand and attribute (a variadic op: each name its `signature` gives) -> what
    it takes: a tensor's shape and placement, an attribute's meaning.
    result: the result's shape, dtype and placement.
    example: one statement applying the op in the text DSL; None where the op has no text
    form (then `python` is the example).
    given: text-DSL declarations of the tensors the example reads, and sizes the parameters
    of the pattern they make ("M = 64, K = 32"): the example is checked by parsing and
    binding that pattern (tests/test_ops_reference.py).
    python: the Python-DSL statement where it is not the text one respelled (no text form);
    python_setup: Python lines it needs before the pattern (a tile function).
    signature: how the op is called where its operands do not say (a variadic op).
    notes: what else a user must know (e.g. where its kernels fall back).
    """

    args: dict[str, str]
    result: str
    example: str | None
    given: tuple[str, ...]
    sizes: str
    python: str | None = None
    python_setup: str = ""
    signature: str | None = None
    notes: str = ""


@dataclass(frozen=True)
class OpSpec:
    """Signature and meaning of one op family."""

    name: str
    category: str  # "comm" or "compute"
    operands: tuple[str, ...]  # positional tensor arguments
    attrs: dict[str, Any]  # attribute name -> default (None: required)
    rule: ShapeRule
    doc: str
    variadic: bool = False  # `map` takes any number of tensors
    # attribute name -> its kind (tilelink.ir.attrs.Attr); undeclared ones follow
    # attrs.CONVENTIONS, checked at bind for every op
    attr_kinds: dict[str, Any] = field(default_factory=dict)
    # operand index (or "*": every operand not listed) -> the dtypes it takes (None: any);
    # undeclared operands follow the category's convention (`operand_dtypes`)
    dtypes: dict[Any, tuple[str, ...] | None] = field(default_factory=dict)
    # its entry in the op reference (`tilelink ops`); `doc` is its one-line summary
    details: OpDoc | None = None
    # attributes that come from the op's user function (map: its tile function's own
    # parameters): fn_attrs(fn name, the pattern's functions) -> {name: None if it may be
    # given, else why not (a hint)}; see `check_attr_name`
    fn_attrs: Callable[[str | None, dict], dict[str, str | None]] | None = None
    # a collective that sums the ranks' tensors (its result is the sum, or a rank's slice of
    # it): what a rank moves is sized by the result, not by the operand
    sums: bool = False
    # a matrix product [M, K] x [K, N] -> [M, N] of its first two operands (the cost model
    # times it in waves of output tiles, with the collective feeding it or fed by it)
    matmul: bool = False
    # how many of the last `operands` may be left out (attention_partial's per-sequence
    # lengths): the shape rule, region rule, references and lowerings see only those given
    optional: int = 0

    @property
    def takes_function(self) -> bool:
        """Whether the op's first argument is a user tile function (Python DSL only)."""
        return self.fn_attrs is not None

    def operand_words(self) -> str:
        """Its tensor arguments as written: 'q, k, v[, kv_len]' (optional ones bracketed)."""
        need = len(self.operands) - self.optional
        words = ", ".join(self.operands[:need])
        return words + "".join(f"[, {a}]" for a in self.operands[need:])

    def arity_error(self, given: int) -> str | None:
        """Why `given` tensor arguments are wrong for this op (None: they are right)."""
        need = len(self.operands) - self.optional
        if self.variadic or need <= given <= len(self.operands):
            return None
        count = str(need) if not self.optional else f"{need} to {len(self.operands)}"
        return f"{self.name} takes {count} tensor argument(s), got {given}"

    def usage(self) -> str:
        """How the op is written, e.g. 'all_gather(x, dim = 0)' (for error hints)."""
        args = (["fn"] if self.takes_function else []) + \
            ([self.operand_words()] if self.operands else [])
        if self.variadic and not self.operands:
            args.append("*tensors")
        args += [f"{k} = {v}" if v is not None else k for k, v in self.attrs.items()]
        return f"{self.name}({', '.join(args)})"


# filled by the modules of tilelink.ops, which `import tilelink` loads before anything else
OPS: dict[str, OpSpec] = {}


def register(name, category, operands, attrs, doc, variadic=False, attr_kinds=None,
             dtypes=None, details=None, fn_attrs=None, sums=False, matmul=False, optional=0):
    """Decorator: register a shape rule as the op family `name`. `attr_kinds` declares the
    kinds of its attributes (see tilelink.ir.attrs), `dtypes` the dtypes of its operands
    (see `operand_dtypes`); both are checked by `Pattern.bind` before the rule runs.
    `details` is its entry in the op reference (`OpDoc`); `fn_attrs` names the attributes
    the op's user function adds (see `OpSpec.fn_attrs`); `sums` marks a summing collective
    (`OpSpec.sums`), `matmul` a matrix product (`OpSpec.matmul`); the last `optional`
    operands may be left out (`OpSpec.optional`)."""

    def wrap(rule: ShapeRule) -> ShapeRule:
        OPS[name] = OpSpec(name, category, tuple(operands), dict(attrs), rule, doc, variadic,
                           dict(attr_kinds or {}), dict(dtypes or {}), details, fn_attrs,
                           sums, matmul, optional)
        return rule

    return wrap


def check_attr_name(sp: OpSpec, key: str, fn: str | None, functions: dict,
                    loc: SourceLoc | None) -> None:
    """Refuse, at `loc`, an attribute `key` that op `sp` does not take: neither one of its
    own (`sp.attrs`) nor one its user function `fn` adds (`sp.fn_attrs`). Both frontends and
    `Pattern.bind` ask this, so an attribute means the same whichever wrote it."""
    if key in sp.attrs:
        return
    extra = sp.fn_attrs(fn, functions) if sp.fn_attrs is not None else {}
    if key in extra and extra[key] is None:
        return
    if key in extra:
        raise PatternError(f"{sp.name} cannot set parameter '{key}' of {fn}", loc, extra[key])
    takes = list(sp.attrs) + [k for k, why in extra.items() if why is None]
    hint = closest(key, takes)
    if hint:
        hint = f"did you mean '{hint}'?"
    elif sp.fn_attrs is not None:
        hint = (f"{sp.name} sets {fn}'s parameters " + ", ".join(takes) + " by keyword"
                if takes else f"{fn} has no parameter that {sp.name} sets by keyword (its "
                "other parameters come from the calling convention and the pattern's sizes)")
    else:
        hint = f"write {sp.usage()}"
    raise PatternError(f"{sp.name} has no argument '{key}'", loc, hint)


#: the dtypes operands take where an op does not say: a compute op computes in floating point
#: (GEMMs, softmax, user tile functions: the kernels and cuBLAS take bf16, fp16 and fp32), a
#: collective moves or sums any dtype
CATEGORY_DTYPES: dict[str, tuple[str, ...] | None] = {"compute": FLOAT_DTYPES, "comm": None}


def operand_dtypes(sp: OpSpec, i: int) -> tuple[str, ...] | None:
    """The dtypes operand `i` of an op of spec `sp` takes (None: any): the spec's `dtypes`
    (by index, else "*"), else its category's convention (CATEGORY_DTYPES)."""
    declared = sp.dtypes
    if i in declared:
        return declared[i]
    if "*" in declared:
        return declared["*"]
    return CATEGORY_DTYPES.get(sp.category)


def dtype_words(dtypes) -> str:
    """'bf16, fp16 or fp32'."""
    dtypes = list(dtypes)
    return dtypes[0] if len(dtypes) == 1 else ", ".join(dtypes[:-1]) + " or " + dtypes[-1]


def fail(op: Op, msg: str, hint: str | None = None, arg: int | None = None):
    raise PatternError(msg, op.arg_loc(arg) if arg is not None else op.loc, hint)


def check_dim(op: Op, x: BoundTensor, dim: int, arg: int = 0) -> None:
    if not -len(x.shape) <= dim < len(x.shape):
        fail(op, f"dim = {dim} is out of range for {x.name}, which has {len(x.shape)} dims",
              f"use a dim between 0 and {len(x.shape) - 1}", arg)


def same_dtype(op: Op, xs: list[BoundTensor]) -> str:
    dtypes = {x.dtype for x in xs}
    if len(dtypes) > 1:
        desc = ", ".join(f"{x.name} is {x.dtype}" for x in xs)
        fail(op, f"{op.kind} needs operands of one dtype: {desc}",
              "declare the inputs with the same dtype (or the same dtype parameter)")
    return xs[0].dtype


def local_shape(x: BoundTensor) -> tuple[int, ...]:
    return x.local_shape


def result_placement(xs: list[BoundTensor]) -> Placement:
    """A compute op's result placement: replicated when every operand is, else per rank."""
    return REPLICATED if all(x.placement.kind == "replicated" for x in xs) else LOCAL


def spec(kind: str) -> OpSpec | None:
    """The OpSpec for an op name, or None if unknown."""
    return OPS.get(kind)
