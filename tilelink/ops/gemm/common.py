"""What the GEMM's lowerings share: the knobs of TileLink's kernel, and a tile as the
epilogue hooks see it."""

from __future__ import annotations

from ...codegen.module import TileOut

#: the config fields TileLink's GEMM kernel reads (overriding one asks for that kernel)
TILE_KNOBS = ("num_programs", "block_m", "block_n", "block_k", "order", "group_m", "stages",
              "warps", "flatten")


def tile_out() -> TileOut:
    """A GEMM tile as the collectives' epilogue hooks see it (`TileOut`): its values `vals`,
    index vectors `offs_m` / `offs_n`, interval [row_lo, row_hi) x [col_lo, col_hi) and
    grid index (rank `me`, `pid_m`, `pid_n`), in BM x BN blocks; the same in TileLink's
    kernel and the library GEMM's epilogue pass."""
    return TileOut("vals", "offs_m", "offs_n", "row_lo", "row_hi", "col_lo", "col_hi",
                   {"rank": "me", "m": "pid_m", "n": "pid_n"}, ("BM", "BN"))
