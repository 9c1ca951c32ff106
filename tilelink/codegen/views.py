"""The vocabulary lowerings and the module builder share: how a kernel addresses a tensor
(`View`, `Alias`), a compute tile as epilogue hooks see it (`TileOut`), Triton dtype names
and small text helpers for generated lines."""

from __future__ import annotations

from dataclasses import dataclass

TL_DTYPES = {"bf16": "tl.bfloat16", "fp16": "tl.float16", "fp32": "tl.float32"}
SIG_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "int32": "i32", "int64": "i64",
              "uint8": "u8"}


def indent(lines: list[str], n: int = 1) -> list[str]:
    """`lines` indented by `n` levels of four spaces (blank lines stay blank)."""
    pad = "    " * n
    return [pad + x if x else x for x in lines]


def ident(name: str) -> str:
    """`name` as an upper-case constant prefix (a_full -> A_FULL)."""
    return "".join(c if c.isalnum() else "_" for c in name).upper()


@dataclass(frozen=True)
class Alias:
    """Rows `lo .. hi - 1` (kernel expressions) of a view's dim 0 live in another tensor,
    whose row r is the view's row lo + r: the own rows of a gathered tensor, read in place
    from this rank's input instead of a copy of them."""

    lo: str
    hi: str
    base: str  # pointer of the other tensor's row 0
    rows: int  # its row count (for a descriptor)


@dataclass(frozen=True)
class RowsOf:
    """A tensor written as an index of another tensor's rows (`Lowering.gathered_rows`): its
    row r is row `index[r]` (int32) of the tensor at `source`, whose rows hold as many
    elements as the view's. No memory holds the rows themselves."""

    index: str  # pointer of the int32 index, one entry a row
    source: str  # pointer of the source tensor's row 0


@dataclass(frozen=True)
class View:
    """How a kernel addresses a tensor: contiguous, row-major, from `base`."""

    tensor: str
    base: str
    shape: tuple[int, ...]
    dtype: str
    peer_written: bool = False  # other agents write it (a proxy fence before TMA reads)
    alias: Alias | None = None
    rows_of: RowsOf | None = None  # written as an index of another tensor's rows

    def strides(self) -> tuple[int, ...]:
        out, n = [], 1
        for d in reversed(self.shape):
            out.append(n)
            n *= d
        return tuple(reversed(out))

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def addr(self, index: list[str]) -> str:
        """Pointer expression of element `index` (one expression per dim)."""
        terms = []
        for i, s in zip(index, self.strides()):
            if i in ("0", 0):
                continue
            terms.append(f"({i})" if s == 1 else f"({i}) * {s}")
        return " + ".join([self.base] + terms)


@dataclass
class TileOut:
    """A compute tile's result as epilogue hooks see it (2-D: rows x columns).

    `values`: the tile in the result dtype; `rows` / `cols`: the index vectors (`offs_m`,
    `offs_n`); `row_lo`/`row_hi`, `col_lo`/`col_hi`: the tile's interval (scalars);
    `grid`: producer grid axis -> this tile's index (for slot expressions)."""

    values: str
    rows: str
    cols: str
    row_lo: str
    row_hi: str
    col_lo: str
    col_hi: str
    grid: dict
    shape: tuple[int, int]


def numel(shape) -> int:
    """Elements of a tensor of `shape`."""
    n = 1
    for d in shape:
        n *= d
    return n


def wrap_items(items: list[str], pad: str, width: int = 96) -> list[str]:
    """`items` as comma-terminated lines of at most `width` columns (a kernel's arguments)."""
    lines, cur = [], ""
    for it in items:
        piece = it + ","
        if cur and len(pad) + len(cur) + 1 + len(piece) > width:
            lines.append(pad + cur)
            cur = piece
        else:
            cur = f"{cur} {piece}" if cur else piece
    if cur:
        lines.append(pad + cur)
    return lines
