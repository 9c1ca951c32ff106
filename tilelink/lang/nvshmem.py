"""Device primitives lowered to NVSHMEM's device library (``libnvshmem_device.bc``) on NVIDIA
GPUs. Generated kernels use it as ``from tilelink.lang import nvshmem as tld`` when the runtime's
symmetric heap is NVSHMEM's (``backend="nvshmem"``).

Same names and signatures as :mod:`tilelink.lang.nvidia`, which it extends; what changes is
how data and signals reach another rank:

* :func:`put` is ``nvshmemx_putmem_block`` (the CTA moves a contiguous range into the peer's
  copy of a symmetric buffer); :func:`put_signal` is that, then :func:`notify_peer`;
* :func:`notify_peer` is a CTA barrier, then one thread's ``nvshmem_fence`` and
  ``nvshmem_int_atomic_set`` on the peer's signal word.

NVSHMEM picks the transport per peer (NVLink stores between GPUs of a node, the proxy or
IBGDA across nodes), so these two are the calls that can reach ranks not mapped into this
process. Waits stay acquire loads of *local* signal words, and :func:`symm_at` (used by
``push_tile`` / ``pull_tile``) stays a peer-pointer computation.

What is intra-node only today, even with this flavour: the runtime's heap maps every peer
(`SymmetricHeap` takes each rank's pointer), GEMM-RS stores register tiles straight into a peer
in its epilogue, the SM all_to_all's push stores the rows it gathers through an index (EP
dispatch from `group_by_dest`) through `symm_at`, the copy engine copies between mapped
buffers, and AG's source rows (the
user's input) are not registered with NVSHMEM (``nvshmemx_buffer_register``), which a network
transport would need. PEs are global ranks: the runtime refuses process groups whose rank r
is not global rank r.

Linking: the kernel is compiled with ``extern_libs={"libnvshmem_device": <bitcode>}``
(:func:`launch_options`), and every CUDA module that contains NVSHMEM device code must be
registered with the NVSHMEM runtime (``nvshmemx_cumodule_init``) before its first launch; the
GPU runtime does both. The bitcode must be readable by Triton's LLVM: NVSHMEM 3.4 is; the
per-architecture bitcode of NVSHMEM 3.8 (``libnvshmem_device_sm_90.bc``, LLVM 22) is not
readable by Triton 3.6 (see :func:`device_library`).
"""

import glob
import os
import stat

import triton
import triton.language as tl
from triton.language import core as tlc

from ..env import EnvError
from .nvidia import *  # noqa: F403  (core.__all__)
from .nvidia import consume_token, fence_proxy_async  # noqa: F401  (the inline-PTX lowerings)

#: the lowering this module stands for (``tilelink.lang.module_for`` maps targets to modules)
FLAVOUR = "nvshmem"

#: the name Triton links the bitcode under (``extern_libs`` key)
LIBRARY = "libnvshmem_device"


# ---- extern declarations (pointers travel as int64, as in torch's NVSHMEM Triton bindings) ----


@tlc.extern
def _putmem_block(dest, source, nbytes, pe, _semantic=None):
    return tlc.extern_elementwise(
        "", "", [dest, source, nbytes, pe],
        {(tlc.dtype("int64"), tlc.dtype("int64"), tlc.dtype("int64"), tlc.dtype("int32")):
         ("nvshmemx_putmem_block", tlc.dtype("int32"))},
        is_pure=False, _semantic=_semantic)


@tlc.extern
def _fence(_semantic=None):
    return tlc.extern_elementwise("", "", [], {(): ("nvshmem_fence", tlc.dtype("int32"))},
                                  is_pure=False, _semantic=_semantic)


@tlc.extern
def _int_atomic_set(dest, value, pe, _semantic=None):
    return tlc.extern_elementwise(
        "", "", [dest, value, pe],
        {(tlc.dtype("int64"), tlc.dtype("int32"), tlc.dtype("int32")):
         ("nvshmem_int_atomic_set", tlc.dtype("int32"))},
        is_pure=False, _semantic=_semantic)


@triton.jit
def _thread_index():
    # this thread's index in the CTA (x); per thread, unlike every other scalar in Triton
    return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r", [], dtype=tl.int32,
                                     is_pure=True, pack=1)


# ---- primitives -------------------------------------------------------------------------------


@triton.jit
def notify_peer(sig_ptr, value, peer, me, heap_bases):
    """Set rank ``peer``'s copy of the int32 signal at ``sig_ptr`` (an address in this rank's
    NVSHMEM heap) to ``value``, after every write this CTA made before the call.

    A CTA barrier, then thread 0 alone: ``nvshmem_fence()`` (orders this PE's earlier puts and
    stores to ``peer`` before what follows; cumulative over the CTA's writes through the
    barrier) and ``nvshmem_int_atomic_set``. One atomic per call rather than one per thread,
    which matters when the transport is a network. ``me``/``heap_bases`` are unused (same
    signature as :func:`tilelink.lang.core.notify_peer`).
    """
    tl.debug_barrier()
    if _thread_index() == 0:
        _fence()
        _int_atomic_set(sig_ptr.to(tl.int64), value, peer)


@triton.jit
def put(dst_ptr, src_ptr, nelems, peer, me, heap_bases, BLOCK: tl.constexpr):
    """Copy ``nelems`` contiguous elements from ``src_ptr`` to rank ``peer``'s copy of the
    symmetric address ``dst_ptr``: ``nvshmemx_putmem_block``.

    Every thread of the CTA calls it; it returns once the source may be reused (delivery is
    ordered by the fence in :func:`notify_peer`). ``src_ptr`` may be any device memory for
    peers reached over NVLink; across nodes NVSHMEM needs it inside the heap or registered
    (``nvshmemx_buffer_register``). ``me``, ``heap_bases`` and ``BLOCK`` are unused (same
    signature as :func:`tilelink.lang.core.put`).
    """
    ESIZE: tl.constexpr = (dst_ptr.dtype.element_ty.primitive_bitwidth + 7) // 8
    _putmem_block(dst_ptr.to(tl.int64), src_ptr.to(tl.int64), nelems.to(tl.int64) * ESIZE,
                  peer)


@triton.jit
def put_signal(dst_ptr, src_ptr, nelems, sig_ptr, value, peer, me, heap_bases,
               BLOCK: tl.constexpr):
    """:func:`put`, then :func:`notify_peer`: NVSHMEM's put-with-signal, with an int32 signal
    word (NVSHMEM's own ``putmem_signal`` writes 64-bit signals)."""
    put(dst_ptr, src_ptr, nelems, peer, me, heap_bases, BLOCK)
    notify_peer(sig_ptr, value, peer, me, heap_bases)


# ---- host side: finding and linking the device library ----------------------------------------


class BitcodeError(EnvError, FileNotFoundError):
    """NVSHMEM's device bitcode cannot be found or is not LLVM bitcode (says where it looked
    and what to do). Also a FileNotFoundError, for callers that look for it optionally."""

    kind = "environment error"


# LLVM bitcode starts with 'BC' 0xC0DE, or with the wrapper magic 0x0B17C0DE (little endian)
_BITCODE_MAGIC = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")
_INSTALL = ("install nvidia-nvshmem-cu13==3.4.5 (its bitcode links with Triton 3.6), or point "
            "TILELINK_NVSHMEM_BC at a libnvshmem_device.bc")


def _installed_wheel_dirs() -> list[str]:
    """The lib directories of the installed nvidia-nvshmem-cu* wheels, found through their
    metadata in the interpreter's own site-packages only: never through `sys.path`, which
    holds the current directory under `python -m` or `python -c` (a directory planted there
    must not supply code linked into every kernel)."""
    import importlib.metadata
    import site
    import sysconfig

    roots = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
    roots += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        roots.append(site.getusersitepackages())
    roots = list(dict.fromkeys(os.path.realpath(r) for r in roots if os.path.isabs(r)))
    dirs = []
    for dist in importlib.metadata.distributions(path=roots):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("nvidia-nvshmem"):
            d = str(dist.locate_file(os.path.join("nvidia", "nvshmem", "lib")))
            if os.path.isdir(d) and d not in dirs:
                dirs.append(d)
    return dirs


def _candidate_dirs() -> list[str]:
    dirs = []
    if os.environ.get("NVSHMEM_LIB_DIR"):
        dirs.append(os.environ["NVSHMEM_LIB_DIR"])
    dirs += [d for d in _installed_wheel_dirs() if d not in dirs]
    dirs += ["/usr/local/lib", "/usr/lib", "/opt/nvidia/nvshmem/lib"]
    return dirs


def _check_bitcode(path: str, source: str) -> str:
    """`path` if it is a readable regular file holding LLVM bitcode, else a BitcodeError
    naming `source` (where the path came from)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO: no wait
    except FileNotFoundError:
        raise BitcodeError(f"{source}: {path} does not exist", hint=_INSTALL) from None
    except OSError as e:
        raise BitcodeError(f"{source}: cannot read {path} ({e.strerror or e})",
                           hint=_INSTALL) from None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        magic = os.read(fd, 4) if regular else b""
    except OSError as e:
        raise BitcodeError(f"{source}: cannot read {path} ({e.strerror or e})",
                           hint=_INSTALL) from None
    finally:
        os.close(fd)
    if not regular:
        raise BitcodeError(f"{source}: {path} is not a regular file", hint=_INSTALL)
    if magic not in _BITCODE_MAGIC:
        raise BitcodeError(f"{source}: {path} is not LLVM bitcode (it does not start with "
                           "the bitcode magic)", hint=_INSTALL)
    return path


def device_library(arch: int | None = None) -> str:
    """Path of NVSHMEM's device bitcode: ``$TILELINK_NVSHMEM_BC`` if set, else
    ``libnvshmem_device.bc`` (NVSHMEM <= 3.7), else ``libnvshmem_device_sm_<arch>.bc`` (3.8 has
    one per architecture), searched in ``$NVSHMEM_LIB_DIR``, the installed nvidia-nvshmem
    wheel's lib directory and the system's. Raises BitcodeError (an EnvError) naming where it
    looked, or the file that is not bitcode."""
    explicit = os.environ.get("TILELINK_NVSHMEM_BC")
    if explicit:
        return _check_bitcode(explicit, f"TILELINK_NVSHMEM_BC={explicit}")
    dirs = _candidate_dirs()
    names = ["libnvshmem_device.bc"] + ([f"libnvshmem_device_sm_{arch}.bc"] if arch else [])
    for d in dirs:
        for name in names:
            path = os.path.join(d, name)
            if os.path.exists(path):
                return _check_bitcode(path, "NVSHMEM's device bitcode")
    found = sorted(glob.glob(os.path.join(dirs[0], "libnvshmem_device*.bc"))) if dirs else []
    raise BitcodeError(
        f"NVSHMEM device bitcode ({' or '.join(names)}) not found in: {', '.join(dirs)}"
        + (f"; found {', '.join(found)}" if found else ""), hint=_INSTALL)


_OPTIONS: dict = {}  # arch -> launch options
_ARCH_OF_DEVICE: dict = {}  # CUDA device index -> arch (launches ask once per device)


def launch_options(arch: int | None = None) -> dict:
    """Keyword arguments every launch of a kernel of this flavour adds: the device library to
    link (Triton keys its kernel cache on them, so warm-up and calls must pass the same).
    `arch` defaults to the current CUDA device's, looked up once per device."""
    if arch is None:
        import torch

        device = torch.cuda.current_device()
        if device not in _ARCH_OF_DEVICE:
            major, minor = torch.cuda.get_device_capability(device)
            _ARCH_OF_DEVICE[device] = major * 10 + minor
        arch = _ARCH_OF_DEVICE[device]
    if arch not in _OPTIONS:
        _OPTIONS[arch] = {"extern_libs": {LIBRARY: device_library(arch)}}
    return _OPTIONS[arch]
