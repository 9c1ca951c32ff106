"""Schedule configs: which resource communicates, the SM split, tile sizes and orders.

A `Config` is one point of the space the tuner searches. `ConfigSpace` lists every
knob with its allowed values and checks a config against a bound pattern: a config is
either valid by construction or rejected with the reason, so the tuner never measures
something that cannot run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from ..errors import ConfigError, closest

# "none": the non-overlapped plan (NCCL collective, then cuBLAS GEMM), for shapes where
# overlap cannot pay; no kernel is generated for it
COMM_RESOURCES = ("sm", "copy_engine", "none")
FALLBACK_SIGNATURES = ("all_gather>gemm", "gemm>reduce_scatter")
ORDERS = ("own_first", "natural")
# who computes the GEMM: "triton", TileLink's generated persistent kernel (tiles wait for their
# chunks); "library", the vendor BLAS through torch.mm (cuBLAS / hipBLASLt), one call per source
# rank's rows in arrival order, with TileLink's small kernels doing the waits and releases;
# "ws", a warp-specialised Gluon kernel (Hopper): a loader warp waits for a tile's chunks and
# runs TMA loads ahead while two consumer warpgroups only issue wgmma (cuBLAS's structure)
GEMMS = ("triton", "library", "ws")
# signatures with a library-GEMM plan
LIBRARY_GEMM_SIGNATURES = ("all_gather>gemm",)
# signatures with a warp-specialised (gemm=ws) kernel
WS_GEMM_SIGNATURES = ("all_gather>gemm", "gemm>reduce_scatter")
# shared memory a CTA may use on Hopper (227 KB), for gemm=ws's stages and epilogue buffers
HOPPER_SMEM = 232448
# signatures whose copy-engine protocol has the flag variant (capturable=1)
CAPTURABLE_COPY_ENGINE_SIGNATURES = ("all_gather>gemm",)


@dataclass(frozen=True)
class Config:
    """One schedule. Sizes are elements; `num_programs` is the persistent grid size."""

    comm: str = "sm"  # "sm": a role in the kernel on reserved programs; "copy_engine"
    comm_programs: int = 2  # programs (SMs) given to communication when comm == "sm"
    num_programs: int = 4  # persistent grid: never more than co-resident CTAs
    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    comm_block_m: int = 64  # chunk rows moved (and signalled) at once
    comm_block_n: int = 64  # reduce_scatter: chunk columns (all_gather copies whole rows)
    order: str = "own_first"  # compute tile order: the tiles whose data is ready first go first
    group_m: int = 8  # grouped ordering of output tiles (L2 reuse)
    stages: int = 3
    warps: int = 4
    flatten: int = 0  # GPU: software-pipeline the K loop across consecutive tiles (tl.range)
    # reduce_scatter: 1 = sum in a second kernel on every SM right after the GEMM kernel (the
    # GEMM gets every SM; only the last chunks' sums are exposed); 0 = a role of the kernel
    reduce_after: int = 0
    # GEMM-RS with comm=copy_engine and reduce_after=1: 1 = no second kernel; this rank's own
    # output tiles (computed last) add the peers' partials in the GEMM's epilogue and store the
    # result, so no sum is left after the GEMM
    fuse_reduce: int = 0
    # "library": torch.mm per source rank's rows (comm=copy_engine, all_gather>gemm); the tile
    # knobs then do not apply. Pays where the GEMM is one wave or less and cuBLAS's kernel beats
    # TileLink's (small M)
    gemm: str = "triton"
    # AG-GEMM with comm=copy_engine: 1 = the copy engine's ops carry no per-call value (its
    # gates and data signals are 0/1 flags the kernel sets and clears; one gathered buffer
    # instead of two, so a destination must have finished the previous call, not the one
    # before it), so a call can be captured in a CUDA graph and replayed. 0 = epoch-valued
    # signals and double buffering (calls overlap more; not capturable). comm=sm kernels are
    # capturable either way: they read their epoch from device memory
    capturable: int = 0
    # Debug only, never searched: 1 gives consumer roles LOWER program ids than their
    # producers, breaking the program-order rule on purpose so that tests can check the
    # emulated world's hang report. Allowed on the interp target only (a GPU could deadlock).
    debug_reverse_roles: int = 0

    def with_values(self, values: dict[str, str]) -> Config:
        """A copy with `KEY=VALUE` strings applied (from `--config`); unknown keys fail."""
        known = {f.name: f.type for f in fields(self)}
        out = {}
        for k, v in values.items():
            if k not in known:
                hint = closest(k, known)
                raise ConfigError(f"unknown config key '{k}'",
                                  hint=f"did you mean '{hint}'?" if hint else
                                  "keys: " + ", ".join(known))
            if known[k] in ("int", int):
                try:
                    out[k] = int(v)
                except ValueError:
                    raise ConfigError(f"config {k}={v!r} must be an integer") from None
            else:
                out[k] = v
        return replace(self, **out)

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        # debug knobs and capturable are shown only when set (so the configs, and the
        # generated modules' headers, of everything before them read as they did)
        return " ".join(f"{k}={v}" for k, v in asdict(self).items()
                        if v or not (k.startswith("debug_") or k == "capturable"))


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class ConfigSpace:
    """Allowed values of every knob, for one pattern on one target."""

    comm: tuple[str, ...] = COMM_RESOURCES
    comm_programs: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    block_m: tuple[int, ...] = (16, 32, 64, 128)
    block_n: tuple[int, ...] = (16, 32, 64, 128, 256)
    block_k: tuple[int, ...] = (16, 32, 64)
    # chunk rows: small chunks suit SM pushes; the copy engine wants few large copies
    comm_block_m: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    comm_block_n: tuple[int, ...] = (16, 32, 64, 128, 256)
    order: tuple[str, ...] = ORDERS
    group_m: tuple[int, ...] = (1, 4, 8)
    stages: tuple[int, ...] = (1, 2, 3, 4)
    warps: tuple[int, ...] = (4, 8)
    flatten: tuple[int, ...] = (0, 1)
    reduce_after: tuple[int, ...] = (0, 1)
    fuse_reduce: tuple[int, ...] = (0, 1)
    gemm: tuple[str, ...] = GEMMS
    capturable: tuple[int, ...] = (0, 1)
    max_programs: int = 132  # co-resident CTAs of the target (one per SM)
    supports_copy_engine: tuple[str, ...] = ("all_gather>gemm", "gemm>reduce_scatter")
    # signatures whose kernel keeps an SM role next to the copy engine (GEMM-RS: the reduce
    # role sums what the copy engine delivered), sized by comm_programs
    copy_engine_keeps_sm_role: tuple[str, ...] = ("gemm>reduce_scatter",)
    # patterns whose kernel takes role offsets (debug_reverse_roles)
    supports_reverse_roles: tuple[str, ...] = ("gemm>reduce_scatter",)
    allow_debug: bool = False  # debug knobs that break GPU safety (emulated target only)
    # the target runs a rank's programs one after another (the Triton interpreter), so a
    # schedule must not need its programs resident at once
    sequential_programs: bool = False
    # the target runs Gluon's Hopper warp specialisation (gemm=ws): cuda:90 with TileLink's
    # own signal primitives (not the NVSHMEM flavour, not the interpreter)
    warp_specialized: bool = False

    def reasons(self, cfg: Config, signature: str) -> list[str]:
        """Why `cfg` is invalid for a pattern with op signature `signature` (empty: valid)."""
        bad = []
        for f in fields(cfg):
            allowed = getattr(self, f.name, None)
            if isinstance(allowed, tuple) and getattr(cfg, f.name) not in allowed:
                bad.append(f"{f.name}={getattr(cfg, f.name)} is not one of "
                           f"{', '.join(map(str, allowed))}")
        for name in ("block_m", "block_n", "block_k", "comm_block_m", "comm_block_n"):
            if not _pow2(getattr(cfg, name)):
                bad.append(f"{name}={getattr(cfg, name)} must be a power of two (tl.arange)")
        if not 1 <= cfg.num_programs <= self.max_programs:
            bad.append(f"num_programs={cfg.num_programs} must be in 1..{self.max_programs} "
                       "(the persistent grid may not exceed co-resident CTAs)")
        if cfg.comm == "sm" and cfg.comm_programs >= cfg.num_programs:
            bad.append(f"comm_programs={cfg.comm_programs} leaves no program for compute "
                       f"(num_programs={cfg.num_programs})")
        if signature == "gemm>reduce_scatter" and cfg.comm_block_m * cfg.comm_block_n > 16384:
            # the reduce role holds a comm_block_m x comm_block_n fp32 tile in registers
            bad.append(f"comm_block_m x comm_block_n = {cfg.comm_block_m * cfg.comm_block_n} "
                       "exceeds 16384: the reduce tile (fp32, in registers) would spill "
                       "(measured 1.2-4x slower)")
        if cfg.reduce_after and not (signature == "gemm>reduce_scatter"
                                     and cfg.comm in ("sm", "copy_engine")):
            bad.append("reduce_after=1 applies to gemm>reduce_scatter with comm=sm or "
                       "comm=copy_engine only")
        if cfg.fuse_reduce and not (signature == "gemm>reduce_scatter"
                                    and cfg.comm == "copy_engine" and cfg.reduce_after
                                    and cfg.order == "own_first"):
            bad.append("fuse_reduce=1 applies to gemm>reduce_scatter with comm=copy_engine, "
                       "reduce_after=1 and order=own_first only (this rank's rows are "
                       "computed last, once the peers' partials of them have arrived)")
        if cfg.fuse_reduce and self.sequential_programs:
            bad.append("fuse_reduce=1 needs every program of the kernel resident at once: an "
                       "own tile's epilogue waits (through the peers' copy engines) for the "
                       "peers' other tiles, which every program computes first. The emulated "
                       "world runs a rank's programs one after another, so it would deadlock "
                       "there; it runs on GPUs (persistent grid <= SMs; tests/test_dist.py)")
        if cfg.gemm == "library" and not (signature in LIBRARY_GEMM_SIGNATURES
                                          and cfg.comm == "copy_engine"):
            bad.append("gemm=library applies to " + ", ".join(LIBRARY_GEMM_SIGNATURES) +
                       " with comm=copy_engine only (the library GEMM runs per source rank's "
                       "rows once the copy engine delivered them)")
        if cfg.gemm == "library" and (cfg.fuse_reduce or cfg.reduce_after or cfg.flatten):
            bad.append("gemm=library takes no kernel knobs (flatten, reduce_after, fuse_reduce): "
                       "the GEMM is the library's")
        if cfg.gemm == "ws":
            bad += self._ws_reasons(cfg, signature)
        if cfg.capturable and not (signature in CAPTURABLE_COPY_ENGINE_SIGNATURES
                                   and cfg.comm == "copy_engine"):
            bad.append("capturable=1 applies to " + ", ".join(CAPTURABLE_COPY_ENGINE_SIGNATURES)
                       + " with comm=copy_engine only (comm=sm kernels are capturable as they "
                       "are; comm=none is NCCL + cuBLAS, capturable too)")
        if cfg.comm == "none" and signature not in FALLBACK_SIGNATURES:
            bad.append(f"comm=none (non-overlapped fallback) is not implemented for {signature}")
        if cfg.comm == "copy_engine" and signature not in self.supports_copy_engine:
            bad.append(f"comm=copy_engine is not implemented for {signature} yet; use comm=sm")
        if (cfg.comm == "copy_engine" and signature in self.copy_engine_keeps_sm_role
                and not cfg.reduce_after and cfg.comm_programs >= cfg.num_programs):
            bad.append(f"comm_programs={cfg.comm_programs} (the reduce role's programs with "
                       f"comm=copy_engine) leaves no program for compute "
                       f"(num_programs={cfg.num_programs})")
        if cfg.debug_reverse_roles not in (0, 1):
            bad.append(f"debug_reverse_roles={cfg.debug_reverse_roles} is not one of 0, 1")
        elif cfg.debug_reverse_roles:
            if not self.allow_debug:
                bad.append("debug_reverse_roles=1 breaks the program-order rule (consumers get "
                           "lower program ids than their producers): on a GPU the kernel can "
                           "deadlock, so it is refused here; it is allowed only on the emulated "
                           "target (interp), to test hang reports")
            if signature not in self.supports_reverse_roles:
                bad.append(f"debug_reverse_roles=1 is implemented for "
                           f"{', '.join(self.supports_reverse_roles)} only, not {signature}")
        return bad

    def _ws_reasons(self, cfg: Config, signature: str) -> list[str]:
        """Why gemm=ws (the warp-specialised Gluon kernel) cannot run `cfg`."""
        bad = []
        if not self.warp_specialized:
            bad.append("gemm=ws needs Hopper's warp specialisation through Gluon: target "
                       "cuda:90 (torch symmetric memory backend); not the emulated world, "
                       "cuda:80, hip or the NVSHMEM flavour")
        if not (signature in WS_GEMM_SIGNATURES and cfg.comm == "copy_engine"):
            bad.append("gemm=ws applies to " + ", ".join(WS_GEMM_SIGNATURES) + " with "
                       "comm=copy_engine only (the copy engine moves the data; the kernel's "
                       "warps wait for it or count for it)")
        elif signature == "gemm>reduce_scatter" and not cfg.reduce_after:
            bad.append("gemm=ws on gemm>reduce_scatter needs reduce_after=1 (the sum runs "
                       "after the GEMM or in the own tiles' epilogue with fuse_reduce=1; the "
                       "kernel has no reduce role)")
        if cfg.block_m != 128 or cfg.block_n not in (128, 256) or cfg.block_k != 64:
            bad.append(f"gemm=ws takes block_m=128 (two 64-row consumer halves), block_n=128 "
                       f"or 256 and block_k=64, not {cfg.block_m}x{cfg.block_n}x{cfg.block_k}")
        smem = 2 * (cfg.stages * (cfg.block_m + cfg.block_n) * cfg.block_k
                    + cfg.block_m * cfg.block_n)
        if smem > HOPPER_SMEM - 1024:
            bad.append(f"gemm=ws with stages={cfg.stages} needs {smem} B of shared memory "
                       f"(more than a Hopper CTA's {HOPPER_SMEM}): use fewer stages (3 at "
                       "block_n=256, up to 4 at block_n=128)")
        if cfg.stages < 2:
            bad.append("gemm=ws needs stages >= 2 (the loader runs ahead of the consumers)")
        if cfg.flatten:
            bad.append("gemm=ws takes no flatten (its loader already runs across tiles)")
        return bad

    def check(self, cfg: Config, signature: str) -> Config:
        """Return `cfg` if valid, else raise ConfigError listing every reason."""
        bad = self.reasons(cfg, signature)
        if bad:
            raise ConfigError("invalid schedule config: " + "; ".join(bad),
                              hint="see `tilelink compile --emit schedule` for the space")
        return cfg

    def describe(self) -> str:
        rows = [f"  {f.name}: {', '.join(map(str, getattr(self, f.name)))}"
                for f in fields(Config) if isinstance(getattr(self, f.name, None), tuple)]
        rows.append(f"  num_programs: 1..{self.max_programs}")
        return "\n".join(rows)
