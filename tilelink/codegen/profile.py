"""Profiling instrumentation of generated kernels (config `profile=1`; docs/profile.md).

With `profile=0` nothing here runs and the kernels are what they always were. With
`profile=1` every role's code, as its lowering rendered it, is wrapped so the kernel appends
one row per event to the profile buffer (`tl_profile`, int64, in the symmetric heap; row
layout `tilelink.lang.core.PROFILE_LAYOUT`, written by `tld.profile_event`):

- a *role* event: the role's whole body in one program (kind 0);
- an *item* event: one iteration of the role's loop over its items (tiles, chunks): a loop at
  the role's top level that strides by the role's program count, so that each item runs on
  one program (`tiles.item_loop` renders them so; kind 1, the loop variable's value as the
  item, the loop's ordinal among the role's item loops as the site field);
- a *wait* event: one `tld.wait` / `tld.wait_flat` statement (kind 2, its wait site, the
  enclosing item or -1).

All three are the codegen's own concepts (roles, their item loops, wait statements): the
instrumentation reads the rendered lines, never an op kind. Times come from `tld.clock()`
(nanoseconds: the GPU's global timer, or the host's clock in the interpreter).
"""

from __future__ import annotations

import ast
import re

from ..errors import NotSupportedError
from ..lang.core import PROFILE_FIELDS, PROFILE_HEADER

#: the profile buffer's name in the symmetric heap (and `<name>_ptr`, its kernel argument)
BUFFER = "tl_profile"
#: event kinds of a row's `kind` field
KIND_ROLE, KIND_ITEM, KIND_WAIT = 0, 1, 2
#: calls the emulated world's buffer holds (its kernels never reset the row counter; a GPU
#: run's host reads and clears it after every call)
CALLS_HELD = 8

_LOOP = re.compile(r"^for (\w+) in (?:tl\.)?range\(")
_WAIT = re.compile(r"^(?:\w+ = )?tld\.(wait|wait_flat)\(")
#: the wait site's position among each wait primitive's arguments
_SITE_ARG = {"wait": 5, "wait_flat": 6}


def rows_for(mb) -> int:
    """Rows of the module's profile buffer: an upper estimate of one call's events (every
    program's role, every tile of the plan's grids, a wait per rank and an item per tile),
    times CALLS_HELD, rounded up to a power of two."""
    tiles = 0
    for grid in mb.plan.grids.values():
        n = 1
        for d in grid.shape:
            n *= d
        tiles += n
    programs = sum(st.count for roles in mb.comp.kernels for st in roles)
    per_call = programs * 4 + tiles * (2 + 2 * mb.bp.world) + 64
    rows = 1
    while rows < per_call * CALLS_HELD:
        rows *= 2
    return rows


def declare(mb) -> None:
    """Declare the profile buffer and its row count (module constant PROFILE_ROWS)."""
    rows = rows_for(mb)
    mb.buffer(BUFFER, (PROFILE_HEADER + rows * PROFILE_FIELDS,), "int64")
    mb.const("PROFILE_ROWS", rows, "profile=1: rows of the profile buffer (tl_profile)")


def role_table(mb) -> list[str]:
    """Module lines describing every role the rows name (PROFILE_ROLES: role index ->
    kernel, name, step kind, op, first program, programs, instrumented, and whether it
    computes: a compute op's tiles or receive step, not a collective's own receive step,
    which writes the rows it landed)."""
    from ..ir import spec

    lines = ["# profile=1: the roles that profile rows name (their `role` field indexes this)",
             "PROFILE_ROLES = ["]
    for i, st in enumerate(_steps(mb)):
        kb = mb.kernels[st.kernel]
        computes = st.kind in ("tiles", "receive") and spec(st.op.kind).category != "comm"
        lines.append(f"    dict(kernel={kb.name!r}, name={st.name!r}, kind={st.kind!r}, "
                     f"op={st.op.result!r}, first={st.first}, count={st.count}, "
                     f"instrumented={bool(kb.profiled and st.count)}, computes={computes}),")
    return lines + ["]"]


def role_index(mb, step) -> int:
    """The index of `step` in PROFILE_ROLES."""
    return next(i for i, st in enumerate(_steps(mb)) if st is step)


def _steps(mb):
    return [st for roles in mb.comp.kernels for st in roles]


def refuse_gluon(kb) -> None:
    """Gluon kernels (warp-specialised GEMM) are not instrumented: say so instead of
    profiling part of the module, naming the variant knob value of the lowering that made
    the kernel and its default (a Triton kernel)."""
    from ..schedule.config import default_value

    lw = next(r.lowering for r in kb.roles if r.lowering.variant_knob)
    knob = lw.variant_knob
    default = f"{knob}={default_value(knob)}"
    raise NotSupportedError(
        f"profile=1 cannot instrument {kb.name}: it is a Gluon kernel ({knob}={lw.variant}), "
        "whose warp-specialised partitions have no single program-wide clock",
        hint=f"profile with {default} (--config {default})")


def instrument_role(code: list[str], role: int, epoch: str, programs: int) -> list[str]:
    """`code` (a role's lines, unindented) with its profile events: the role's span, each
    iteration of its item loops (top-level loops striding by `programs`, the role's program
    count), each wait statement."""
    out = ["prof_role_t0 = tld.clock()"]
    loop_var, loop_n, loops = None, -1, 0
    i = 0
    while i < len(code):
        line = code[i]
        top = bool(line) and not line[0].isspace()
        if top and loop_var is not None and not line.startswith("#"):
            out.append("    " + _event(role, "pid", loop_var, KIND_ITEM, str(loop_n),
                                       "prof_item_t0", epoch))
            loop_var = None
        m = _LOOP.match(line) if top else None
        if m and _strides_by(line, programs):
            out += [line, "    prof_item_t0 = tld.clock()"]
            loop_var, loop_n = m.group(1), loops
            loops += 1
            i += 1
            continue
        stripped = line.lstrip()
        w = _WAIT.match(stripped)
        if w:
            stmt, used = _statement(code, i)
            pad = line[:len(line) - len(stripped)]
            site = _site(stmt, w.group(1))
            item = loop_var if loop_var is not None and pad else "-1"
            out.append(pad + "prof_wait_t0 = tld.clock()")
            out += code[i:i + used]
            out.append(pad + _event(role, "pid", item, KIND_WAIT, site, "prof_wait_t0", epoch))
            i += used
            continue
        out.append(line)
        i += 1
    if loop_var is not None:
        out.append("    " + _event(role, "pid", loop_var, KIND_ITEM, str(loop_n),
                                   "prof_item_t0", epoch))
    out.append(_event(role, "pid", "-1", KIND_ROLE, "-1", "prof_role_t0", epoch))
    return out


def _strides_by(line: str, programs: int) -> bool:
    """Whether the `for` statement `line` steps by the role's program count (its persistent
    loop over items), not a loop every program runs whole (over ranks, say)."""
    node = ast.parse(line + "\n    pass").body[0]
    args = node.iter.args if isinstance(node.iter, ast.Call) else []
    return len(args) == 3 and ast.unparse(args[2]) in (str(programs), "NUM_PROGRAMS")


def _event(role: int, pid: str, item: str, kind: int, site: str, t0: str, epoch: str) -> str:
    return (f"tld.profile_event(tl_profile_ptr, PROFILE_ROWS, {epoch}, {role}, {pid}, {item}, "
            f"{kind}, {site}, {t0}, tld.clock())")


def _statement(code: list[str], i: int) -> tuple[str, int]:
    """The statement starting at line `i` (it may continue on the next lines) and how many
    lines it takes."""
    for n in range(1, 8):
        text = "\n".join(x.strip() for x in code[i:i + n])
        try:
            ast.parse(text)
            return text, n
        except SyntaxError:
            continue
    raise NotSupportedError(f"profile=1: cannot read the wait statement {code[i].strip()!r}")


def _site(stmt: str, prim: str) -> str:
    """Source of the wait site argument of the `tld.<prim>(...)` call in `stmt`."""
    node = ast.parse(stmt).body[0]
    call = node.value if isinstance(node, (ast.Assign, ast.Expr)) else None
    if not isinstance(call, ast.Call) or len(call.args) <= _SITE_ARG[prim]:
        raise NotSupportedError(f"profile=1: cannot find the wait site in {stmt!r}")
    return ast.unparse(call.args[_SITE_ARG[prim]])
