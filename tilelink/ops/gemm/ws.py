"""The GEMM as a warp-specialised Gluon kernel (`gemm=ws`, Hopper): the same steps as the `tl`
placement, placed into partitions. Per program (one per SM):

  partitions 0 and 1 (4 warps each): consumers, one per BM/2-row half of the output tile:
    wait for a stage, issue the wgmma, keep one in flight, release the stage before it; then
    the epilogue of the half (a TMA store of the result, or the hooks of the collective that
    takes the tiles: stage and count for the copy engine, or the fused sum of the peers'
    partials);
  partition 2 (1 warp): the loader. It walks the same tiles, runs the waits a tile needs on
    gathered operands (rendered by the gathering collective, as for the tl kernel), then runs
    up to STAGES k-steps ahead with TMA loads, across tile boundaries too.

The epoch, the copy engine's gates and the release of the buffers run in the whole program
before and after the partitions, as in the tl kernel. The mbarrier waits have no bound: they
wait only on this CTA's own partitions and TMA, which always progress; the waits on other
agents are tld.wait's, bounded and reported like the tl kernel's.
"""

from __future__ import annotations

from dataclasses import replace

from ...codegen.module import indent
from ...codegen.tiles import find_dep
from ...schedule.lowering import register_lowering
from .tl import TILE_KNOBS, GemmTriton, tma_ok

GL_DTYPES = {"bf16": "gl.bfloat16", "fp16": "gl.float16"}

_IMPORTS = [
    "from triton.experimental import gluon",
    "from triton.experimental.gluon import language as gl",
    "from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, "
    "mbarrier, tma,",
    "                                                              warpgroup_mma, "
    "warpgroup_mma_wait)",
]

_HELPERS = '''
@gluon.jit
def _tile(t, num_m, num_n, rot, GROUP_M: gl.constexpr):
    """Tile t's (pid_m, pid_n) in a Gluon kernel: the tl kernels' order (grouped for L2
    reuse, rotated by `rot` row blocks)."""
    in_group = GROUP_M * num_n
    first_m = (t // in_group) * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (t % in_group) % group_rows
    pid_n = (t % in_group) // group_rows
    return (pid_m + rot) % num_m, pid_n


@gluon.jit
def _mma_tile(a_bufs, b_bufs, ready, empty, it, HALF: gl.constexpr, K: gl.constexpr,
              HM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """A consumer's k-steps of one tile (its HM-row half); returns (accumulator, counter)."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, 16])
    acc = gl.zeros((HM, BN), gl.float32, acc_layout)
    for k in range(0, K, BK):
        s = it % STAGES
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s).slice(HALF * HM, HM), b_bufs.index(s), acc,
                            is_async=True)
        # one wgmma in flight: the one before it has finished reading its stage
        acc = warpgroup_mma_wait(1, deps=(acc, ))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k > 0)
        it += 1
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
    return acc, it


@gluon.jit
def _load_tile(a_desc, b_desc, a_bufs, b_bufs, ready, empty, it, src_row, col, own_desc,
               own, K: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """The loader's k-steps of one tile (rows from `own_desc` where `own`); returns the
    stage counter after them."""
    for k in range(0, K, BK):
        s = it % STAGES
        # a fresh barrier counts as having completed "phase 1": the first round passes
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        bar = ready.index(s)
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(own_desc, [src_row, k], bar, a_bufs.index(s), pred=own)
        tma.async_copy_global_to_shared(a_desc, [src_row, k], bar, a_bufs.index(s),
                                        pred=not own)
        tma.async_copy_global_to_shared(b_desc, [k, col], bar, b_bufs.index(s))
        it += 1
    return it
'''


class GemmWarpSpecialized(GemmTriton):
    """TileLink's GEMM as a warp-specialised Gluon kernel (`gemm=ws`; module docstring)."""

    variant = "ws"
    name = "gemm/ws"
    knobs = tuple(k for k in TILE_KNOBS if k not in ("warps", "flatten")) + ("gemm",)

    def smem_needed(self, cfg, elem: int) -> int:
        """The stages' A and B buffers, the two epilogue halves (c_lo, c_hi: one C tile) and
        a kilobyte for the mbarriers and the compiler's scratch."""
        return super().smem_needed(cfg, elem) + cfg.block_m * cfg.block_n * elem + 1024

    def device_refusal(self, site, capability) -> tuple[str, str] | None:
        """Any GPU but sm_9x: the target cuda:90 stands for every sm_90+ GPU, and wgmma and
        setmaxnreg are sm_90's."""
        major, minor = capability()
        if major == 9:
            return None
        return (f"gemm=ws is Hopper's warp-specialised kernel (wgmma); this GPU is "
                f"sm_{major}{minor}", "use gemm=triton (the default)")

    def reasons(self, site) -> list[str]:
        bad = super().reasons(site)
        cfg, t = site.config, site.target
        if t.name != "cuda:90":
            bad.append("gemm=ws needs Hopper's warp specialisation through Gluon: target "
                       "cuda:90 (torch symmetric memory backend); not the emulated world, "
                       "cuda:80, hip or the NVSHMEM flavour")
        if cfg.comm != "copy_engine" or not self._neighbours_ok(site):
            bad.append("gemm=ws needs comm=copy_engine, its rows gathered by the copy engine "
                       "or read from the inputs, and its tiles stored or taken by a "
                       "copy-engine reduction (reduce_scatter, all_reduce) with reduce_after=1 "
                       "(the copy engine moves the data; the kernel's warps wait for it or "
                       "count for it)")
        if cfg.block_m != 128 or cfg.block_n not in (128, 256) or cfg.block_k != 64:
            bad.append(f"gemm=ws takes block_m=128 (two 64-row consumer halves), block_n=128 "
                       f"or 256 and block_k=64, not {cfg.block_m}x{cfg.block_n}x{cfg.block_k}")
        if cfg.stages < 2:
            bad.append("gemm=ws needs stages >= 2 (the loader runs ahead of the consumers)")
        if cfg.flatten:
            bad.append("gemm=ws takes no flatten (its loader already runs across tiles)")
        dtype = site.result.dtype
        k = site.tensor(site.op.args[0]).local_shape[1]
        n = site.result.local_shape[1]
        if dtype not in GL_DTYPES or not tma_ok(t, dtype, [k, n]):
            bad.append(f"gemm=ws needs bf16 or fp16 operands loadable by TMA (rows a multiple of "
                       f"16 bytes); this GEMM has {dtype} with rows of {k} and {n} elements "
                       "(use gemm=triton)")
        return bad

    def _neighbours_ok(self, site) -> bool:
        """The gathered rows come from a copy-engine all_gather (or inputs), and the tiles go
        to the result or to a collective whose lowering places its epilogue in the
        consumer partitions (`ws_epilogue`: a copy-engine reduction) with reduce_after=1."""
        for a in site.op.args:
            prod = next((o for o in site.bp.ops if o.result == a), None)
            if prod is not None and (prod.kind != "all_gather" or a != site.op.args[0]):
                return False
        for c in site.consumers:
            lw = site.site_of(c.result).lowering
            if lw is None or not lw.takes_ws_epilogue or not site.config.reduce_after:
                return False
        return True

    def fit(self, cfg, overrides, site):
        """gemm=ws's tile shape where the user named none: 128 x 256 x 64 tiles in 3 stages
        (its measured best), or 4 stages at 128 columns; no flatten. Knobs the user set stay
        (and are checked)."""
        fit = {}
        if "flatten" not in overrides:
            fit["flatten"] = 0
        if "block_m" not in overrides:
            fit["block_m"] = 128
        if "block_k" not in overrides:
            fit["block_k"] = 64
        if "block_n" not in overrides and cfg.block_n not in (128, 256):
            fit["block_n"] = 256
        if "stages" not in overrides:
            fit["stages"] = 3 if fit.get("block_n", cfg.block_n) == 256 else 4
        return replace(cfg, **fit)

    def count_rows(self, site) -> int:
        """Rows of the pieces its epilogue hands on: each consumer its BM/2-row half."""
        return site.config.block_m // 2

    def notes(self, site) -> list[str]:
        return ["gemm=ws: warp-specialised Gluon kernel; per program a loader warp waits for "
                "a tile's chunks and runs TMA loads up to `stages` k-steps ahead (across tiles "
                "too), two consumer warpgroups issue wgmma on the tile's two 64-row halves and "
                "hand them to the epilogue; the warps knob does not apply (4 + 4 consumer warps "
                "and the loader's warp)"]

    def render_step(self, step, kb) -> list[str]:
        mb, op = kb.mb, step.op
        site = mb.site_of(op.result)
        kb.gluon = True
        kb.warps = 4  # the program; the partitions add 4 + 1 (setmaxnreg'd)
        for line in _IMPORTS:
            if line not in mb.imports:
                mb.imports.append(line)
        gl_dtype = GL_DTYPES[site.result.dtype]
        if "_tile(" not in "\n".join(mb.module_lines):
            mb.module_lines += [
                "# shared-memory layouts of the TMA boxes (128-byte swizzle for wgmma), and",
                "# registers per thread after setmaxnreg: a consumer holds a BM/2 x BN fp32",
                "# accumulator (128 per thread at 64 x 256); the loader needs few",
                f"A_LAYOUT = gl.constexpr(gl.NVMMASharedLayout.get_default_for([BM, BK], "
                f"{gl_dtype}))",
                f"B_LAYOUT = gl.constexpr(gl.NVMMASharedLayout.get_default_for([BK, BN], "
                f"{gl_dtype}))",
                f"C_LAYOUT = gl.constexpr(gl.NVMMASharedLayout.get_default_for([BM // 2, BN], "
                f"{gl_dtype}))",
                "CONSUMER_REGS = gl.constexpr(232)", "LOADER_REGS = gl.constexpr(40)"]
            mb.module_lines += _HELPERS.splitlines()
        mb.flags["TMA"] = 1
        a_name, b_name = op.args
        av, bv = kb.view(a_name), kb.view(b_name)
        m, k = av.shape
        n = bv.shape[1]
        p = op.result.upper()
        for local, v in (("M", m), ("N", n), ("K", k)):
            kb.const(local, f"{''.join(c if c.isalnum() else '_' for c in p)}_{local}", v,
                     f"gemm {op.result} = {a_name} @ {b_name}: [M, K] x [K, N] on this rank")
        for c in ("BM", "BN", "BK", "GROUP_M", "STAGES", "OWN_FIRST"):
            kb.const(c)
        hooks = mb.hooks_of(op.result)
        fused = any(lw.fuses_own_rows(hs) for lw, hs in hooks)
        rot = self._rotation(kb, site, hooks)
        loader, largs = self._loader(kb, step, av, bv, hooks, fused)
        cargs, typed, extra = self._consumer_args(kb, step, hooks, fused)
        consumer = self._consumer(kb, step, hooks, fused, typed)
        mb.module_lines += ["", ""] + loader + ["", ""] + consumer
        own = av.alias is not None
        lines = []
        for lw, hs in hooks:  # e.g. a reduction's wait for its buffers' release
            lines += lw.prologue(kb, hs)
        lines += [
            "num_m = (M + BM - 1) // BM", "num_n = (N + BN - 1) // BN",
            f"rot = (({rot}) // BM) * OWN_FIRST" if rot else "rot = 0"]
        if fused:
            own_rows = next(lw.own_rows(kb, hs) for lw, hs in hooks
                            if lw.fuses_own_rows(hs))
            lines += [
                "# with the fused reduce this rank's own rows are the last row blocks of the",
                "# (rotated) order, whole tile groups: tiles [tiles, num_m * num_n) are its own,",
                "# and program pid takes the ones congruent to it modulo the grid",
                f"tiles = num_m * num_n - ({own_rows} // BM) * num_n",
                "first_own = tiles + ((pid - tiles) % NUM_PROGRAMS + NUM_PROGRAMS) % NUM_PROGRAMS"]
        else:
            lines += ["tiles = num_m * num_n", "first_own = tiles"]
        lines += [
            "# TMA descriptors: out-of-range rows/columns load as zeros and are not stored",
            f"a_desc = tma.make_tensor_descriptor({av.base}, [M, K], [K, 1], [BM, BK], A_LAYOUT)",
            (f"own_desc = tma.make_tensor_descriptor({av.alias.base}, [{av.alias.rows}, K], "
             "[K, 1], [BM, BK], A_LAYOUT)") if own else "own_desc = a_desc",
            f"b_desc = tma.make_tensor_descriptor({bv.base}, [K, N], [N, 1], [BK, BN], B_LAYOUT)"]
        lines += extra
        lines += [
            "a_bufs = gl.allocate_shared_memory(" + GL_DTYPES[site.result.dtype]
            + ", [STAGES, BM, BK], A_LAYOUT)",
            "b_bufs = gl.allocate_shared_memory(" + GL_DTYPES[site.result.dtype]
            + ", [STAGES, BK, BN], B_LAYOUT)",
            "ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())",
            "empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())",
            "for i in gl.static_range(STAGES):",
            "    mbarrier.init(ready.index(i), count=1)  # completes on the TMA's bytes",
            "    mbarrier.init(empty.index(i), count=2)  # both consumers released the stage",
            "pbars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())",
            "for i in gl.static_range(2):",
            "    mbarrier.init(pbars.index(i), count=1)  # a consumer's own loads (fused reduce)",
            "c_lo = gl.allocate_shared_memory(" + GL_DTYPES[site.result.dtype]
            + ", [BM // 2, BN], C_LAYOUT)",
            "c_hi = gl.allocate_shared_memory(" + GL_DTYPES[site.result.dtype]
            + ", [BM // 2, BN], C_LAYOUT)",
            "gl.warp_specialize(["]
        for half, smem in ((0, "c_lo"), (1, "c_hi")):
            lines.append(f"    (_consumer, ({smem}, pbars.index({half}), gl.constexpr({half}), "
                         f"{cargs})),")
        lines += [f"    (_loader, ({largs})),", "], [4, 1], [CONSUMER_REGS, LOADER_REGS])",
                  "# every partition has joined: the tiles' reads and writes are done"]
        return lines

    # the loader partition ------------------------------------------------------------------

    def _loader(self, kb, step, av, bv, hooks, fused) -> list[str]:
        mb = kb.mb
        names = {"rank": ("me", "me + 1"), "m": ("row_lo", "row_hi"), "n": ("col_lo", "col_hi")}
        waits = []
        a_name = step.op.args[0]
        lw = mb.producer_lowering(a_name)
        dep = find_dep(mb.plan, step.op.result, a_name)
        if lw is not None and dep is not None:
            # (None: a producer whose result is complete when the kernel starts)
            waits = lw.render_waits(kb, mb.site_of(a_name), dep, names, role=step.name) or []
        sig = [x for x in kb.params if x.startswith("sig_")]
        own = av.alias is not None
        params = ["a_desc", "own_desc", "b_desc", "a_bufs", "b_bufs", "ready", "empty"] + sig + [
            "abort_ptr", "diag_ptr", "me", "spin_limit", "epoch", "rot", "tiles", "first_own",
            "M: gl.constexpr", "N: gl.constexpr", "K: gl.constexpr",
            "NUM_PROGRAMS: gl.constexpr", "BM: gl.constexpr", "BN: gl.constexpr",
            "BK: gl.constexpr", "GROUP_M: gl.constexpr", "STAGES: gl.constexpr",
            "FUSED: gl.constexpr"]
        args = ", ".join(
            ["a_desc", "own_desc", "b_desc", "a_bufs", "b_bufs", "ready", "empty"] + sig
            + ["abort_ptr", "diag_ptr", "me", "spin_limit", "epoch", "rot", "tiles", "first_own",
               "M", "N", "K", "NUM_PROGRAMS", "BM", "BN", "BK", "GROUP_M", "STAGES",
               f"gl.constexpr({int(fused)})"])
        body = [
            "row_lo = pid_m * BM",
            "row_hi = min(row_lo + BM, M)",
            "col_lo = pid_n * BN",
            "col_hi = min(col_lo + BN, N)",
            "src_row = row_lo"]
        if waits:
            body.append("tok = epoch * 0")
            if own:
                body += [f"own = (row_lo >= {av.alias.lo}) & (row_lo < {av.alias.hi})",
                         "if own:", f"    src_row = row_lo - {av.alias.lo}", "if not own:"]
                body += indent(waits)
            else:
                body += ["own = row_lo < 0  # (never: every tile reads the gathered buffer)"]
                body += waits
            body += ["# rows written by the copy engine are read through the async proxy (TMA):",
                     "# fence", "tld.fence_proxy_async(True)",
                     "src_row = tld.consume_token(src_row, tok)"]
        else:
            body += ["own = row_lo < 0  # (the operands are this rank's inputs: no wait)"]
        body += ["it = _load_tile(a_desc, b_desc, a_bufs, b_bufs, ready, empty, it, src_row, "
                 "col_lo, own_desc, own, K, BK, STAGES)"]
        loop = ["for t in range(gl.program_id(0), tiles, NUM_PROGRAMS):",
                "    pid_m, pid_n = _tile(t, num_m, num_n, rot, GROUP_M)"] + indent(body)
        lines = ["@gluon.jit", "def _loader(" + ", ".join(params) + "):",
                 '    """The loader partition: per tile its waits, then TMA loads ahead."""',
                 "    num_m = (M + BM - 1) // BM", "    num_n = (N + BN - 1) // BN",
                 "    it = 0"] + indent(loop)
        if fused:
            lines += indent(["if FUSED:"] + indent([
                "for t in range(first_own, num_m * num_n, NUM_PROGRAMS):",
                "    pid_m, pid_n = _tile(t, num_m, num_n, rot, GROUP_M)",
                "    own = pid_m < 0  # (this rank's own inputs: never the alias)",
                "    it = _load_tile(a_desc, b_desc, a_bufs, b_bufs, ready, empty, it, "
                "pid_m * BM, pid_n * BN, own_desc, own, K, BK, STAGES)"]))
        return _wrap_def(lines), args

    # the consumer partitions ---------------------------------------------------------------

    def _consumer_args(self, kb, step, hooks, fused):
        """(the consumer call's arguments after its buffers and half, the consumer's typed
        parameters for them, kernel lines making what they need)."""
        mb = kb.mb
        op = step.op
        common = ["a_bufs", "b_bufs", "ready", "empty", "rot", "tiles", "first_own", "epoch",
                  "M", "N", "K", "NUM_PROGRAMS", "BM", "BN", "BK", "GROUP_M", "STAGES"]
        if not hooks:
            cv = kb.view(op.result)
            extra = [f"c_desc = tma.make_tensor_descriptor({cv.base}, [M, N], [N, 1], "
                     "[BM // 2, BN], C_LAYOUT)"]
            return ", ".join(common + ["c_desc"]), ["c_desc"], extra
        (lw, hs), = hooks
        names, typed, extra = lw.ws_args(kb, hs, fused)
        return ", ".join(common + names), typed, extra

    def _consumer(self, kb, step, hooks, fused, typed) -> list[str]:
        params = (["c_smem", "pbar", "HALF: gl.constexpr", "a_bufs", "b_bufs", "ready", "empty",
                   "rot", "tiles", "first_own", "epoch"]
                  + [f"{c}: gl.constexpr" for c in ("M", "N", "K", "NUM_PROGRAMS", "BM", "BN",
                                                    "BK", "GROUP_M", "STAGES")]
                  + typed)
        head = ["HM: gl.constexpr = BM // 2", "num_m = (M + BM - 1) // BM",
                "num_n = (N + BN - 1) // BN", "it = 0"]
        if not hooks:
            body = ["tma.store_wait(pendings=0)  # the previous tile's store has left c_smem",
                    "c_smem.store(acc.to(c_desc.dtype))", "fence_async_shared()",
                    "tma.async_copy_shared_to_global(c_desc, [pid_m * BM + HALF * HM, "
                    "pid_n * BN], c_smem)"]
            tail = ["tma.store_wait(pendings=0)"]
            fused_body = []
        else:
            (lw, hs), = hooks
            body, fused_body, tail = lw.ws_epilogue(kb, hs, fused)
        loop = ["for t in range(gl.program_id(0), tiles, NUM_PROGRAMS):",
                "    pid_m, pid_n = _tile(t, num_m, num_n, rot, GROUP_M)",
                "    acc, it = _mma_tile(a_bufs, b_bufs, ready, empty, it, HALF, K, HM, BN, BK, "
                "STAGES)"] + indent(body)
        if fused:
            loop += fused_body
        lines = ["@gluon.jit", "def _consumer(" + ", ".join(params) + "):",
                 '    """A consumer partition: the wgmma of its half of each tile, then the '
                 'half\'s epilogue."""'] + indent(head + loop + tail)
        return _wrap_def(lines)


def _wrap_def(lines: list[str]) -> list[str]:
    """A `def f(a, b, ...):` line broken after commas to stay under 100 columns."""
    out = []
    for line in lines:
        if line.startswith("def ") and len(line) > 96:
            name, rest = line.split("(", 1)
            items = [x.strip() for x in rest[:-2].split(",")]
            cur = name + "("
            pad = " " * len(cur)
            for i, it in enumerate(items):
                piece = it + ("," if i < len(items) - 1 else "):")
                if len(cur) + len(piece) + 1 > 96 and cur.strip() not in ("", name + "("):
                    out.append(cur.rstrip())
                    cur = pad + piece
                else:
                    cur = cur + ("" if cur.endswith("(") else " ") + piece
            out.append(cur)
        else:
            out.append(line)
    return out


register_lowering(GemmWarpSpecialized())
