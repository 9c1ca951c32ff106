"""`tilelink ops`: the reference of the DSL's ops, generated from the op registry.

    tilelink ops                  every op: signature, arguments, result, kernels, example
    tilelink ops all_to_all       one op (or several)
    tilelink ops --markdown       the docs page (docs/ops.md is this output)

Each op's own text (what its arguments take, its result, an example) is its `OpDoc`, written
next to its shape rule in `tilelink/ops/`; this module adds what the registries know
(signature and defaults, attribute kinds, operand dtypes, lowerings) and respells the text
example in the Python DSL, so nothing here names an op. tests/test_ops_reference.py checks
that docs/ops.md is this module's output and that every example parses and binds.
"""

from __future__ import annotations

import re
import textwrap

WIDTH = 92  # the terminal text's line width

# What an entry's words mean, said once above the entries (terminal and markdown).
CONVENTIONS = (
    ("Tensors are positional, attributes keywords (`dim = 0` in the text DSL, `dim=0` in the "
    "Python DSL, where every op is `tk.NAME`); an attribute with a default may be left out. "
    "A shape \"per rank\" is what one rank holds: a tensor declared `shard(d)` holds 1/W of "
    "its declared size along d. Placements: `local` (the default: each rank its own tensor), "
    "`replicated`, `shard(d)`, `partial` (each rank a full-shape summand)."),
    ("Kernels: the op's lowerings, each chosen by the config values shown (`--config`, or the "
    "scheduler's default). Every pattern can also run as the non-overlapped plan "
    "(`comm=none`: the collectives as library calls, NCCL on GPUs, and the compute in torch "
    "or cuBLAS), which the scheduler takes where overlap cannot pay or its lowerings cannot "
    "run the pattern (`tilelink compile PATTERN --emit schedule` says why). A pattern with an "
    "op that has no lowering at all runs only as that plan: it is the default, and a config "
    "that asks for a kernel (`comm=sm`, `comm=copy_engine`) is refused, naming the op."),
)


def specs(names: list[str] | None = None) -> list:
    """The OpSpecs of `names` in the order given (None or empty: every op, in registry
    order); an unknown name is a TileLinkError listing the ops."""
    from ..errors import TileLinkError, closest
    from ..ir.ops import OPS

    if not names:
        return list(OPS.values())
    out = []
    for name in names:
        if name not in OPS:
            near = closest(name, OPS)
            raise TileLinkError(f"unknown op '{name}'", hint=(f"did you mean '{near}'? "
                                if near else "") + "the ops: " + ", ".join(OPS))
        out.append(OPS[name])
    return out


def signature(sp) -> str:
    """How the op is called: tensors positional, then attributes with their defaults ('W'
    for a count left to the world size; no default: it must be given)."""
    from ..ir.attrs import attr_kind

    if sp.details is not None and sp.details.signature:
        return sp.details.signature
    args = [sp.operand_words()] if sp.operands else []
    for k, v in sp.attrs.items():
        if v is not None:
            args.append(f"{k} = {v}")
        else:
            args.append(f"{k} = W" if attr_kind(sp, k).kind == "count" else k)
    return f"{sp.name}({', '.join(args)})"


def arguments(sp) -> list[tuple[str, str]]:
    """(name, what it takes) for each argument: the registry's facts (a tensor's dtypes, an
    attribute's default and kind) before the op's own words."""
    from ..ir.attrs import attr_kind
    from ..ir.ops import dtype_words, operand_dtypes

    words = dict(sp.details.args) if sp.details is not None else {}
    out = []
    for i, name in enumerate(sp.operands):
        dtypes = operand_dtypes(sp, i)
        facts = f"tensor, {dtype_words(dtypes) if dtypes else 'any dtype'}"
        if i >= len(sp.operands) - sp.optional:
            facts += ", optional"
        out.append((name, _join(facts, words.pop(name, ""))))
    for name, default in sp.attrs.items():
        kind = attr_kind(sp, name)
        if default is not None:
            facts = f"keyword, default {default}; {kind.describe()}"
        elif kind.kind == "count":
            facts = f"keyword, default W; {kind.describe()}"
        else:
            facts = f"keyword, required; {kind.describe()}"
        out.append((name, _join(facts, words.pop(name, ""))))
    # a variadic op's arguments are the ones its signature names, in its own words
    out += list(words.items())
    return out


def _join(facts: str, words: str) -> str:
    return f"{facts} — {words}" if words else facts


def kernels(sp) -> str:
    """The op's lowerings and the config values choosing each, or that it has none."""
    from ..schedule.lowering import LOWERINGS

    found = LOWERINGS.get(sp.name, [])
    if not found:
        return ("none yet: a pattern with this op runs only as the non-overlapped plan, its "
                "default")
    parts = []
    for lw in found:
        picks = ([f"comm={lw.resource}"] if lw.resource else []) + \
                ([f"{lw.variant_knob}={lw.variant}"] if lw.variant else [])
        parts.append(lw.name + (f" with `{' '.join(picks)}`" if picks else ""))
    return "; ".join(parts)


def knobs(sp) -> str | None:
    """The op knobs its family declares (`--config NAME=VALUE`): name, values, default and
    what each does; None where it declares none."""
    from ..schedule.knobs import OP_KNOBS

    own = [k for k in OP_KNOBS.values() if k.family == sp.name]
    if not own:
        return None
    return "; ".join(f"{k.name} = {'|'.join(map(str, k.values)) if k.values else k.check_text or ('an integer' if k.is_int else 'text')} "
                     f"(default {k.default}): {k.help}" for k in own)


def _sizes(sp) -> list[tuple[str, str]]:
    """The example pattern's parameters, (name, value), from the OpDoc's "M = 64, K = 32"."""
    return [tuple(x.strip() for x in item.split("=", 1)) for item in sp.details.sizes.split(",")]


def _result_name(statement: str) -> str:
    return statement.split("=", 1)[0].strip()


def example_text(sp) -> str | None:
    """The op's example as a whole text-DSL pattern (its declarations, the example, a
    return); None where the op has no text form."""
    d = sp.details
    if d is None or d.example is None:
        return None
    header = ", ".join(f"{k} = {v}" for k, v in _sizes(sp))
    body = [*d.given, d.example, f"return {_result_name(d.example)}"]
    return f"pattern {sp.name}_example({header})\n" + "".join(f"    {x}\n" for x in body)


def python_statement(sp) -> str | None:
    """The example statement in the Python DSL: the OpDoc's own (an op with no text form),
    else the text example parsed and respelled."""
    from ..frontend.text import parse_text

    d = sp.details
    if d is None:
        return None
    if d.python is not None:
        return d.python
    op = parse_text(example_text(sp), f"<{sp.name} example>").ops[-1]
    return python_op(op)


def example_python(sp) -> str:
    """The op's example as a Python module: the OpDoc's setup (a tile function) and a
    `@tk.pattern` function `<op>_example` with the same inputs, statement and return as the
    text pattern."""
    from ..frontend.text import parse_text

    d = sp.details
    header = ", ".join(f"{k} = {v}" for k, v in _sizes(sp))
    # the declarations alone, as a pattern returning its first input, give the Python inputs
    decls = f"pattern inputs({header})\n" + "".join(f"    {x}\n" for x in d.given)
    first = d.given[0].split(":", 1)[0].strip()
    inputs = parse_text(decls + f"    return {first}\n", f"<{sp.name} example>").inputs
    statement = python_statement(sp)
    lines = (["import triton", "import triton.language as tl", ""] if d.python_setup else [])
    lines += ["import tilelink as tk", ""]
    if d.python_setup:
        lines += ["", d.python_setup.rstrip("\n"), ""]
    lines += ["", "@tk.pattern",
              f"def {sp.name}_example({', '.join(f'{k}={v}' for k, v in _sizes(sp))}):"]
    lines += [f"    {python_input(t)}" for t in inputs]
    lines += [f"    {statement}", f"    return {_result_name(statement)}"]
    return "\n".join(lines) + "\n"


def python_expr(e) -> str:
    """A size (int or Expr) in the Python DSL: the text DSL's spelling (`expr_text`), with
    `tk.W` for the world size."""
    from ..frontend.text import expr_text
    from ..ir.expr import WORLD, Sym

    return expr_text(e, lambda x: "tk.W" if isinstance(x, Sym) and x.name == WORLD else str(x))


def python_input(t) -> str:
    """A pattern input declaration in the Python DSL (`a = tk.input((M, K), "bf16",
    shard=0)`); a dtype parameter is passed by name."""
    from ..ir.tensor import DTYPES

    dims = ", ".join(python_expr(d) for d in t.shape) + ("," if len(t.shape) == 1 else "")
    dtype = f'"{t.dtype}"' if t.dtype in DTYPES else t.dtype
    where = {"local": "", "shard": f", shard={t.placement.dim}"}.get(
        t.placement.kind, f', placement="{t.placement.kind}"')
    return f"{t.name} = tk.input(({dims}), {dtype}{where})"


def python_op(op) -> str:
    """An op application in the Python DSL: `c = tk.gemm(a, b)`, attributes as keywords."""
    args = ([op.fn] if op.fn else []) + list(op.args)
    args += [f"{k}={python_expr(v)}" for k, v in op.attrs]
    return f"{op.result} = tk.{op.kind}({', '.join(args)})"


# ---- rendering ------------------------------------------------------------------------------


def _wrap(text: str, indent: str, first: str | None = None) -> list[str]:
    """`text` wrapped to WIDTH, never inside a `code span` (a command split over two lines
    cannot be copied)."""
    glued = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\0"), text)
    lines = textwrap.wrap(glued, WIDTH, initial_indent=indent if first is None else first,
                          subsequent_indent=indent, break_on_hyphens=False,
                          break_long_words=False)
    return [line.replace("\0", " ") for line in lines]


def entry_text(sp) -> str:
    """One op's entry for the terminal."""
    d = sp.details
    category = "communication" if sp.category == "comm" else "compute"
    lines = [f"{signature(sp)}    [{category}]"]
    lines += _wrap(sp.doc, "  ")
    lines.append("")
    args = arguments(sp)
    width = max(len(n) for n, _ in args + [("result", "")])
    for name, words in args + ([("result", d.result)] if d else []):
        lines += _wrap(words, " " * (width + 4), f"  {name.ljust(width)}  ")
    lines += _wrap(kernels(sp), "    ", "  kernels: ")
    if knobs(sp):
        lines += _wrap(knobs(sp), "    ", "  knobs: ")
    if d and d.notes:
        lines += _wrap(d.notes, "    ", "  note: ")
    if d is not None:
        text = example_text(sp)
        lines.append("  text DSL:   " + (d.example if text else "none (Python DSL only)"))
        lines.append("  Python DSL: " + python_statement(sp))
        whole = text or example_python(sp)
        lines.append("  in a pattern:")
        lines += [f"    {x}".rstrip() for x in whole.splitlines()]
    return "\n".join(lines) + "\n"


def render_text(chosen=None) -> str:
    """The terminal reference: with no selection, the conventions, an index and every op's
    entry; else the chosen ops' entries."""
    chosen = chosen if chosen is not None else specs()
    if len(chosen) == 1:
        return entry_text(chosen[0])
    width = max(len(signature(sp)) for sp in chosen)
    out = [("The ops of TileLink's DSL (`tilelink ops NAME` for one; `tilelink ops --markdown` "
            "is docs/ops.md)."), ""]
    for para in CONVENTIONS:
        out += _wrap(para, "") + [""]
    for sp in chosen:
        has = "kernels" if _has_kernels(sp) else "non-overlapped plan only"
        out.append(f"  {signature(sp).ljust(width)}  {sp.category:7}  {has}")
    out.append("")
    return "\n".join(out) + "\n" + "\n".join(entry_text(sp) for sp in chosen)


def _has_kernels(sp) -> bool:
    from ..schedule.lowering import LOWERINGS

    return bool(LOWERINGS.get(sp.name))


def entry_markdown(sp) -> str:
    """One op's section of docs/ops.md."""
    d = sp.details
    category = "communication" if sp.category == "comm" else "compute"
    out = [f"## {sp.name}", "", f"`{signature(sp)}`: {category}. {sp.doc}", ""]
    out += [f"- `{name}`: {words}" for name, words in arguments(sp)]
    if d is not None:
        out.append(f"- result: {d.result}")
    out += ["", f"Kernels: {kernels(sp)}." + (f" {d.notes}" if d and d.notes else ""), ""]
    if knobs(sp):
        out += [f"Knobs (`--config NAME=VALUE`): {knobs(sp)}.", ""]
    if d is None:
        return "\n".join(out)
    text = example_text(sp)
    statement = python_statement(sp)
    if text:
        out += [f"Text DSL: `{d.example}`; Python DSL: `{statement}`. In a pattern:", "",
                "```", text.rstrip("\n"), "```", ""]
    else:
        # no language tag: the ```python blocks of the docs run in CI (this one is checked by
        # tests/test_ops_reference.py instead)
        out += [f"Text DSL: none. Python DSL: `{statement}`. In a pattern:", "", "```",
                example_python(sp).rstrip("\n"), "```", ""]
    return "\n".join(out)


def render_markdown(chosen=None) -> str:
    """docs/ops.md: the conventions, an index and every op's section (or the chosen ops'
    sections alone)."""
    if chosen is not None:
        return "\n".join(entry_markdown(sp) for sp in chosen)
    chosen = specs()
    out = ["# Op reference", "",
           ("The ops of the DSL, with their arguments, shapes, placements, kernels and an "
            "example each. This page is generated from the op registry by `tilelink ops "
            "--markdown` (each op's words live next to its shape rule in `tilelink/ops/`); "
            "tests/test_ops_reference.py checks it is current and that every example parses "
            "and binds. In a terminal:"), "",
           "```bash", "tilelink ops               # every op",
           "tilelink ops all_to_all    # one op", "```", ""]
    out += [para + "\n" for para in CONVENTIONS]
    out += ["| op | kind | kernels |", "|---|---|---|"]
    for sp in chosen:
        has = "yes" if _has_kernels(sp) else "none yet (non-overlapped plan)"
        out.append(f"| `{signature(sp)}` | {sp.category} | {has} |")
    out.append("")
    return "\n".join(out) + "\n" + "\n".join(entry_markdown(sp) for sp in chosen)


# ---- the command ----------------------------------------------------------------------------


def add_parser(sub) -> None:
    """Add `tilelink ops` to the CLI's subparsers."""
    p = sub.add_parser(
        "ops", help="list the DSL's ops: arguments, shapes, placements, kernels, examples",
        description="Print the reference of the DSL's ops, generated from the op registry: "
        "each op's signature with its defaults, what its tensors must be (shape, dtype, "
        "placement), its result's shape and placement, whether it has kernels (an overlapped "
        "lowering) or runs only as the non-overlapped plan (comm=none), and an example in the "
        "text and Python DSLs. Needs no GPU.")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="the op(s) to show (default: every op)")
    p.add_argument("--markdown", action="store_true",
                   help="print markdown: the docs page docs/ops.md (with NAMEs, their "
                   "sections only)")


def run(args) -> int:
    """`tilelink ops [NAME...] [--markdown]`."""
    chosen = specs(args.names)
    if args.markdown:
        print(render_markdown(chosen if args.names else None), end="")
    else:
        print(render_text(chosen), end="")
    return 0
