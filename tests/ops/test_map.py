"""map (tilelink/ops/map.py): a user's tile function after an all_gather, run in the emulated
world: its `W` parameter is the world size, and a load or store outside the rows its tile
declares is a located error (the interpreter holds every access to the declared regions)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import tilelink.frontend as tk
from tilelink.codegen import render_triton
from tilelink.runtime import emulate

from ..conftest import emulate_checked


@tk.tile_function(reads={"x": "rows"})
@triton.jit
def times_world(x, out, row0, rows, K: tl.constexpr, W: tl.constexpr, BM: tl.constexpr):
    """out = x * W: a tile function's `W` parameter is the world size (docs/composer.md)."""
    offs = (row0 + tl.arange(0, BM))[:, None] * K + tl.arange(0, K)[None, :]
    mask = (row0 + tl.arange(0, BM))[:, None] < rows
    tl.store(out + offs, tl.load(x + offs, mask=mask).to(tl.float32) * W, mask=mask)


@tk.pattern
def ag_times_world(M=96, K=32, dtype="bf16"):
    x = tk.input((M, K), dtype, shard=0)
    x_full = tk.all_gather(x, dim=0)
    y = tk.map(times_world, x_full)
    return y


@pytest.mark.parametrize("world", [2, 3])
def test_a_tile_functions_W_is_the_world_size(world):
    s, res = emulate_checked(ag_times_world, world, {})
    x_full = torch.cat(res.inputs[0]["x"]).float()
    for y in res.outputs[0]["y"]:
        assert torch.equal(y, (x_full * world).to(y.dtype))
    assert f"W={world}" in render_triton(s)


@tk.tile_function(reads={"x": "rows"})
@triton.jit
def next_block(x, out, row0, rows, K: tl.constexpr, BM: tl.constexpr, SHIFT: tl.constexpr = 1):
    """out's rows are x's rows SHIFT blocks on: outside the declared rows unless SHIFT = 0."""
    offs_m = row0 + tl.arange(0, BM)
    offs_k = tl.arange(0, K)[None, :]
    mask = offs_m[:, None] < rows
    src = (offs_m + SHIFT * BM) % rows
    v = tl.load(x + src[:, None] * K + offs_k, mask=mask)  # a read outside the tile
    tl.store(out + offs_m[:, None] * K + offs_k, v, mask=mask)


@tk.tile_function(reads={"x": "rows"})
@triton.jit
def store_past(x, out, row0, rows, K: tl.constexpr, BM: tl.constexpr):
    """Writes its rows one row down: the last lands on the next tile's first row."""
    offs_m = row0 + tl.arange(0, BM)
    offs_k = tl.arange(0, K)[None, :]
    mask = offs_m[:, None] + 1 < rows
    v = tl.load(x + offs_m[:, None] * K + offs_k, mask=mask)
    tl.store(out + (offs_m[:, None] + 1) * K + offs_k, v, mask=mask)  # too far


@pytest.mark.parametrize("fn, kw, words, marker", [
    (next_block, {}, "loads row 32 of x_full (its parameter x), outside the rows its tile "
     "declares (rows 0 .. 31: reads={'x': 'rows'})", "# a read outside the tile"),
    (store_past, {}, "stores row 32 of its result (y); the tile owns rows 0 .. 31",
     "# too far"),
])
def test_a_tile_function_accessing_outside_its_declared_rows_is_a_located_error(fn, kw, words,
                                                                                  marker):
    # a read of rows the tile did not declare raced with the all_gather filling them: the
    # check passed or failed by the ranks' timing (2 runs in 3 passed). The interpreter now
    # holds every load and store of a tile to its declared regions, on every run.
    from tilelink.errors import PatternError

    @tk.pattern
    def ag_map(M=128, K=32, dtype="fp32"):
        x = tk.input((M, K), dtype, shard=0)
        x_full = tk.all_gather(x, dim=0)
        y = tk.map(fn, x_full, **kw)
        return y

    with pytest.raises(PatternError) as e:
        emulate(ag_map, 2, {}, {"block_m": 32})
    err = e.value
    assert words in err.message, str(err)
    with open(__file__) as f:
        lines = f.read().splitlines()
    line = next(i + 1 for i, text in enumerate(lines) if marker in text and "tl." in text)
    assert (err.loc.file, err.loc.line) == (__file__, line), str(err)
    assert err.loc.col == lines[line - 1].index("tl.") + 1
    assert "Traceback" not in str(err)


def test_a_tile_function_within_its_declared_rows_runs():
    @tk.pattern
    def ag_map(M=128, K=32, dtype="fp32"):
        x = tk.input((M, K), dtype, shard=0)
        x_full = tk.all_gather(x, dim=0)
        y = tk.map(next_block, x_full, SHIFT=0)
        return y

    emulate_checked(ag_map, 2, {}, {"block_m": 32})
