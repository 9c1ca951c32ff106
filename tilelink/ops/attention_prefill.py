"""attention's kernel: FlashAttention-2's forward pass as a TileLink tile loop.

A tile is a block of `block_m` query rows of one head (the region rule's (rank, m, h) grid);
inside it, a loop over the keys in blocks of `block_n` (the rule's loop axis n) keeps an
online softmax (running max and sum per row, in fp32) and accumulates P V on the tensor
cores. The keys and values the loop reads may be an all_gather's result: the plan derives
the tile's waits per step of that loop (`TileGrid.loops`), so before each block the tile
waits only for the chunks holding it, and the loop starts at the block of the row its
producer has ready first (a gather's own rows: `Lowering.rows_ready_first`), wrapping
around. A causal tile stops at the block of its last query's position: the blocks past it
are neither read nor waited for. With the zig-zag placement (`zigzag = 1`: rank r holds
blocks r and 2W - 1 - r of the sequence) the tile computes its queries' and each key block's
positions and skips, unread and unwaited, the blocks it does not see.
"""

from __future__ import annotations

import math

from ..codegen.module import TL_DTYPES, ident
from ..codegen.tiles import item_loop, memo_init, operand_waits
from ..ir.tensor import DTYPE_BYTES
from ..plan.tiling import cdiv, pow2_ceil
from ..schedule.lowering import Lowering, Step, Work, register_lowering, shrink_to_fit
from .attention import AttentionPartialTiles, _group, seen_keys

#: on GPU targets: (block_m, block_n, stages) a program's query rows, a KV block's keys and
#: the K / V blocks in flight; warps per program by head size. cuda:90 measured on one H100
#: (2026-11-27, 3e31dee, examples/attention.tl -W 1, S = 8192, 32 query heads, D = 128,
#: bf16, ms for GQA 32/8 and MHA): 128 x 64 in 2 stages 2.887 / 3.132, in 3 2.429 / 2.489,
#: in 4 2.473 / 2.500; 128 x 128 in 2 2.625 / 2.721, in 3 2.454 / 2.532; S = 16384 GQA:
#: 128 x 64 x 3 9.246, 128 x 128 x 3 9.360. The other targets keep FlashAttention-2's
#: usual forward tiles (not measured here). `fit` takes stages, then block_n, down to the
#: target's shared memory
PREFILL_TILES = {"cuda:90": (128, 64, 3)}
PREFILL_BLOCK_M, PREFILL_BLOCK_N, PREFILL_STAGES = 128, 64, 2


#: the tile body's share of the cost model's GEMM rate (as `attention.SDPA_EFFICIENCY`),
#: measured on one H100 (2026-11-27, a1d6c81, `tilelink bench examples/attention.tl -W 1`,
#: 32 query heads, D = 128, bf16): without a mask 441-476 TFLOP/s at S = 4096-32768 of the
#: model's 771 (S = 8192 GQA 32/8: 2.429 ms, 0.59); causal 0.43 (S = 8192 32/8 at W = 1:
#: 1.669 ms; the gathering kernels at W = 2 / 4 measured 1.266 / 0.798 ms, 0.42 / 0.39 with
#: their exposed communication). So the default runs torch's SDPA where nothing is
#: communicated, and the overlapped kernel where the plan's SDPA takes the slower offset mask
#: (`attention.SDPA_OFFSET_CAUSAL_EFFICIENCY`) or its gather is long enough to hide
TILE_EFFICIENCY = 0.60
CAUSAL_TILE_EFFICIENCY = 0.43


class AttentionTiles(Lowering):
    """attention's tiles: one (query block, head) per item of a persistent loop; see the
    module docstring."""

    kind = "attention"
    name = "attention/triton"
    knobs = ("num_programs", "warps", "block_m", "block_n", "stages", "order")
    what = ("one (block of query rows, head) per item: the keys and values in blocks, each "
            "waited for as the loop reaches it (online softmax)")

    # ---- the schedule ----------------------------------------------------------------------

    def reasons(self, site) -> list[str]:
        dts = {site.tensor(a).dtype for a in site.op.args}
        if not dts <= set(TL_DTYPES):
            return [f"operands are {', '.join(sorted(dts))}: attention kernels take float "
                    "tensors"]
        out = []
        need = self._smem(site)
        if site.target.smem_bytes is not None and need > site.target.smem_bytes:
            cfg = site.config
            out.append(f"its tile needs {need} B of shared memory (a {cfg.block_m}-row query "
                       f"block and {cfg.stages} stages of a {cfg.block_n}-key K and V block), "
                       f"more than {site.target.name}'s {site.target.smem_bytes} B: use fewer "
                       "stages or a smaller block_m or block_n")
        return out

    @staticmethod
    def _smem(site, cfg=None) -> int:
        """Shared memory of a tile: its queries, and a K and a V block per stage."""
        cfg = cfg or site.config
        d = pow2_ceil(site.tensor(site.op.args[1]).local_shape[2])
        elem = DTYPE_BYTES.get(site.tensor(site.op.args[1]).dtype, 2)
        return (cfg.block_m + cfg.stages * 2 * cfg.block_n) * d * elem

    def defaults(self, site) -> dict:
        """On GPUs the target's measured tiles (`PREFILL_TILES`; else FlashAttention-2's
        usual ones), fitted to its shared memory: 4 warps for heads of up to 64, else 8."""
        if site.target.backend == "interp":
            return {}
        d = site.tensor(site.op.args[0]).local_shape[2]
        bm, bn, st = PREFILL_TILES.get(site.target.name.split("+")[0],
                                       (PREFILL_BLOCK_M, PREFILL_BLOCK_N, PREFILL_STAGES))
        vals = {"block_m": str(bm), "block_n": str(bn), "stages": str(st),
                "warps": "4" if d <= 64 else "8"}
        return vals | self._fit(site.config.with_values(vals), site, ())

    def fit(self, cfg, overrides, site):
        """The knobs the user did not set, fitted to the target's shared memory."""
        return cfg.with_values(self._fit(cfg, site, overrides))

    def _fit(self, cfg, site, keep) -> dict:
        """Fewer stages (down to 2), then narrower key blocks (down to 64), until a tile fits
        the target's shared memory (knobs in `keep` stay)."""
        limit = site.target.smem_bytes
        if limit is None:
            return {}
        steps = [("stages", str(s)) for s in range(cfg.stages - 1, 1, -1)] + \
            [("block_n", str(b)) for b in (64,) if b < cfg.block_n]
        return shrink_to_fit(cfg, steps, lambda c: self._smem(site, c), limit, keep)

    def steps(self, site) -> list[Step]:
        return [Step("tiles", site.op, self, self.what)]

    def notes(self, site) -> list[str]:
        q = site.tensor(site.op.args[0]).local_shape
        k = site.tensor(site.op.args[1]).local_shape
        cfg = site.config
        tiles = cdiv(q[0], cfg.block_m) * q[1]
        line = (f"{site.where}: {tiles} tiles of {cfg.block_m} query rows x 1 head on "
                f"{cfg.num_programs} programs, keys in {cdiv(k[0], cfg.block_n)} blocks of "
                f"{cfg.block_n}")
        if site.attrs["causal"]:
            line += "; causal: a tile stops at its last query's block"
        group = _group(q, k)
        if group > 1:
            line += f"; {group} query heads a key head"
        return [line]

    def work(self, site) -> Work:
        """q k and p v over the keys the busiest rank's queries see (`seen_keys`), at the
        kernel's measured share (`TILE_EFFICIENCY`, causal `CAUSAL_TILE_EFFICIENCY`) of the
        GEMM rate of the tiles that can run at once. Bytes: q read and the output written
        once; the keys and values once per wave of programs (the programs of one wave
        working on a head read its blocks at about the same time, sharing them through L2).
        A tile holds its queries' softmax state until it has read every key they see, so
        before the last gathered chunk lands the programs can do only the first wave's own
        keys (`Work.ready_share`): with one wave of many ranks' keys, the gather is exposed
        (non-causal SP attention, S = 8192, 32 heads, 4x H100: the copy-engine kernel took
        1.124 ms at W = 4 where NCCL all-gather + SDPA took 0.813)."""
        bp, op, cfg = site.bp, site.op, site.config
        sq, h, d = bp.tensors[op.args[0]].local_shape
        hkv = bp.tensors[op.args[1]].local_shape[1]
        seen = seen_keys(bp, op)
        elem = DTYPE_BYTES.get(bp.tensors[op.args[0]].dtype, 2)
        tiles = cdiv(sq, cfg.block_m) * h
        programs = max(1, min(tiles, cfg.num_programs))
        waves = cdiv(tiles, programs)
        nbytes = 2.0 * sq * h * d * elem + waves * 2.0 * seen * hkv * d * elem
        eff = CAUSAL_TILE_EFFICIENCY if site.attrs["causal"] else TILE_EFFICIENCY
        # the share of a tile's keys in this rank's own chunk: 1 / W of them, or with a causal
        # mask the own chunk's keys before each query (about half of the chunk)
        own = sq / 2.0 / seen if site.attrs["causal"] else 1.0 / bp.world
        return Work(4.0 * sq * seen * h * d, nbytes, programs=programs, efficiency=eff,
                    ready_share=min(1.0, own) / waves)

    # ---- codegen -----------------------------------------------------------------------------

    def result_home(self, site):
        return None

    def _const(self, kb, site, **values) -> None:
        p = ident(site.op.result)
        for k, v in values.items():
            kb.const(k, f"{p}_{k}", v, f"{site.op.kind} {site.op.result}")

    def render_step(self, step, kb) -> list[str]:
        site = kb.mb.site_of(step.op.result)
        cfg = site.config
        q, k, v = (kb.view(a) for a in step.op.args)
        out = kb.view(step.op.result)
        sq, heads, d = q.shape
        skv, kv_heads = k.shape[0], k.shape[1]
        causal = bool(site.attrs["causal"])
        zigzag = causal and bool(site.attrs["zigzag"])
        self._const(kb, site, SQ=sq, SKV=skv, HQ=heads, HKV=kv_heads,
                    G=_group(q.shape, k.shape), D=d, DP=max(16, pow2_ceil(d)), BM=cfg.block_m,
                    BN=cfg.block_n, STAGES=cfg.stages)
        up, prec = AttentionPartialTiles._dot_operands(kb, q.dtype)
        names = {"rank": ("me", "me + 1"), "m": ("m0", "m1"), "h": ("h", "h + 1")}
        waits, waited = operand_waits(kb, step, names)
        # a block's chunks in one wait_flat (an inline-asm spin, no loop): a wait with its
        # own scf.while inside the KV loop stops Triton's software pipelining of the loads;
        # and only for chunks the tile has not waited for yet (memo): a chunk holds many
        # blocks, and each wait is an acquire load and a CTA barrier
        step_waits, step_waited = operand_waits(kb, step, names | {"n": ("n0", "n1")},
                                                loop="n", flat=True, memo=True)

        def tok(expr: str, tensor: str, during: set) -> str:
            return f"tld.consume_token({expr}, tok)" if tensor in during else expr

        q_name, k_name, v_name = step.op.args
        first = self._first_block(kb, site, k_name)
        # the head dim padded to a power of two (DP) is masked to D; unpadded, no mask
        dmask = "" if max(16, pow2_ceil(d)) == d else " & dmask[None, :]"
        dt = TL_DTYPES[q.dtype]
        if zigzag:
            # rank r holds blocks r and 2W - 1 - r of the sequence (SQ / 2 rows each), for
            # the queries and for each rank's keys: the mask follows their positions, and a
            # block none of whose keys sits at or before the tile's last query is skipped
            self._const(kb, site, HALF=sq // 2)
            keys = ["nkeys = SKV",
                    "qpos = tl.where(offs_m < HALF, me * HALF + offs_m, "
                    "(2 * WORLD - 1 - me) * HALF + offs_m - HALF)",
                    "qlast = tl.max(tl.where(mmask, qpos, -1), axis=0)"]
            kpos = ["src, row = offs_n // SQ, offs_n % SQ  # the key's rank and its row there",
                    "kpos = tl.where(row < HALF, src * HALF + row, "
                    "(2 * WORLD - 1 - src) * HALF + row - HALF)"]
            seen = "nmask[None, :] & (kpos[None, :] <= qpos[:, None])"
            partial = None  # every block is masked (positions differ per half)
        elif causal:
            # query i of this rank sits at position me * SQ + i and sees keys up to it
            keys = ["nkeys = tl.minimum(me * SQ + m1, SKV)  # keys up to the last query's "
                    "position: the blocks past them are never read"]
            seen = "nmask[None, :] & (offs_n[None, :] <= me * SQ + offs_m[:, None])"
            # a block past the tile's first query position (the diagonal) or the last
            partial = "(n0 + BN > nkeys) | (n0 + BN - 1 > me * SQ + m0)"
        else:
            keys = ["nkeys = SKV"]
            seen = "nmask[None, :]"
            partial = "n0 + BN > nkeys"  # the last block, where SKV is ragged
        body = [
            "offs_m = m0 + tl.arange(0, BM)",
            "mmask = offs_m < SQ  # (the last query block may be ragged)",
            "offs_d = tl.arange(0, DP)",
        ] + (["dmask = offs_d < D"] if dmask else []) + [
            f"q_rows = {tok('(offs_m * HQ + h) * D', q_name, waited)}",
            f"qt = tl.load({q.base} + q_rows[:, None] + offs_d[None, :], "
            f"mask=mmask[:, None]{dmask}, other=0.0){up}",
            'm_i = tl.full((BM,), float("-inf"), tl.float32)  # running max per row',
            "l_i = tl.zeros((BM,), tl.float32)  # running sum of exp(score - m_i)",
            "acc = tl.zeros((BM, DP), dtype=tl.float32)",
        ] + keys + memo_init(step_waited) + [
            "nblk = (nkeys + BN - 1) // BN",
            f"start = {first}",
            "for i in tl.range(0, nblk, num_stages=STAGES):  # K and V blocks in flight",
            "    n0 = ((start + i) % nblk) * BN",
            "    n1 = tl.minimum(n0 + BN, SKV)",
        ]
        # the block's first key, made dependent on its waits (below) where it has any: a
        # scalar, so the K and V offsets are computed after the waits' `if` (a [BN, D]
        # offset tensor carried out of it would hold 2 x BN x D / threads registers)
        n_at = "n0_at" if step_waits and not zigzag else "n0"
        block = [f"offs_n = {n_at} + tl.arange(0, BN)", "nmask = offs_n < nkeys",
                 "kv = (offs_n[:, None] * HKV + g) * D + offs_d[None, :]",
                 f"kvmask = nmask[:, None]{dmask}"]
        k_at, v_at = ((tok("kv", k_name, step_waited), tok("kv", v_name, step_waited))
                      if zigzag else ("kv", "kv"))
        work = [
            f"kt = tl.load({k.base} + {k_at}, mask=kvmask, other=0.0){up}",
            # scores in log2 units (scaled by log2(e) / sqrt(D)): exp2 is the GPU's own
            f"scores = tl.dot(qt, tl.trans(kt){prec}) * {_qk_scale(d)!r}",
        ] + ([f"scores = tl.where({seen}, scores, float(\"-inf\"))"] if partial is None else [
            f"if {partial}:  # keys some queries must not see: masked (whole blocks are not)",
            f"    scores = tl.where({seen}, scores, float(\"-inf\"))",
        ]) + [
            "m_new = tl.maximum(m_i, tl.max(scores, axis=1))",
        ] + ([
            "# (a row that has seen no key yet keeps -inf: exp against 0 gives it 0s)",
            'm_use = tl.where(m_new == float("-inf"), 0.0, m_new)',
        ] if causal else [
            "m_use = m_new  # (every block holds a key every query sees: never -inf)",
        ]) + [
            "p = tl.exp2(scores - m_use[:, None])",
            "alpha = tl.exp2(m_i - m_use)",
            "l_i = l_i * alpha + tl.sum(p, axis=1)",
            f"vt = tl.load({v.base} + {v_at}, mask=kvmask, other=0.0){up}",
            f"pv = tl.dot(p.to({dt}){up}, vt{prec})  # weights rounded to the inputs' dtype",
            "acc = acc * alpha[:, None] + pv",
            "m_i = m_new",
        ]
        if zigzag:  # a block none of whose keys the tile's queries see: no wait, no read
            work = block + kpos + [
                "if tl.min(tl.where(nmask, kpos, SKV), axis=0) <= qlast:"] + [
                "    " + x for x in step_waits + work]
        else:
            if step_waits:  # (first line: tok's initial value; then the waits)
                # the waits and the token's use under an `if` (n1 > n0 holds for every
                # block): Triton's pipeliner predicates an scf.if, not the inline asm of a
                # bare wait or consume_token, so the K and V loads stay pipelined
                step_waits = step_waits[:1] + ["n0_at = n0", "if n1 > n0:"] + [
                    "    " + x for x in step_waits[1:] + ["n0_at = tld.consume_token(n0, tok)"]]
            work = step_waits + block + work
        body += ["    " + x for x in work] + [
            "l_i = tl.where(l_i == 0.0, 1.0, l_i)",
            f"tl.store({out.base} + (offs_m[:, None] * HQ + h) * D + offs_d[None, :], "
            f"(acc / l_i[:, None]).to({TL_DTYPES[out.dtype]}), "
            f"mask=mmask[:, None]{dmask})",
        ]
        self._const(kb, site, NMB=cdiv(sq, cfg.block_m))
        if causal:
            # a tile sees more keys the later its queries: every head's tiles longest first,
            # each other round of the programs taking its tiles in reverse (a snake), so
            # every program gets about the same number of key blocks (round-robin over the
            # longest-first tiles of one key head at a time left one program 1.29x the mean
            # at S = 8192 and 1.78x at 4096, 32 / 8 heads on 132 programs; the snake 1.01x)
            p = step.count
            index = [f"rnd = t // {p}  # the programs' round",
                     f"u = t + (rnd % 2) * (tl.minimum({p}, NMB * HQ - rnd * {p}) - 1 - "
                     f"2 * (t % {p}))  # odd rounds reversed",
                     "m0 = (NMB - 1 - u // HQ) * BM  # the longest tiles first",
                     "h = u % HQ  # its query head", "g = h // G  # its key head"]
        else:
            # items by key head, then query block, then the G query heads that share the key
            # head: the programs running at once read the same keys and values, which stay
            # in L2 (with heads fastest every key head's keys and values are read at once;
            # 4x H100: 2-3% faster on every attention case measured, docs/perf.md)
            index = ["g = t // (NMB * G)  # its key head", "r = t % (NMB * G)",
                     "h = g * G + r % G  # its query head", "m0 = (r // G) * BM"]
        index += ["m1 = tl.minimum(m0 + BM, SQ)"]
        return item_loop(step, "NMB * HQ", index, waits, body)

    def _first_block(self, kb, site, keys: str) -> str:
        """The KV loop's first block: with order=own_first, the one holding the key row
        the keys' producer has ready first (a gather's own rows), so the loop reads what
        has arrived while the rest is in flight; else block 0."""
        lw = kb.mb.producer_lowering(keys)
        row = None
        if lw is not None and site.config.order == "own_first":
            row = lw.rows_ready_first(kb, kb.mb.site_of(keys))
        return f"(({row}) // BN) % nblk" if row else "0"


def _qk_scale(d: int) -> float:
    """The factor taking q . k to the exponent base 2 of the softmax: log2(e) / sqrt(D)."""
    return math.log2(math.e) / math.sqrt(d)


register_lowering(AttentionTiles())
