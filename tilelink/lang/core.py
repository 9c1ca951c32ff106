"""Target-independent device primitives (stock Triton, no inline assembly).

Everything here lowers through ordinary Triton ops, so it runs in the Triton interpreter
(``TRITON_INTERPRET=1``) and compiles for every backend. The per-target modules
(:mod:`tilelink.lang.nvidia`, :mod:`tilelink.lang.amd`, :mod:`tilelink.lang.interp`) re-export
these and add the primitives whose lowering is target-specific (``consume_token``,
``fence_proxy_async``).

Memory model in one paragraph (it follows Triton-distributed's primitives):

* a *signal* is an int32 slot in symmetric memory; it only ever grows within one epoch scheme;
* the producer writes its data (plain stores, possibly to a peer through :func:`symm_at`), then
  calls :func:`notify`: a CTA barrier followed by a **release** store at **system** scope, so every
  write any thread of the CTA made before the call is visible to whoever acquires the signal;
* the consumer calls ``wait``: it spins with **acquire** loads at **system** scope until the slot
  is ``>= expected``; loads issued after the wait (and made data-dependent on its token with
  ``consume_token``) see the producer's data. Reads through the TMA / async proxy need
  ``fence_proxy_async`` in between on Hopper.

Symmetric heap: every rank maps a heap of the same layout; ``heap_bases`` is a device pointer to
an int64 array holding each rank's heap base address *as seen by this process* (peer heaps are
mapped into our address space: CUDA IPC / NVSHMEM / torch symmetric memory, or shared memory in
the emulated world). Bases must be 16-byte aligned (allocations always are).

Diagnostic buffer (``diag_ptr``, int32): ``diag[0]`` counts records; record ``i < DIAG_CAPACITY``
lives at ``diag[DIAG_HEADER + i * DIAG_FIELDS :][:DIAG_FIELDS]``; see :data:`DIAG_LAYOUT`.
"""

import triton
import triton.language as tl

#: int32 words before the first record in the diagnostic buffer (word 0 is the record count).
DIAG_HEADER = 8
#: int32 fields per record.
DIAG_FIELDS = 8
#: records stored; later ones are only counted in ``diag[0]``.
DIAG_CAPACITY = 64
#: int32 words a diagnostic buffer needs.
DIAG_WORDS = DIAG_HEADER + DIAG_CAPACITY * DIAG_FIELDS
#: names of a record's fields, in order.
DIAG_LAYOUT = ("rank", "program", "site", "slot", "expected", "observed", "iterations", "reason")
#: ``reason`` field: the wait ran past its iteration limit (this wait set the abort flag).
REASON_TIMEOUT = 1
#: ``reason`` field: the wait saw the abort flag set by someone else and gave up.
REASON_ABORTED = 2
#: ``reason`` field: not a wait: a check on the device refused an input (:func:`refuse`);
#: ``expected`` and ``observed`` are the site's own (e.g. a bound and how many broke it).
REASON_REFUSED = 3
#: the spin reads the abort flag once every this many iterations.
ABORT_POLL_INTERVAL = 256

#: int64 words of one profile row (``profile=1`` kernels, :func:`profile_event`)
PROFILE_FIELDS = 8
#: int64 words before the first profile row (word 0 counts the rows the kernels claimed)
PROFILE_HEADER = 8
#: names of a profile row's fields, in order (kind: 0 role, 1 item of its loop, 2 wait)
PROFILE_LAYOUT = ("epoch", "role", "program", "item", "kind", "site", "t_start", "t_end")

#: what every flavour module (nvidia, amd, interp) re-exports with ``from .core import *``:
#: the layout constants and the target-independent primitives
__all__ = [
    "ABORT_POLL_INTERVAL", "DIAG_CAPACITY", "DIAG_FIELDS", "DIAG_HEADER", "DIAG_LAYOUT",
    "DIAG_WORDS", "REASON_ABORTED", "REASON_REFUSED", "REASON_TIMEOUT",
    "add_token_zero", "fp8_bits", "fp8_value", "launch_options", "notify", "notify_add",
    "notify_peer", "num_ranks", "pull_tile", "push_tile", "put", "put_signal", "rank", "refuse",
    "symm_at", "wait", "wait_flat",
    "PROFILE_FIELDS", "PROFILE_HEADER", "PROFILE_LAYOUT", "profile_event",
]

def launch_options(arch=None) -> dict:
    """Extra keyword arguments for every launch of a kernel of this flavour (host side).

    None here; the NVSHMEM flavour links its device library through them.
    """
    return {}


# the same numbers as constexprs, for use inside @triton.jit code
_HDR = tl.constexpr(DIAG_HEADER)
_NF = tl.constexpr(DIAG_FIELDS)
_CAP = tl.constexpr(DIAG_CAPACITY)
_POLL = tl.constexpr(ABORT_POLL_INTERVAL)
_TIMEOUT = tl.constexpr(REASON_TIMEOUT)
_ABORTED = tl.constexpr(REASON_ABORTED)
_REFUSED = tl.constexpr(REASON_REFUSED)
_INT32_MAX = tl.constexpr(2**31 - 1)
_PH = tl.constexpr(PROFILE_HEADER)
_PF = tl.constexpr(PROFILE_FIELDS)


# ----------------------------------------------------------------------------------------------
# identity


@triton.jit
def rank(me):
    """This process's rank. A pass-through: kernels receive ``me`` as an argument.

    Kept for parity with Triton-distributed's ``dl.rank()`` so ported kernels read the same.
    """
    return me


@triton.jit
def num_ranks(world):
    """The number of ranks. A pass-through: kernels receive ``world`` as an argument.

    Kept for parity with Triton-distributed's ``dl.num_ranks()``.
    """
    return world


# ----------------------------------------------------------------------------------------------
# symmetric addressing


@triton.jit
def symm_at(ptr, peer, me, heap_bases):
    """The address of the same symmetric-heap object on rank ``peer``.

    ``ptr`` is a pointer (scalar or block) into *this* rank's heap; the result points at the
    same byte offset in rank ``peer``'s heap, as mapped in this process. ``peer`` may be a scalar
    or a block broadcastable against ``ptr``. ``symm_at(ptr, me, me, bases) == ptr``.

    Meaning: ``(ptr - heap_bases[me]) + heap_bases[peer]``. It is computed as ``ptr`` advanced by
    the (element-aligned) distance between the two heaps rather than through an integer round
    trip, so Triton keeps the pointer's contiguity/alignment facts and still vectorises the loads
    and stores that use the result. No memory ordering: it only computes an address (it loads
    two entries of ``heap_bases``).
    """
    # bytes per pointee (int1 is stored as a byte; no Triton type is wider than 8 bytes)
    ESIZE: tl.constexpr = (ptr.dtype.element_ty.primitive_bitwidth + 7) // 8
    DELTA_DIV: tl.constexpr = 16 // ESIZE
    base_me = tl.load(heap_bases + me)
    base_peer = tl.load(heap_bases + peer)
    delta = (base_peer - base_me) // ESIZE
    if len(delta.shape) == 0:
        # heap bases are 16-byte aligned, so the distance is a multiple of 16 bytes: tell the
        # compiler, or every access through the result is scalarised
        delta = tl.multiple_of(delta, DELTA_DIV)
    return ptr + delta


@triton.jit
def push_tile(ptrs, values, mask, peer, me, heap_bases):
    """Store a tile into rank ``peer``'s copy of a symmetric buffer.

    ``tl.store(symm_at(ptrs, peer, me, heap_bases), values, mask)``: plain (weak) stores; make
    them visible to the peer with :func:`notify` on a signal the peer waits for.
    ``mask`` may be ``None``.
    """
    tl.store(symm_at(ptrs, peer, me, heap_bases), values, mask=mask)


@triton.jit
def pull_tile(ptrs, mask, peer, me, heap_bases, other=0):
    """Load a tile from rank ``peer``'s copy of a symmetric buffer.

    ``tl.load(symm_at(ptrs, peer, me, heap_bases), mask, other)``: plain loads; only meaningful
    after a ``wait`` on the signal the peer set after writing the data (make ``ptrs`` depend on
    the wait's token with ``consume_token`` so the loads cannot be hoisted above the wait).
    ``mask`` may be ``None`` (then ``other`` is ignored).
    """
    src = symm_at(ptrs, peer, me, heap_bases)
    if mask is None:
        return tl.load(src)
    else:
        return tl.load(src, mask=mask, other=other)


# ----------------------------------------------------------------------------------------------
# signals


@triton.jit
def notify(sig_ptr, value):
    """Publish this CTA's prior writes, then set the int32 signal at ``sig_ptr`` to ``value``.

    Ordering: a CTA barrier (every thread's earlier global stores are ordered before the
    signal at CTA scope), then an atomic exchange with **release** semantics at **system**
    scope (cumulative, so those stores become visible to any thread, on any GPU or the host,
    that acquires the signal and sees ``value``). ``sig_ptr`` may point into a peer's heap
    (``symm_at``). Only the signal write is atomic; every thread of the CTA must call it.
    """
    tl.debug_barrier()
    tl.atomic_xchg(sig_ptr, value, sem="release", scope="sys")


@triton.jit
def notify_add(sig_ptr, value):
    """Like :func:`notify`, but atomically adds ``value`` to the int32 signal (for counters
    that several producers bump: the consumer waits for ``count * epoch`` or similar).

    Ordering: CTA barrier, then atomic add with **release** semantics at **system** scope.
    """
    tl.debug_barrier()
    tl.atomic_add(sig_ptr, value, sem="release", scope="sys")


@triton.jit
def notify_peer(sig_ptr, value, peer, me, heap_bases):
    """Set rank ``peer``'s copy of the int32 signal at ``sig_ptr`` (an address in *this*
    rank's heap) to ``value``, after every write this CTA made before the call.

    Here: ``notify(symm_at(sig_ptr, peer, me, heap_bases), value)`` (a store through the
    peer mapping). The NVSHMEM flavour lowers it to ``nvshmem_fence`` + an NVSHMEM atomic set,
    which also reaches ranks that are not mapped into this process (other nodes).
    """
    notify(symm_at(sig_ptr, peer, me, heap_bases), value)


@triton.jit
def put(dst_ptr, src_ptr, nelems, peer, me, heap_bases, BLOCK: tl.constexpr):
    """Copy ``nelems`` contiguous elements from ``src_ptr`` (any memory of this GPU) to rank
    ``peer``'s copy of ``dst_ptr`` (an address in *this* rank's heap). No signal: pair it with
    :func:`notify_peer`, or use :func:`put_signal`.

    Here: the CTA copies ``BLOCK`` elements at a time through :func:`symm_at` (plain loads and
    stores, vectorised; masked tail). The NVSHMEM flavour lowers it to
    ``nvshmemx_putmem_block``. Every thread of the CTA must call it.
    """
    remote = symm_at(dst_ptr, peer, me, heap_bases)
    for i in range(0, nelems, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        mask = offs < nelems
        tl.store(remote + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


@triton.jit
def put_signal(dst_ptr, src_ptr, nelems, sig_ptr, value, peer, me, heap_bases,
               BLOCK: tl.constexpr):
    """:func:`put`, then :func:`notify_peer` the int32 signal ``sig_ptr`` with ``value``: the
    consumer on ``peer`` that waits for ``value`` sees the data. Every thread of the CTA must
    call it."""
    put(dst_ptr, src_ptr, nelems, peer, me, heap_bases, BLOCK)
    notify_peer(sig_ptr, value, peer, me, heap_bases)


@triton.jit
def load_acquire_atomic(sig_ptr):
    """Read the int32 at ``sig_ptr`` with **acquire** semantics at **system** scope.

    Lowered as an atomic add of 0 (one thread issues it; the value is broadcast to the CTA),
    which every backend and the interpreter support.
    """
    return tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")


@triton.jit
def _spin(sig_ptr, expected, limit, abort_ptr):
    # The bounded spin; returns (observed, iterations). Every read is an acquire atomic that
    # Triton lowers to one thread's load (ld.acquire.sys / global_load sc0 sc1 + buffer_inv)
    # broadcast to the CTA, so the whole CTA leaves the loop together and the values are
    # uniform. (load_acquire_atomic is spelled out inline: in the interpreter every nested
    # jit call costs ~0.2 ms, which would dominate the spin.)
    obs = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
    # zeros derived from `obs` rather than tl.full((), ...): the same scalars in every
    # flavour, and Gluon kernels (whose `full` needs a layout) can call this too
    aborted = obs * 0
    it = aborted.to(tl.int64)
    # cyclic comparison (int32 wrap-around): epochs keep counting past 2**31 - 1
    go = (obs - expected) < 0
    while go:
        # the abort flag, once every _POLL iterations starting with the first; an atomic
        # read, because a plain (even volatile) load may be served from a non-coherent cache
        # on AMD and never see the flag change
        if (it % _POLL) == 0:
            aborted = tl.atomic_add(abort_ptr, 0, sem="acquire", scope="sys")
        it += 1
        obs = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
        go = ((obs - expected) < 0) & (aborted == 0) & (it <= limit)
    return obs, it


@triton.jit
def _write_record(diag_ptr, me, site, slot, expected, observed, iterations, reason):
    # Claim the next diagnostic record (later ones past DIAG_CAPACITY are only counted) and
    # fill its fields in DIAG_LAYOUT's order.
    idx = tl.atomic_add(diag_ptr, 1, sem="relaxed", scope="sys")
    if idx < _CAP:
        rec = diag_ptr + _HDR + idx * _NF
        tl.store(rec + 0, tl.cast(me, tl.int32))
        tl.store(rec + 1, tl.program_id(0))
        tl.store(rec + 2, tl.cast(site, tl.int32))
        tl.store(rec + 3, tl.cast(slot, tl.int32))
        tl.store(rec + 4, tl.cast(expected, tl.int32))
        tl.store(rec + 5, tl.cast(observed, tl.int32))
        tl.store(rec + 6, tl.cast(iterations, tl.int32))
        tl.store(rec + 7, tl.cast(reason, tl.int32))


@triton.jit
def _record_giveup(obs, it, expected, abort_ptr, diag_ptr, site, slot, me):
    # Called with CTA-uniform obs < expected. One diagnostic record; on a timeout (abort flag
    # still clear) raise the abort flag so every other wait polling it stops.
    aborted = load_acquire_atomic(abort_ptr)
    _write_record(diag_ptr, me, site, slot, expected, obs, tl.minimum(it, _INT32_MAX),
                  tl.where(aborted != 0, _ABORTED, _TIMEOUT))
    if aborted == 0:
        # release: the record is written before anyone can see the flag
        tl.atomic_xchg(abort_ptr, 1, sem="release", scope="sys")


@triton.jit
def refuse(abort_ptr, diag_ptr, site, slot, expected, observed, me):
    """Report that a check on the device refused an input, then raise the abort flag.

    One diagnostic record with reason ``REASON_REFUSED`` (``site``: the check, described by
    the module's wait-site table; ``slot``, ``expected``, ``observed``: what the check says
    of it, e.g. a bound and how many values broke it), written before the flag is raised
    (release, system scope), so every wait of this launch polling the flag gives up at once
    instead of waiting for data the refused input will never produce; the host raises a
    RuntimeCheckError naming the check. Call it from one program (scalar arguments)."""
    _write_record(diag_ptr, me, site, slot, expected, observed, 0, _REFUSED)
    tl.atomic_xchg(abort_ptr, 1, sem="release", scope="sys")


@triton.jit
def wait(sig_ptr, expected, limit, abort_ptr, diag_ptr, site, slot, me):
    """Spin until the int32 signal at ``sig_ptr`` is ``>= expected``; return what was observed.

    ``>=`` is cyclic, as CUDA's stream waits compare: ``(int32)(observed - expected) >= 0``, so
    epochs may wrap around 2**31 (producers and consumers stay less than 2**31 apart).

    Ordering: every read of the signal is an **acquire** at **system** scope, and the CTA
    leaves through a barrier, so every load the CTA issues after ``wait`` returns (at least
    those made dependent on the token with ``consume_token``) sees every write the producer
    made before its ``notify``. Every thread of the CTA must call it (it contains barriers).

    Bounded: the spin also reads the int32 flag at ``abort_ptr`` every 256 iterations
    (non-zero: stop) and gives up after ``limit`` iterations (int64 counter). On giving up it
    appends one diagnostic record ``[me, program_id(0), site, slot, expected, observed,
    iterations, reason]`` to ``diag_ptr`` (``diag[0]`` counts records, 64 are kept; reason
    1 = timed out, 2 = saw the abort flag; iterations clamped to int32) and, on a timeout,
    sets ``abort_ptr`` to 1 (release, system scope) so every other wait polling that flag
    stops at its next poll (all ranks, if the runtime gives them one shared flag). A flag the
    host set is never overwritten. ``site``/``slot`` are
    caller-chosen integers naming the wait in that record.

    Returns the observed value (int32 scalar; ``>= expected`` unless it gave up): the *token*
    for ``consume_token``. What a give-up means is the caller's choice (usually: skip the
    work; the host turns the record into an error naming the wait).
    """
    obs, it = _spin(sig_ptr, expected, limit, abort_ptr)
    if (obs - expected) < 0:
        _record_giveup(obs, it, expected, abort_ptr, diag_ptr, site, slot, me)
    tl.debug_barrier()
    return obs


@triton.jit
def wait_flat(sig_ptr, count, expected, limit, abort_ptr, diag_ptr, site, slot, me):
    """:func:`wait` on ``count`` consecutive int32 signals: spin until every one of
    ``sig_ptr[0:count]`` is ``>= expected`` (cyclic int32 compare, as in :func:`wait`).

    This is the shared lowering (AMD, the interpreter): an ``scf.while`` loop, so it is *not*
    loop-free here; :func:`tilelink.lang.nvidia.wait_flat` is the loop-free one (one inline-PTX
    op). Every flavour has the same semantics, which for ``count == 1`` are exactly
    :func:`wait`'s:

    * the words are waited for in order, each with **acquire** loads at **system** scope (a
      word that is already set costs one load); the CTA leaves through a barrier, so loads made
      dependent on the token with ``consume_token`` see what the producers wrote before their
      ``notify``. Every thread of the CTA must call it;
    * one iteration counter (int64) for the whole call, not per word: a re-read of an unset
      word is one iteration, ``limit`` bounds the total; the int32 abort flag at ``abort_ptr``
      is read when the counter is a multiple of 256 (``ABORT_POLL_INTERVAL``; so at once when
      the first unset word is met) and a non-zero flag stops the spin;
    * on giving up (on word ``i``) it stops at that word (later words are not read) and
      appends ONE diagnostic record like :func:`wait`'s, with ``slot + i`` in the slot field
      (pass the first word's slot number), ``observed`` = word ``i``'s last value,
      ``iterations`` = the shared counter; on a timeout it raises the abort flag.

    Returns the token (int32): the value observed on the word that gave up (``< expected``,
    cyclically), or the last word's value when every word was set (``>= expected``); with
    ``count <= 0`` nothing is read and ``expected`` is returned.
    """
    exp = tl.cast(expected, tl.int32)
    n = tl.cast(count, tl.int32)
    obs = exp
    if n > 0:
        obs = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
    i = tl.full((), 0, tl.int32)
    # zeros derived from `obs` rather than tl.full((), ...): the same scalars in every
    # flavour, and Gluon kernels (whose `full` needs a layout) can call this too
    aborted = obs * 0
    it = aborted.to(tl.int64)
    # one loop for all words; the CTA stays together (every value is an acquire atomic that
    # Triton broadcasts from one thread), see _spin
    go = i < n
    while go:
        if (obs - exp) >= 0:
            # word i is set: on to the next one (obs keeps the last word's value at the end)
            i += 1
            if i < n:
                obs = tl.atomic_add(sig_ptr + i, 0, sem="acquire", scope="sys")
            go = i < n
        else:
            if (it % _POLL) == 0:
                aborted = tl.atomic_add(abort_ptr, 0, sem="acquire", scope="sys")
            it += 1
            obs = tl.atomic_add(sig_ptr + i, 0, sem="acquire", scope="sys")
            go = ((obs - exp) >= 0) | ((aborted == 0) & (it <= limit))
    if (obs - exp) < 0:
        _record_giveup(obs, it, exp, abort_ptr, diag_ptr, site, slot + i, me)
    tl.debug_barrier()
    return obs


@triton.jit
def add_token_zero(value, zero):
    """``value + zero`` in ``value``'s type (``zero`` is an opaque int32 0 that depends on a
    wait token). Pointers stay pointers; integer tensors keep their dtype."""
    if value.dtype.is_ptr():
        return value + zero
    else:
        return (value + zero).to(value.dtype)


# ----------------------------------------------------------------------------------------------
# profiling (kernels rendered with profile=1 only)


@triton.jit
def profile_event(prof_ptr, rows, epoch, role, program, item, kind, site, t_start, t_end):
    """Append one row to the profile buffer ``prof_ptr`` (int64, see :data:`PROFILE_LAYOUT`).

    ``prof_ptr[0]`` counts claimed rows (one relaxed atomic per event: events of all the
    programs of every kernel of a rank land in one buffer, in no particular order); a row
    past ``rows`` is only counted, so the host can tell that the buffer was too small.
    Times are whatever the flavour's ``clock`` returns (nanoseconds).
    """
    row = tl.atomic_add(prof_ptr, 1, sem="relaxed", scope="gpu")
    if row < rows:
        base = prof_ptr + _PH + row * _PF
        tl.store(base + 0, tl.cast(epoch, tl.int64))
        tl.store(base + 1, tl.cast(role, tl.int64))
        tl.store(base + 2, tl.cast(program, tl.int64))
        tl.store(base + 3, tl.cast(item, tl.int64))
        tl.store(base + 4, tl.cast(kind, tl.int64))
        tl.store(base + 5, tl.cast(site, tl.int64))
        tl.store(base + 6, tl.cast(t_start, tl.int64))
        tl.store(base + 7, tl.cast(t_end, tl.int64))


@triton.jit
def fp8_bits(v):
    """The fp8 e4m3 (``float8_e4m3fn``) byte of ``v`` (fp32, |v| <= 448, its largest finite
    value; NaN gives NaN's byte), rounded to nearest even as the GPUs' conversion rounds, as
    an int32 0..255.

    Integer arithmetic on the fp32 pattern, so it runs alike on every target (cuda:80 has no
    e4m3 type) and in the interpreter (whose Triton 3.6 conversion halves a value whose
    rounding carries into the next binade). Normal values (|v| >= 2**-6) keep 3 mantissa
    bits: round to nearest even at bit 20 (a carry moves into the exponent), then re-bias
    the exponent (127 -> 7). Smaller values are fp8's subnormals, multiples of 2**-9: adding
    and taking away 1.5 * 2**14 rounds them so in fp32."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    up = mag + 0x7FFFF + ((mag >> 20) & 1)
    normal = (((up >> 23) - 120) << 3) | ((up >> 20) & 7)
    # (only the lanes below 2**-6 take this path: others, NaN among them, add a zero)
    tiny = ((tl.where(mag < 0x3C800000, tl.abs(v), 0.0) + 24576.0) - 24576.0) * 512.0
    byte = tl.where(mag < 0x3C800000, tiny.to(tl.int32), normal)
    return sign | tl.where(mag > 0x7F800000, 0x7F, byte)


@triton.jit
def fp8_value(b):
    """The fp32 value of fp8 e4m3 byte ``b`` (any int holding 0..255): exact (NaN's bytes,
    0x7F and 0xFF, give NaN)."""
    b = b.to(tl.int32) & 0xFF
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    mag = tl.where((b & 0x7F) == 0x7F, float("nan"), mag)
    return tl.where(b >= 128, -mag, mag)
