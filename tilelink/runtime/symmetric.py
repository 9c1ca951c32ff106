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
        start = self.offsets[name]
        return whole[start:start + _nbytes(shape, dtype)].view(TORCH_DTYPES[dtype]).view(shape)

    def barrier(self) -> None:
        """A host barrier among the heap's ranks after this rank's GPU work is done (setup
        only: calls never need one). NCCL's barrier, with its timeout, rather than the
        symmetric-memory barrier kernel, which would spin on the GPU if a peer never came."""
        import torch
        import torch.distributed as dist

        torch.cuda.synchronize()
        dist.barrier(group=self.group)
