"""Device-side primitives of TileLink as ``@triton.jit`` functions on stock Triton.

Four flavours with the same names and signatures, differing only in lowering:

* :mod:`tilelink.lang.nvidia` — CUDA (inline PTX where it pays: per-thread acquire loads in the
  spin, the token dependency, ``fence.proxy.async``);
* :mod:`tilelink.lang.nvshmem` — CUDA with NVSHMEM's device library: put/signal to other ranks
  through ``nvshmemx_putmem_block`` / ``nvshmem_int_atomic_set`` (the path that leaves the node);
* :mod:`tilelink.lang.amd` — ROCm / gfx942;
* :mod:`tilelink.lang.interp` — the Triton interpreter and the emulated world (no inline asm).

Generated kernels import one of them as ``tld``::

    from tilelink.lang import nvidia as tld

    tok = tld.wait(sig + slot, epoch, LIMIT, abort, diag, SITE, slot, me)
    offs = tld.consume_token(offs, tok)
    tld.fence_proxy_async(HOPPER=True)       # before TMA reads of peer-written data
    tile = tl.load(buf + offs)
    ...
    tld.push_tile(dst + offs, tile, None, peer, me, heap_bases)
    tld.notify(tld.symm_at(sig + slot, peer, me, heap_bases), epoch)

Public functions (all ``@triton.jit``; see :mod:`tilelink.lang.core` for the memory model):
``rank(me)``, ``num_ranks(world)``, ``symm_at(ptr, peer, me, heap_bases)``,
``notify(sig_ptr, value)``, ``notify_add(sig_ptr, value)``,
``wait(sig_ptr, expected, limit, abort_ptr, diag_ptr, site, slot, me)``,
``consume_token(value, token)``, ``push_tile(ptrs, values, mask, peer, me, heap_bases)``,
``pull_tile(ptrs, mask, peer, me, heap_bases, other=0)``, ``fence_proxy_async(HOPPER)``,
``clock()`` (nanoseconds, for kernels rendered with ``profile=1``).
"""

from . import amd, core, interp, nvidia, nvshmem
from .core import (
    ABORT_POLL_INTERVAL,
    DIAG_CAPACITY,
    DIAG_FIELDS,
    DIAG_HEADER,
    DIAG_LAYOUT,
    DIAG_WORDS,
    REASON_ABORTED,
    REASON_REFUSED,
    REASON_TIMEOUT,
)

#: the public primitives every flavour module defines, with these exact signatures
PRIMITIVES = (
    "rank", "num_ranks", "symm_at", "notify", "notify_add", "notify_peer", "wait", "wait_flat",
    "consume_token", "push_tile", "pull_tile", "put", "put_signal", "fence_proxy_async", "clock",
)

_BY_NAME = {m.FLAVOUR: m for m in (nvidia, nvshmem, amd, interp)}
#: the flavour of a target without a "+lowering" suffix, by backend
_DEFAULT_FLAVOUR = {"cuda": "nvidia", "hip": "amd", "interp": "interp"}


def flavour(name: str):
    """The flavour module called `name` (a Target's `lang`: nvidia, nvshmem, amd, interp)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"no tilelink.lang flavour {name!r}") from None


def module_for(target: str):
    """The flavour module for a target: ``"cuda"``/``"cuda:90"`` -> nvidia,
    ``"cuda:90+nvshmem"`` -> nvshmem, ``"hip"``/``"hip:gfx942"`` -> amd, ``"interp"`` ->
    interp."""
    name, _, lowering = target.partition("+")
    try:
        return flavour(lowering or _DEFAULT_FLAVOUR[name.partition(":")[0]])
    except (KeyError, ValueError):
        raise ValueError(f"no tilelink.lang flavour for target {target!r}") from None


def module_name(target: str) -> str:
    """Dotted name of :func:`module_for` (what generated source imports)."""
    return module_for(target).__name__


def decode_diag(diag) -> tuple[int, list[dict]]:
    """Host-side view of a diagnostic buffer (any int32 sequence of ``DIAG_WORDS`` words, e.g.
    ``tensor.tolist()``): ``(records counted, [record dict, ...])`` for the stored records."""
    words = [int(x) for x in diag]
    count = words[0]
    recs = []
    for i in range(min(count, DIAG_CAPACITY)):
        base = DIAG_HEADER + i * DIAG_FIELDS
        recs.append(dict(zip(DIAG_LAYOUT, words[base:base + DIAG_FIELDS])))
    return count, recs


__all__ = [
    "ABORT_POLL_INTERVAL", "DIAG_CAPACITY", "DIAG_FIELDS", "DIAG_HEADER", "DIAG_LAYOUT",
    "DIAG_WORDS", "PRIMITIVES", "REASON_ABORTED", "REASON_REFUSED", "REASON_TIMEOUT", "amd",
    "core", "decode_diag", "flavour", "interp", "module_for", "module_name", "nvidia", "nvshmem",
]
