"""The GEMM on the vendor library (`gemm=library`): torch.mm (cuBLAS / hipBLASLt) in place of
TileLink's kernel, placed one of two ways:

- *gathered*: its rows come from a copy-engine all_gather. One library call per source
  rank's rows, around one-program wait and done kernels (the copy engine delivers a rank's
  rows while the previous rank's GEMM runs).
- *whole*: its operands are ready when the call starts (pattern inputs, or results of
  earlier kernels). One library call for the whole GEMM; a collective that takes the GEMM's
  tiles in their epilogue (a reduction's push of partials) gets them from a pass kernel that
  walks the result's tiles, loading each and running the same epilogue hooks as TileLink's
  GEMM kernel. Where the one hook is a plain store of the tile (a reduction over one rank)
  the library writes straight into that tensor and no kernel runs."""

from __future__ import annotations

from ...codegen.module import TL_DTYPES, ident, indent
from ...codegen.tiles import find_dep
from ...ir import spec
from ...schedule.lowering import Lowering, Step, register_lowering
from .common import TILE_KNOBS, tile_out

class GemmLibrary(Lowering):
    """The vendor library's GEMM (`gemm=library`: torch.mm, i.e. cuBLAS / hipBLASLt); see the
    module docstring for its two placements. Gathered: one library call per source rank's
    rows, this rank's own first (read in place), then each peer's as its copy engine
    delivers them; one-program kernels do what the GEMM kernel's tiles would: wait (bounded)
    for a source rank's chunks before its GEMM; at the end release the buffer, open the copy
    engine's gates for the next call and end the epoch. Pays where the GEMM is one wave or
    less and the library's kernel beats TileLink's (small M); the tile knobs do not apply
    (block_m x block_n remain the tiles the plan counts for a whole GEMM's epilogue pass)."""

    vendor_library = True

    kind = "gemm"
    variant = "library"
    variant_knob = "gemm"
    name = "gemm/library"
    knobs = ("gemm", "comm_block_m", "capturable")
    foreign_knobs = TILE_KNOBS[1:]  # set on top of a library default: TileLink's kernel

    def _gather(self, site):
        a = site.op.args[0]
        return next((o for o in site.bp.ops if o.result == a and o.kind == "all_gather"), None)

    @staticmethod
    def _comm_operands(site) -> list:
        """The collectives of the pattern producing an operand of the GEMM."""
        return [o for o in site.bp.ops if o.result in site.op.args
                and spec(o.kind).category == "comm"]

    def whole(self, site) -> bool:
        """Whether the GEMM is one library call: no collective delivers its operands."""
        return not self._comm_operands(site)

    @staticmethod
    def hooks(site) -> list:
        """(lowering, site) of the consumers taking the GEMM's tiles in their epilogue."""
        out = []
        for c in site.consumers:
            cs = site.site_of(c.result)
            if cs.lowering is not None and cs.lowering.takes_epilogue:
                out.append((cs.lowering, cs))
        return out

    def store_into(self, site) -> str | None:
        """The tensor a whole library GEMM's call writes, with no kernel after it: the GEMM's
        own result where no consumer takes its tiles in an epilogue (a plain GEMM, or one
        read by a later kernel such as a `map`); or the one consumer's result where that
        consumer would store the tiles there unchanged (a reduction over one rank), unless
        the GEMM's result is itself returned or read by another op. None: a pass kernel
        hands the tiles to the consumers' epilogues."""
        hooks = self.hooks(site)
        if not hooks:
            return site.op.result
        if len(hooks) != 1 or len(site.consumers) != 1 or site.is_output:
            return None  # (the result must be written too, or several hooks take the tiles)
        lw, hs = hooks[0]
        return lw.plain_store(hs)

    def reasons(self, site) -> list[str]:
        if self.whole(site):
            return self._whole_reasons(site)
        bad = []
        ag = self._gather(site)
        computes = [o for o in site.bp.ops if spec(o.kind).category == "compute"]
        if (ag is None or site.config.comm != "copy_engine"
                or site.bp.op_attrs(ag)["dim"] % 2 != 0 or site.op.args[1] == site.op.args[0]):
            bad.append("gemm=library applies to a GEMM whose operands no collective delivers "
                       "(one library call), or whose rows (its first operand) the copy engine "
                       "gathers along dim 0 (all_gather with comm=copy_engine: the library "
                       "GEMM runs per source rank's rows once they arrived)")
        elif any(o.args and o.args[0] == ag.result and o is not site.op for o in site.bp.ops):
            bad.append("gemm=library needs the gathered rows to feed this GEMM only")
        if len(computes) > 1:
            bad.append("gemm=library on gathered rows lays out the whole call itself: the GEMM "
                       "must be the pattern's only compute op")
        cfg = site.config
        if cfg.fuse_reduce or cfg.reduce_after or cfg.flatten:
            bad.append("gemm=library takes no kernel knobs (flatten, reduce_after, "
                       "fuse_reduce): the GEMM is the library's")
        return bad

    def _whole_reasons(self, site) -> list[str]:
        bad = []
        dtype = site.result.dtype
        if dtype not in TL_DTYPES:
            bad.append(f"its operands are {dtype}: the library GEMM multiplies bf16, fp16 or "
                       "fp32 (declare the operands with a float dtype)")
        # (flatten, a K-loop knob a collective's defaults may propose, does not apply: the
        # GEMM is the library's; a user setting it asks for TileLink's kernel)
        if site.config.capturable:
            bad.append("capturable=1 is the copy-engine protocol of a library GEMM on "
                       "gathered rows; a whole library GEMM has no protocol of its own (its "
                       "epilogue pass reads the epoch from device memory): use capturable=0")
        if any(lw.fuses_own_rows(hs) for lw, hs in self.hooks(site)):
            bad.append("gemm=library cannot fuse a reduction into its tiles (fuse_reduce=1 "
                       "adds the peers' partials in TileLink's GEMM epilogue): use "
                       "fuse_reduce=0")
        return bad

    def steps(self, site) -> list[Step]:
        if not self.whole(site):
            return [Step("tiles", site.op, self, "the library GEMM (torch.mm) per source "
                         "rank's rows, each after a one-program kernel waiting for them")]
        into = self.store_into(site)
        if into is not None:
            return [Step("tiles", site.op, self, f"the library GEMM (torch.mm) storing into "
                         f"{into}: no kernel", host=True)]
        what = ", ".join(f"{hs.op.kind} {hs.op.result}" for _, hs in self.hooks(site))
        return [Step("tiles", site.op, self, "the library GEMM (torch.mm) before the kernel; "
                     f"its tiles, loaded, through the epilogue of {what}")]

    def result_home(self, site):
        return None

    def reads_in_place(self, op, tensor, rows, config) -> bool:
        return op.args[0] == tensor  # the first library call multiplies the input's rows

    def declare(self, mb, site) -> None:
        if self.whole(site):
            self._declare_whole(mb, site)
        else:
            self._declare_gathered(mb, site)

    def _declare_whole(self, mb, site) -> None:
        mb.imports.append("import torch")
        c = site.op.result
        into = self.store_into(site)
        if into is not None:
            if into not in mb.homes:  # (a result nothing reads still gets its memory)
                mb.heap_tensor(into, site.result.local_shape, site.result.dtype, home_of=True)
            why = ("nothing takes its tiles in an epilogue" if into == c else
                   "its consumer would store the tiles there unchanged")
            mb.notes.append(f"gemm=library: {c} = {site.op.args[0]} @ {site.op.args[1]} is one "
                            f"vendor-library call (torch.mm: cuBLAS / hipBLASLt) writing "
                            f"straight into {into} ({why}): no kernel")
            return
        if c not in mb.homes:  # every consumer takes tiles: the pass reads them from here
            t = site.result
            mb.heap_tensor(c, t.local_shape, t.dtype, home_of=True)
        for name, value in (("BM", mb.config.block_m), ("BN", mb.config.block_n),
                            ("OWN_FIRST", 0)):
            # (OWN_FIRST: the pass hands the tiles on in their natural order, and a copy
            # engine shipping them goes owner by owner from rank 0)
            mb.const(name, value, "tiles of the epilogue pass (the plan's GEMM tiles), in "
                     "natural order")
        mb.notes.append(f"gemm=library: {c} = {site.op.args[0]} @ {site.op.args[1]} is one "
                        "vendor-library call (torch.mm: cuBLAS / hipBLASLt) on the stream "
                        "right before the kernel; the kernel walks its BM x BN tiles, loads "
                        "each and runs the epilogue TileLink's GEMM kernel would (the tile "
                        "knobs of the K loop do not apply)")

    def _declare_gathered(self, mb, site) -> None:
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
        """Gathered: the wait kernel, the done kernel, and the launch lines between the
        library calls. Whole: the library call alone where it stores straight into its
        consumer's result; else None (the epilogue pass is a role: `render_step`)."""
        site = kb.mb.site_of(step.op.result)
        if self.whole(site):
            into = self.store_into(site)
            if into is None:
                return None
            kb.sig = {}
            return [], self._call(kb.mb, site, into, "stored as " + into)
        return self._render_gathered(step, kb)

    @staticmethod
    def _call(mb, site, into: str, what: str) -> list[str]:
        """launch() lines: the library's GEMM of `site` writing `into`."""
        a, b = site.op.args
        return [f"    # {site.op.result} = {a} @ {b}: the library's GEMM; {what}",
                f"    torch.mm({mb.host_ref(a)}, {mb.host_ref(b)}, out={mb.host_ref(into)})"]

    def render_step(self, step, kb) -> list[str]:
        """The epilogue pass of a whole library GEMM: the library call before the kernel
        (host lines), then per BM x BN tile of its result: load it, run the consumers'
        epilogue hooks (a reduction's push of partials, ...), as TileLink's GEMM kernel
        does after its K loop."""
        mb, op = kb.mb, step.op
        site = mb.site_of(op.result)
        a, b = op.args
        c = op.result
        into = self.store_into(site)
        if into is not None:  # (a kernel of other roles: the call goes before it)
            kb.host_before += self._call(mb, site, into, "stored as " + into)
            return [f"pass  # {c}: the library call before this kernel (no programs)"]
        kb.host_before += self._call(mb, site, c, "the kernel below takes its tiles")
        cv = kb.view(c)
        m, n = cv.shape
        p = ident(c)
        kb.const("M", f"{p}_M", m, f"gemm {c} = {a} @ {b} (the library's): [M, N] on this rank")
        kb.const("N", f"{p}_N", n)
        kb.const("BM")
        kb.const("BN")
        hooks = mb.hooks_of(c)
        tile = tile_out()
        lines = []
        for lw, hs in hooks:  # e.g. a reduction's wait for its buffers' release
            lines += lw.prologue(kb, hs)
        first = f"pid - {step.first}" if step.first else "pid"
        lines += ["num_m = (M + BM - 1) // BM", "num_n = (N + BN - 1) // BN",
                  f"for t in range({first}, num_m * num_n, {step.count}):",
                  "    pid_m = t // num_n", "    pid_n = t % num_n", "    row_lo = pid_m * BM",
                  "    row_hi = tl.minimum(row_lo + BM, M)", "    col_lo = pid_n * BN",
                  "    col_hi = tl.minimum(col_lo + BN, N)",
                  "    offs_m = row_lo + tl.arange(0, BM)", "    offs_n = col_lo + tl.arange(0, BN)",
                  "    # the tile as the library stored it (the kernel starts after the call: "
                  "stream order)",
                  f"    vals = tl.load({cv.base} + offs_m[:, None] * N + offs_n[None, :],",
                  "                   mask=(offs_m[:, None] < M) & (offs_n[None, :] < N), "
                  "other=0.0)"]
        for lw, hs in hooks:
            lines += indent(lw.epilogue(kb, hs, tile))
        return lines

    def _render_gathered(self, step, kb):
        from ...codegen import protocol
        from ...codegen.views import wrap_items

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
        lines = ["@triton.jit", f"def {wait_k}(", *wrap_items([args, "src"] + consts, "    "), "):",
                 f'    """Before the GEMM of rank `src`\'s rows of {a_full}: wait until its '
                 'copy engine', "    delivered every chunk of them. The library GEMM after it "
                 'on the stream reads them."""']
        lines += indent(protocol.epoch_begin() + wait_lines)
        lines += ["", "", "@triton.jit", f"def {done_k}(",
                  *wrap_items([args] + consts, "    "), "):",
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


LIBRARY = register_lowering(GemmLibrary())
