"""map: a user's tile function (Python DSL) applied to row blocks of its first input."""

from __future__ import annotations

from ..ir.attrs import VALUE
from ..ir.expr import WORLD
from ..ir.ops import Inferred, OpDoc, fail, local_shape, register, result_placement
from ..ir.tensor import DTYPE_BYTES, FLOAT_DTYPES
from ..plan.regions import access, own, plain_axis, rank_axis, region_rule
from ..plan.tiling import DimRule, TileGrid

#: parameters of a tile function that TileLink binds itself (the calling convention)
CONVENTION = {
    "out": "pointer to this rank's result (contiguous, row-major; the first input's shape)",
    "row0": "the first row of the tile (rows row0 .. row0 + BM - 1 of the first input)",
    "rows": "the number of rows of the first input (mask rows >= rows)",
    "BM": "tile rows (constexpr)",
}


def keyword_params(fn: str | None, functions: dict) -> dict[str, str | None]:
    """The parameters of tile function `fn` and whether `tk.map(fn, ..., NAME=value)` may set
    them: None where it may (a constant the function takes: EPS, a size), else why not (the
    tensors it reads, the calling convention's parameters and W are bound by TileLink)."""
    entry = functions.get(fn)
    decl = entry[1] if isinstance(entry, tuple) else None
    if decl is None:
        return {}
    reads = {p for p, _ in decl.reads}
    why: dict[str, str | None] = {}
    for p in decl.params:
        if p in reads:
            why[p] = f"{p} is a tensor {fn} reads: pass the tensor positionally, in the " \
                     f"order of its reads= ({', '.join(q for q, _ in decl.reads)})"
        elif p == "BM":
            why[p] = "BM is the tile's rows, the schedule's block_m: set it with --config " \
                     "block_m=... (config={'block_m': ...} in Python)"
        elif p in CONVENTION:
            why[p] = f"TileLink binds {p}: {CONVENTION[p]}"
        elif p == WORLD:
            why[p] = "W is the world size, which TileLink binds: run with -W N (world_size=N)"
        else:
            why[p] = None
    return why


# dtypes: the result has the first input's dtype (a float: the tiles compute in floating
# point); the tile function reads the other inputs as it likes. Attributes: the tile
# function's own constants (keyword_params), each a number handed to it as a constexpr.
@register("map", "compute", [], {}, variadic=True,
          doc="Apply a user tile function (Python DSL) to row blocks of its first input.",
          dtypes={0: FLOAT_DTYPES, "*": None}, attr_kinds={"*": VALUE},
          fn_attrs=keyword_params,
          details=OpDoc(
              signature="map(fn, x, *more, **constants)",
              args={"fn": "a `@tk.tile_function`: a `@triton.jit` function computing one "
                          "block of rows, declaring which region of each tensor a tile reads "
                          "(\"rows\": its row block, \"whole\": all of it)",
                    "x": "bf16, fp16 or fp32, per rank: its row blocks are the tiles",
                    "more": "further tensors of any dtype, passed to fn's parameters in the "
                            "order its `reads` lists them",
                    "constants": "NAME=value for fn's own constexpr parameters (EPS=1e-6, a "
                                 "size); fn's parameter `W`, if it has one, receives the world "
                                 "size"},
              result="x's per-rank shape and dtype: `replicated` where every tensor is, else "
                     "per rank (`local`)",
              example=None, python="y = tk.map(scale_rows, x, w)",
              python_setup=(
                  "@tk.tile_function(reads={\"x\": \"rows\", \"w\": \"whole\"})\n"
                  "@triton.jit\n"
                  "def scale_rows(x, w, out, row0, rows, K: tl.constexpr, BM: tl.constexpr):\n"
                  "    ...  # one tile: rows row0 .. row0 + BM - 1 (examples/patterns.py: "
                  "rmsnorm_rows)\n"),
              given=("x : [M, K] bf16", "w : [K] bf16 replicated"), sizes="M = 64, K = 32",
              notes="Python DSL only: the text DSL has no tile functions. docs/composer.md "
                    "gives the tile function's calling convention."))
def shape(op, xs, attrs, world):
    if not xs:
        fail(op, "map needs at least one tensor argument")
    x = xs[0]
    return Inferred(local_shape(x), x.dtype, result_placement(xs))


@region_rule("map")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Tiles (rank, row block m) of the first input's rows. The tile function's declaration
    (Python DSL) says which region of each argument a tile reads: "rows" (its row block) or
    "whole"; arguments come in declaration order."""
    entry = bp.pattern.functions.get(op.fn)
    decl = entry[1] if isinstance(entry, tuple) else None
    kinds = [kind for _, kind in decl.reads] if decl is not None else []
    axes = (rank_axis(bp.world), plain_axis("m", out.shape[0], tiles.block_m))
    reads = []
    for i, t in enumerate(ins):
        kind = kinds[i] if i < len(kinds) else ("rows" if i == 0 else "whole")
        rules = {0: DimRule("m")} if kind == "rows" else {}
        reads.append(access(t, own(t, op), rules))
    writes = (access(out, DimRule("rank"), {0: DimRule("m")}),)
    return TileGrid(op.result, axes, tuple(reads), writes)


# ---- lowering -----------------------------------------------------------------------------

import inspect  # noqa: E402

from ..codegen.escape import comment_text  # noqa: E402
from ..codegen.module import TL_DTYPES, ident  # noqa: E402
from ..codegen.tiles import item_loop, operand_waits  # noqa: E402
from ..ir.pattern import check_name  # noqa: E402
from ..schedule.lowering import Lowering, Step, register_lowering  # noqa: E402

def tile_call(op, bp) -> tuple:
    """(jit function, its declaration, {parameter: what binds it}) of a map's tile function:
    the read tensors and `out` as pointers, `row0`, `rows`, `BM`, and every other parameter
    by name from the map's attributes (`tk.map(fn, ..., EPS=1e-5)`), else the pattern's
    sizes (W among them: the world size), as constexprs, or else its own default; a
    parameter with none of these is "unbound" (`MapTiles.reasons` names it)."""
    fn, decl = bp.pattern.functions[op.fn]
    bound = {}
    reads = [p for p, _ in decl.reads]
    for p, t in zip(reads, op.args):
        bound[p] = ("tensor", t)
    attrs = dict(op.attrs)
    for p in inspect.signature(fn.fn).parameters.values():
        if p.name in bound:
            continue
        if p.name in CONVENTION:
            bound[p.name] = ("convention", p.name)
        elif p.name in attrs:
            bound[p.name] = ("value", bp.op_attrs(op)[p.name])
        elif p.name in bp.env and p.name != "dtype" and isinstance(bp.env[p.name], int):
            bound[p.name] = ("value", bp.env[p.name])
        elif p.default is not inspect.Parameter.empty:
            continue  # its own default
        else:
            bound[p.name] = ("unbound", None)
    return fn, decl, bound


def _where(fn, op) -> tuple[str, str, str | None]:
    """(module, name, file) of the tile function, as `tile_function` finds it again; the
    name is spelled into generated source as an identifier, so it must be one."""
    from ..runtime.user_code import where

    module, name, path = where(fn)
    check_name(name, "tile function", op.loc)
    return module, name, path


class MapTiles(Lowering):
    """map's tiles: row blocks of BM rows of the first input, a persistent loop over them;
    each waits for the chunks its regions read (from the plan) and calls the user's tile
    function with the calling convention of `CONVENTION` (docs/composer.md)."""

    kind = "map"
    name = "map/triton"
    knobs = ("num_programs", "block_m", "warps")

    def reasons(self, site) -> list[str]:
        if site.op.fn not in site.bp.pattern.functions:
            return [f"the tile function {site.op.fn} is not part of the pattern (define the "
                    "pattern in the Python DSL with tk.map)"]
        fn, decl, bound = tile_call(site.op, site.bp)
        bad = []
        if "out" not in bound:
            bad.append(f"{decl.name} has no parameter `out` (the pointer to its result)")
        for p, (kind, _) in bound.items():
            if kind == "unbound":
                bad.append(f"parameter {p} of {decl.name} has no value: name it after a "
                           f"pattern size, pass it to tk.map({decl.name}, ..., {p}=...), or give "
                           "it a default")
        if site.result.dtype not in TL_DTYPES:
            bad.append(f"map tiles compute on float tensors; {site.op.result} is "
                       f"{site.result.dtype}")
        return bad

    def steps(self, site) -> list[Step]:
        fn, decl, _ = tile_call(site.op, site.bp)
        return [Step("tiles", site.op, self, f"row blocks of {site.op.args[0]} through the tile "
                     f"function {decl.name}")]

    def result_home(self, site):
        return None

    def declare(self, mb, site) -> None:
        fn, decl, _ = tile_call(site.op, site.bp)
        module, name, path = _where(fn, site.op)
        line = f"{name} = tile_function({module!r}, {name!r}, {path!r})"
        if line not in mb.module_lines:
            if not any("import tile_function" in x for x in mb.imports):
                mb.imports.append("from tilelink.runtime.user_code import tile_function"
                                  + (", within_regions" if mb.target.backend == "interp"
                                     else ""))
            mb.module_lines += ["", "# " + comment_text(f"the tile function of map({name}, ...) "
                                    f"({decl.reads}); re-wrapped for the interpreter there"), line]

    def render_step(self, step, kb) -> list[str]:
        mb = kb.mb
        site = mb.site_of(step.op.result)
        fn, decl, bound = tile_call(step.op, mb.bp)
        rows = site.tensor(step.op.args[0]).local_shape[0]
        p = ident(step.op.result)
        kb.const("BM", "BM", mb.config.block_m, "map tiles (the schedule's config)")
        kb.const("ROWS", f"{p}_ROWS", rows, f"map {step.op.result}: rows of the first input")
        waits, waited = operand_waits(kb, step, {"rank": ("me", "me + 1"), "m": ("row0", "row1")})
        args = []
        for param, (kind, value) in bound.items():
            if kind == "tensor":
                base = kb.view(value).base
                args.append(f"tld.consume_token({base}, tok)" if value in waited else base)
            elif param == "out":
                args.append(kb.view(step.op.result).base)
            elif param == "row0":
                args.append("row0")
            elif param == "rows":
                args.append("ROWS")
            elif param == "BM":
                args.append("BM=BM")
            else:
                args.append(f"{param}={value!r}")
        call = f"{decl.name}({', '.join(args)})"
        if mb.target.backend == "interp":  # loads and stores held to the declared regions
            call = f"{_within_regions(kb, step.op, decl, bound)}({', '.join(args)})"
        return item_loop(step, "(ROWS + BM - 1) // BM",
                         ["row0 = t * BM", "row1 = tl.minimum(row0 + BM, ROWS)"], waits, [call])


def _within_regions(kb, op, decl, bound) -> str:
    """The interpreter's call of a tile function: through `within_regions`, which checks
    every load and store of the tile against the regions its declaration gives it (each read
    tensor's "rows" or "whole", the result's rows): a load outside them races with the
    collective filling them, and would pass or fail the check by the ranks' timing."""
    kinds = dict(decl.reads)
    regions = []
    for param, (kind, value) in bound.items():
        if kind == "tensor":
            tensor, what = value, kinds.get(param, "rows")
        elif param == "out":
            tensor, what = op.result, decl.writes
        else:
            continue
        v = kb.view(tensor)
        nbytes = v.numel * DTYPE_BYTES[v.dtype]
        row_bytes = nbytes // v.shape[0] if v.shape and v.shape[0] else nbytes
        regions.append(f"({param!r}, {tensor!r}, {what!r}, {v.base}, {nbytes}, {row_bytes})")
    return f"within_regions({decl.name}, row0, ROWS, BM, {', '.join(regions)})"


register_lowering(MapTiles())


# ---- references -----------------------------------------------------------------------------

import torch  # noqa: E402

from ..runtime.bounds import Sums, rounding  # noqa: E402
from ..runtime.dist_reference import dist_reference  # noqa: E402
from ..runtime.reference import reference  # noqa: E402

#: rows per program of the reference run (any size a tile function takes: it masks its rows)
REFERENCE_BM = 16


def reference_source(op, bp) -> str:
    """A module with one kernel that applies a map's tile function to every row block of
    one rank's tensors, with no communication and no waits: the map's meaning, since the
    tile function is its only definition."""
    fn, decl, bound = tile_call(op, bp)
    module, name, path = _where(fn, op)
    params, args = [], []
    for param, (kind, value) in bound.items():
        if kind == "tensor" or param == "out":
            params.append(f"{param}_ptr")
            args.append(f"{param}_ptr")
        elif param == "row0":
            args.append("pid * BM")
        elif param == "rows":
            args.append("ROWS")
        elif param == "BM":
            args.append("BM=BM")
        else:
            args.append(f"{param}={value!r}")
    return "\n".join([
        f'"""The reference of map({name}, ...): the tile function on every row block."""',
        "import triton", "import triton.language as tl", "",
        "from tilelink.runtime.user_code import tile_function", "",
        f"{name} = tile_function({module!r}, {name!r}, {path!r})", "", "",
        "@triton.jit",
        f"def map_reference_kernel({', '.join(params)}, ROWS: tl.constexpr, BM: tl.constexpr):",
        "    pid = tl.program_id(0)",
        f"    {name}({', '.join(args)})", ""])


def _run_reference(op, bp, per_rank: list[list[torch.Tensor]], dtype) -> list[torch.Tensor]:
    """The map of every rank's operands: on their GPU, or on the CPU in a forked process
    running Triton's interpreter (the interpreter's patches must not leak into this one)."""
    from ..codegen.compile import load_module

    source = reference_source(op, bp)
    rows = per_rank[0][0].shape[0]
    grid = (-(-rows // REFERENCE_BM),)
    outs = [torch.empty_like(args[0], dtype=dtype) for args in per_rank]
    if per_rank[0][0].is_cuda:
        kernel = load_module(source, name="tilelink_map_reference").map_reference_kernel
        for args, out in zip(per_rank, outs):
            kernel[grid](*[a.contiguous() for a in args], out, ROWS=rows, BM=REFERENCE_BM)
        return outs
    return _in_interpreter(source, per_rank, outs, grid, rows)


def _in_interpreter(source, per_rank, outs, grid, rows):
    import multiprocessing as mp

    shared = [[a.contiguous().clone().share_memory_() for a in args] for args in per_rank]
    for o in outs:
        o.share_memory_()
    ctx = mp.get_context("fork")
    errq = ctx.Queue()
    proc = ctx.Process(target=_interpreter_child,
                       args=(source, shared, outs, grid, rows, errq), daemon=True)
    proc.start()
    proc.join(600)
    if proc.is_alive():
        proc.kill()
        raise TimeoutError("the map reference did not finish in 600 s")
    err = errq.get() if not errq.empty() else "no result"
    if err is not None:
        from ..errors import TileLinkError

        raise TileLinkError(f"the tile function failed in its reference run:\n{err}")
    return outs


def _interpreter_child(source, per_rank, outs, grid, rows, errq):
    import traceback

    try:
        torch.set_num_threads(1)
        from ..runtime.emulated import _purge_triton_modules

        _purge_triton_modules()
        from ..codegen.compile import load_module

        kernel = load_module(source, name="tilelink_map_reference").map_reference_kernel
        for args, out in zip(per_rank, outs):
            kernel[grid](*args, out, ROWS=rows, BM=REFERENCE_BM)
        errq.put(None)
    except BaseException:
        errq.put(traceback.format_exc())


@reference("map")
def ref(op, ctx, args):
    per_rank = [list(xs) for xs in zip(*args)]
    return _run_reference(op, ctx.bp, per_rank, ctx.dtype)


@rounding("map")
def one_rounding(bp, op, plan) -> Sums:
    """The tile function computes in registers and stores its result once; the reference
    runs the same function (the interpreter), so only that rounding may differ."""
    return Sums()


@dist_reference("map")
def dist_ref(op, ctx, args):
    return _run_reference(op, ctx.bp, [list(args)], ctx.dtype)[0]
