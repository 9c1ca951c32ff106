"""CUDA stream memory operations: wait for / write a 32-bit word in stream order.

The copy engine's signals must be stream memory operations, not kernels: a kernel queued
behind a persistent kernel that fills every SM never runs (docs/design.md, hang 1). These call
the driver's cuStreamWaitValue32 / cuStreamWriteValue32 through ctypes, so no extra
package is needed.

- wait: the stream stalls until `(int32)(*addr - value) >= 0` (cyclic >=, the same
  comparison `tilelink.lang.wait` uses, so epochs may wrap around).
- write: `*addr = value`, preceded by a memory barrier (the driver's default), so every
  copy earlier on the stream is visible before the signal is.
- copy: cuMemcpyAsync of raw device addresses (peer addresses included: unified addressing),
  the copy engine's transfer without torch's per-call dispatch (a few us per op).
- record_event / wait_event: cuEventRecord / cuStreamWaitEvent on raw handles, for the
  op's per-call stream fork and join (through torch each costs a Python Stream object or
  wrapper; small shapes are host-bound, docs/perf.md).

Every function takes the stream as a torch.cuda.Stream or as its raw handle (an int, e.g.
`stream.cuda_stream` read once): the copy engine's hot path passes the handle.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

from ..errors import TileLinkError

CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0


@lru_cache(maxsize=1)
def _driver():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise TileLinkError(f"cannot load the CUDA driver (libcuda.so.1): {e}") from None
    fns = {}
    copy = getattr(lib, "cuMemcpyAsync", None)
    if copy is None:
        raise TileLinkError("the CUDA driver has no cuMemcpyAsync")
    copy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    copy.restype = ctypes.c_int
    fns["cuMemcpyAsync"] = copy
    for name, args in (("cuEventRecord", [ctypes.c_void_p, ctypes.c_void_p]),
                       ("cuStreamWaitEvent", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint])):
        f = getattr(lib, name, None)
        if f is None:
            raise TileLinkError(f"the CUDA driver has no {name}")
        f.argtypes, f.restype = args, ctypes.c_int
        fns[name] = f
    for name in ("cuStreamWaitValue32", "cuStreamWriteValue32"):
        for sym in (f"{name}_v2", name):
            f = getattr(lib, sym, None)
            if f is not None:
                f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
                f.restype = ctypes.c_int
                fns[name] = f
                break
        else:
            raise TileLinkError(f"the CUDA driver has no {name}")
    return fns


def _check(code: int, what: str) -> None:
    if code != 0:
        raise TileLinkError(f"{what} failed with CUDA driver error {code}")


def _u32(value: int) -> int:
    return value & 0xFFFFFFFF


def _handle(stream) -> int:
    return stream if isinstance(stream, int) else stream.cuda_stream


def wait_value32(stream, address: int, value: int) -> None:
    """Enqueue on `stream`: wait until the word at `address` >= value (cyclic)."""
    code = _driver()["cuStreamWaitValue32"](_handle(stream), address, _u32(value),
                                            CU_STREAM_WAIT_VALUE_GEQ)
    _check(code, "cuStreamWaitValue32")


def write_value32(stream, address: int, value: int) -> None:
    """Enqueue on `stream`: write `value` to the word at `address` (after earlier work)."""
    code = _driver()["cuStreamWriteValue32"](_handle(stream), address, _u32(value),
                                             CU_STREAM_WRITE_VALUE_DEFAULT)
    _check(code, "cuStreamWriteValue32")


def copy_async(stream, dst: int, src: int, nbytes: int) -> None:
    """Enqueue on `stream`: copy `nbytes` from device address `src` to `dst` (either may be
    a peer GPU's memory mapped into this process; the copy engine moves it)."""
    code = _driver()["cuMemcpyAsync"](dst, src, nbytes, _handle(stream))
    _check(code, "cuMemcpyAsync")


def event_handle(event, stream=None) -> int:
    """The driver handle (CUevent) of torch.cuda.Event `event`. torch creates the CUDA event
    at its first record: an event never recorded is recorded once first, on torch.cuda.Stream
    `stream` (default: the current stream)."""
    if not event.cuda_event:
        event.record(stream)
    return event.cuda_event


def record_event(stream, event: int) -> None:
    """Enqueue on `stream`: record the event with raw handle `event` (see event_handle)."""
    _check(_driver()["cuEventRecord"](event, _handle(stream)), "cuEventRecord")


def wait_event(stream, event: int) -> None:
    """Enqueue on `stream`: wait for the last record of the event with raw handle `event`."""
    _check(_driver()["cuStreamWaitEvent"](_handle(stream), event, 0), "cuStreamWaitEvent")
