"""The GEMM on the vendor library (`gemm=library`): torch.mm per source rank's rows of a
gathered operand, around one-program wait and done kernels."""

from __future__ import annotations

from ...codegen.module import indent
from ...codegen.tiles import find_dep
from ...ir import spec
from ...schedule.lowering import Lowering, Step, register_lowering
from .tl import TILE_KNOBS

class GemmLibrary(Lowering):
    """The vendor library's GEMM (`gemm=library`: torch.mm, i.e. cuBLAS / hipBLASLt) for a
    GEMM whose rows are gathered by the copy engine: one library call per source rank's
    rows, this rank's own first (read in place), then each peer's as its copy engine
    delivers them. One-program kernels do what the GEMM kernel's tiles would: wait (bounded)
    for a source rank's chunks before its GEMM; at the end release the buffer, open the copy
    engine's gates for the next call and end the epoch. Pays where the GEMM is one wave or
    less and the library's kernel beats TileLink's (small M); the tile knobs do not apply."""

    kind = "gemm"
    variant = "library"
    variant_knob = "gemm"
    name = "gemm/library"
    knobs = ("gemm", "comm_block_m", "capturable")
    foreign_knobs = TILE_KNOBS[1:]  # set on top of a library default: TileLink's kernel

    def _gather(self, site):
        a = site.op.args[0]
        return next((o for o in site.bp.ops if o.result == a and o.kind == "all_gather"), None)

    def reasons(self, site) -> list[str]:
        bad = []
        ag = self._gather(site)
        computes = [o for o in site.bp.ops if spec(o.kind).category == "compute"]
        if (ag is None or site.config.comm != "copy_engine"
                or site.bp.op_attrs(ag)["dim"] % 2 != 0 or site.op.args[1] == site.op.args[0]):
            bad.append("gemm=library applies to a GEMM whose rows (its first operand) the copy "
                       "engine gathers along dim 0 (all_gather with comm=copy_engine): the "
                       "library GEMM runs per source rank's rows once they arrived")
        elif any(o.args and o.args[0] == ag.result and o is not site.op for o in site.bp.ops):
            bad.append("gemm=library needs the gathered rows to feed this GEMM only")
        if len(computes) > 1:
            bad.append("gemm=library lays out the whole call itself: the GEMM must be the "
                       "pattern's only compute op")
        cfg = site.config
        if cfg.fuse_reduce or cfg.reduce_after or cfg.flatten:
            bad.append("gemm=library takes no kernel knobs (flatten, reduce_after, "
                       "fuse_reduce): the GEMM is the library's")
        return bad

    def steps(self, site) -> list[Step]:
        return [Step("tiles", site.op, self, "the library GEMM (torch.mm) per source rank's "
                     "rows, each after a one-program kernel waiting for them")]

    def result_home(self, site):
        return None

    def reads_in_place(self, op, tensor, rows, config) -> bool:
        return op.args[0] == tensor  # the first library call multiplies the input's rows

    def declare(self, mb, site) -> None:
        mb.gates_at_end = True
        mb.imports.append("import torch")
        mb.flags["OWN_DIRECT"] = 1
        mb.notes.append("gemm=library: the GEMM is the vendor library's (torch.mm: cuBLAS / "
                        "hipBLASLt), one call per source rank's rows: this rank's own rows first "
                        "(read in place), then each peer's as its copy engine delivers them. "
                        "One-program kernels do what the GEMM kernel's tiles would: wait "
                        "(bounded) for a source rank's chunks before its GEMM; at the end "
                        "release the buffer, open the copy engine's gates for the next call and "
                        "end the epoch. The tile knobs do not apply")

    def render_kernel(self, step, kb):
        """The wait kernel, the done kernel, and the launch lines between the library calls."""
        from ...codegen import protocol
        from ...codegen.module import _wrap

        mb = kb.mb
        site = mb.site_of(step.op.result)
        ag = self._gather(site)
        a_full = ag.result
        flags = bool(mb.config.capturable)
        dep = find_dep(mb.plan, step.op.result, a_full)
        sig = f"sig_{a_full}"
        w = mb.bp.world
        m = site.tensor(a_full).local_shape[0]
        n = site.result.local_shape[1]
        seg = m // w
        sid = mb.site_for(("library", step.op.result),
                          f"the library GEMM of a source rank's rows of {step.op.result} waits "
                          f"for a chunk of {a_full} (all_gather at {_loc(ag.loc)}, used at "
                          f"{_loc(step.op.loc)})", dep, (0, step.name))
        from ...codegen.waits import render_waits

        value = "1" if flags else "epoch"
        wait_lines = render_waits(dep, {"rank": ("me", "me + 1"),
                                        "m": (f"src * {seg}", f"(src + 1) * {seg}"),
                                        "n": ("0", str(n))},
                                  sig="sig_ptr", site=sid, indent=0, value=value).splitlines()
        mb.const("LIB_PROGRAMS", 1, "gemm=library: one-program sync kernels")
        sigs = {"sig_ptr": "*i32", "ctl_ptr": "*i32", "heap_bases": "*i64", "abort_ptr": "*i32",
                "diag_ptr": "*i32", "me": "i32", "spin_limit": "i32", "src": "i32"}
        kb.sig = dict(sigs)
        name = mb.bp.name
        wait_k, done_k = f"{name}_wait_kernel", f"{name}_done_kernel"
        kb.name = wait_k
        consts = ["WORLD: tl.constexpr", "NUM_PROGRAMS: tl.constexpr"]
        if flags:
            gates = [
                "# The next call's copy engine may write into rank d's buffer once d released it:",
                "# with one buffer (capturable=1) that is this call, so this waits for d to",
                "# finish it. The gate is a flag (1 = open) the copy engine closes after",
                "# passing it; the first call's gates are open from the start (init_signals).",
                "for d in range(WORLD):",
                f"    tld.wait(ctl_ptr + 4 + d, epoch, spin_limit, abort_ptr, diag_ptr, "
                f"{protocol.SITE_RELEASE}, 4 + d, me)",
                "    tld.notify(ctl_ptr + 4 + WORLD + d, 1)"]
        else:
            gates = [
                "# The next call's copy engine may write into rank d's buffer once d released it",
                "# (call epoch - 1, the buffer's last user). The bounded wait is here, at the end",
                "# of this call; the copy engine only waits on the local gate set below. The",
                "# first call's gates are open from the start (init_signals).",
                "for d in range(WORLD):",
                f"    tld.wait(ctl_ptr + 4 + d, epoch - 1, spin_limit, abort_ptr, diag_ptr, "
                f"{protocol.SITE_RELEASE}, 4 + d, me)",
                "    tld.notify(ctl_ptr + 4 + WORLD + d, epoch + 1)"]
        clear = [("sig_ptr", w * mb.plan.grids[a_full].axes[0].tiling.per_segment)] \
            if flags else []
        args = "sig_ptr, ctl_ptr, heap_bases, abort_ptr, diag_ptr, me, spin_limit"
        lines = ["@triton.jit", f"def {wait_k}(", *_wrap([args, "src"] + consts, "    "), "):",
                 f'    """Before the GEMM of rank `src`\'s rows of {a_full}: wait until its '
                 'copy engine', "    delivered every chunk of them. The library GEMM after it "
                 'on the stream reads them."""']
        lines += indent(protocol.epoch_begin() + wait_lines)
        lines += ["", "", "@triton.jit", f"def {done_k}(", *_wrap([args] + consts, "    "), "):",
                  '    """Last of a call, after every GEMM: release this call\'s buffer to the '
                  "ranks that write", "    it, open the copy engine's gates for the next call, "
                  'count the call as completed."""', "    pid = tl.program_id(0)"]
        lines += indent(protocol.epoch_begin() + ["if pid >= 0:"]
                        + indent(protocol.release("NUM_PROGRAMS", clear)) + gates
                        + protocol.epoch_end())
        kb.consts = {"WORLD": "WORLD", "NUM_PROGRAMS": "LIB_PROGRAMS"}
        kb.warps = 1
        kb.also = [done_k]
        b = site.op.args[1]
        src_input = ag.args[0]
        launch = [
            f"    a, b = inputs[{src_input!r}], inputs[{b!r}]",
            f"    out = outputs[{step.op.result!r}]",
            "    me = rt.rank",
            f'    args = (sym[{sig!r}], sym["ctl"], rt.heap_bases, rt.abort, rt.diag, me, '
            "rt.spin_limit)",
            "    consts = dict(WORLD=WORLD, NUM_PROGRAMS=LIB_PROGRAMS, num_warps=1, "
            "**tld.launch_options())",
            "    # the peers' GEMMs wait on these copies: enqueue them now, not after this "
            "launch returns",
            "    rt.copy_engine(copy_engine_ops(me, epoch, {**inputs, **sym}), start_now=True)",
            f"    torch.mm(a, b, out=out[me * {seg}:(me + 1) * {seg}])",
            f"    gathered = sym[{a_full!r}]" + ("" if flags else "[epoch & 1]"),
            "    for step in range(1, WORLD):",
            "        # rank me + step's copy engine writes here at its step `step`: arrival order",
            "        src = (me + step) % WORLD",
            f"        rt.launch_kernel({wait_k}, (LIB_PROGRAMS,), args + (src,), consts)",
            f"        rows = slice(src * {seg}, (src + 1) * {seg})",
            "        torch.mm(gathered[rows], b, out=out[rows])",
            f"    rt.launch_kernel({done_k}, (LIB_PROGRAMS,), args, consts)"]
        return lines, launch


def _loc(loc) -> str:
    return f"{loc.file}:{loc.line}" if loc else "?"


register_lowering(GemmLibrary())
