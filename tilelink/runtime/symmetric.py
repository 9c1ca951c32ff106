"""Symmetric heaps on GPUs: one allocation per rank, same layout everywhere, peers mapped.

A generated module declares its symmetric buffers (`SYMMETRIC`: name -> (shape, dtype)).
`SymmetricHeap` lays them out at identical offsets inside one symmetric allocation per rank,
so `symm_at(ptr, peer)` = `ptr - base[me] + base[peer]` holds for every buffer, and exposes:

- `tensors[name]`: this rank's buffer;
- `peers[rank][name]`: every rank's buffer as mapped into this process (the copy engine's
  destinations and the host's view of remote signals);
- `heap_bases`: int64 device tensor of every rank's heap base in this address space (what
  kernels pass to `symm_at`).

Backends, behind that one interface:
- "torch": torch symmetric memory's CUDA backend (intra-node peer pointers over NVLink);
- "nvshmem": torch symmetric memory's NVSHMEM backend (allocation in the NVSHMEM heap). The
  kernel is rendered with the NVSHMEM flavour of `tilelink.lang` (device-side put/signal from
  NVSHMEM's device library; see `tilelink.runtime.nvshmem_device`);
- "nvshmem-ptr": the same NVSHMEM heap, reached through peer pointers like "torch" (the
  generated kernel is the plain CUDA one; intra-node only).

`DeviceHeaps` is the same interface for W ranks in ONE process on one device (the one-GPU
world, `runtime/one_gpu.py`): torch symmetric memory refuses two ranks on one device, so each
rank's heap is one plain allocation there, laid out by the same `layout`.
"""

from __future__ import annotations

from ..errors import ConfigError
from .reference import TORCH_DTYPES

ALIGN = 256  # every buffer starts 256-byte aligned (TMA needs 16, vector loads 16)
BACKENDS = ("torch", "nvshmem", "nvshmem-ptr")
_TORCH_NAMES = {"torch": "CUDA", "nvshmem": "NVSHMEM", "nvshmem-ptr": "NVSHMEM"}


def _nbytes(shape, dtype: str) -> int:
    import torch

    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=TORCH_DTYPES[dtype]).element_size()


def layout(symmetric: dict) -> tuple[dict[str, int], int]:
    """Byte offset of each buffer in the heap, and the heap size (both ALIGN-aligned)."""
    offsets, total = {}, 0
    for name, (shape, dtype) in symmetric.items():
        offsets[name] = total
        total += -(-_nbytes(shape, dtype) // ALIGN) * ALIGN
    return offsets, max(total, ALIGN)


def buffer_view(whole, offset: int, shape, dtype: str):
    """The buffer of `shape` and `dtype` at byte `offset` of the uint8 heap tensor `whole`."""
    return whole[offset:offset + _nbytes(shape, dtype)].view(TORCH_DTYPES[dtype]).view(shape)


def group_name(group) -> str:
    """The name torch's symmetric-memory calls know process group `group` by (None: the
    default group)."""
    import torch.distributed as dist

    return (group or dist.group.WORLD).group_name


def enable_symm_mem(group) -> None:
    """Register the group for symmetric memory where this torch still needs it.

    torch <= 2.10 needs `enable_symm_mem_for_group(name)` before the fused ops or
    `rendezvous`; later versions deprecate it (a no-op need). Calling it is harmless.
    """
    import warnings

    import torch.distributed._symmetric_memory as symm

    fn = getattr(symm, "enable_symm_mem_for_group", None)
    if fn is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            fn(group_name(group))


def reserve_workspace(group, nbytes: int) -> None:
    """Grow the group's symmetric-memory workspace to `nbytes` now (a collective call: its
    rendezvous). torch's fused ops take their workspace on first use, which fails inside a
    CUDA-graph capture (the workspace cannot grow there): an op preparing such a call
    reserves what the call will ask for. Without CUDA there is nothing to reserve (the fused
    ops run on GPUs only, and refuse other devices when called)."""
    import torch
    import torch.distributed._symmetric_memory as symm

    if torch.cuda.is_available():
        symm.get_symm_mem_workspace(group_name(group), min_size=int(nbytes))


def select_backend(name: str) -> None:
    """Make `name` torch's symmetric-memory backend for this process (before any allocation)."""
    import torch.distributed._symmetric_memory as symm

    if name not in BACKENDS:
        raise ConfigError(f"unknown symmetric-memory backend '{name}'",
                          hint="backends: " + ", ".join(BACKENDS))
    if _TORCH_NAMES[name] == "NVSHMEM" and not symm.is_nvshmem_available():
        raise ConfigError("the NVSHMEM backend is not available in this torch build",
                          hint="install nvidia-nvshmem-cu13, or use backend 'torch'")
    try:
        symm.set_backend(_TORCH_NAMES[name])
    except Exception as e:  # torch refuses a switch after its first allocation
        current = symm.get_backend("cuda")
        if current != _TORCH_NAMES[name]:
            raise ConfigError(f"cannot switch symmetric memory to {name}: {e}",
                              hint="choose one backend per process") from None


class SymmetricHeap:
    """Every buffer of a generated module, symmetric across the ranks of `group`."""

    def __init__(self, symmetric: dict, group, backend: str = "torch"):
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm

        select_backend(backend)
        self.backend = backend
        self.offsets, self.nbytes = layout(symmetric)
        device = torch.device("cuda", torch.cuda.current_device())
        self.raw = symm.empty(self.nbytes, dtype=torch.uint8, device=device)
        group = group or dist.group.WORLD
        self.group = group
        self.handle = symm.rendezvous(self.raw, group.group_name)
        self.rank, self.world = self.handle.rank, self.handle.world_size
        ptrs = list(self.handle.buffer_ptrs)
        if any(p % 16 for p in ptrs):
            raise ConfigError("symmetric heap bases are not 16-byte aligned (symm_at needs it)")
        self.heap_bases = torch.tensor(ptrs, dtype=torch.int64, device=device)
        self.peers = []
        for r in range(self.world):
            whole = (self.raw if r == self.rank else
                     self.handle.get_buffer(r, (self.nbytes,), torch.uint8, 0))
            self.peers.append({name: self._view(whole, name, shape, dtype)
                               for name, (shape, dtype) in symmetric.items()})
        self.tensors = self.peers[self.rank]

    def _view(self, whole, name, shape, dtype):
        return buffer_view(whole, self.offsets[name], shape, dtype)

    def barrier(self) -> None:
        """A host barrier among the heap's ranks after this rank's GPU work is done (setup
        only: calls never need one). NCCL's barrier, with its timeout, rather than the
        symmetric-memory barrier kernel, which would spin on the GPU if a peer never came."""
        import torch
        import torch.distributed as dist

        torch.cuda.synchronize()
        dist.barrier(group=self.group)


class DeviceHeaps:
    """The symmetric heaps of `world` ranks that share one device (one process).

    Each rank's heap is one plain allocation (`torch.empty`, trimmed to an ALIGN-aligned
    start), its buffers at the offsets `layout` gives, so `symm_at(ptr, peer)` =
    `ptr - bases[me] + bases[peer]` finds a peer's buffer as it does in a real symmetric
    heap. `heaps[r]` is rank r's view, with `SymmetricHeap`'s interface.
    """

    def __init__(self, symmetric: dict, world: int, device):
        import torch

        self.offsets, self.nbytes = layout(symmetric)
        self.raw, wholes = [], []
        for _ in range(world):
            # ALIGN bytes of slack: the start is aligned whatever the allocator gives
            raw = torch.empty(self.nbytes + ALIGN, dtype=torch.uint8, device=device)
            skip = -raw.data_ptr() % ALIGN
            self.raw.append(raw)
            wholes.append(raw[skip:skip + self.nbytes])
        self.bases = [w.data_ptr() for w in wholes]
        # one table for every rank: symm_at subtracts bases[me] and adds bases[peer]
        self.heap_bases = torch.tensor(self.bases, dtype=torch.int64, device=device)
        self.peers = [{name: buffer_view(w, self.offsets[name], shape, dtype)
                       for name, (shape, dtype) in symmetric.items()} for w in wholes]
        self.heaps = [DeviceHeap(self, r) for r in range(world)]


class DeviceHeap:
    """Rank `rank`'s view of `DeviceHeaps`: what `SymmetricHeap` gives a rank (tensors,
    peers, heap_bases, rank, world, barrier), so the GPU runtime and the generated modules
    cannot tell the two apart."""

    backend = "device"

    def __init__(self, heaps: DeviceHeaps, rank: int):
        self.heaps, self.rank, self.world = heaps, rank, len(heaps.peers)
        self.offsets, self.nbytes = heaps.offsets, heaps.nbytes
        self.peers, self.heap_bases = heaps.peers, heaps.heap_bases
        self.tensors = heaps.peers[rank]

    def barrier(self) -> None:
        """Every rank lives in this process: the device's work done is the barrier."""
        import torch

        if self.heap_bases.is_cuda:
            torch.cuda.synchronize()
