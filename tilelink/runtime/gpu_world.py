"""The GPU world of a torch.distributed program: one rank per process, one GPU each, the
ranks of a process group (`ProcessGroupWorld`, what `compile_op` builds for), the tilelink
target of this process's GPU (`device_target`), and the collective checks that every rank
builds the same op."""

from __future__ import annotations

from ..errors import ConfigError, NotSupportedError
from ..ir import BoundPattern
from ..schedule import get_target
from .gpu_op import FallbackOp
from .symmetric import SymmetricHeap


def device_target(backend: str = "torch"):
    """The tilelink target of the current CUDA device (cuda:90 on Hopper, cuda:80 on Ampere;
    with "+nvshmem" for the NVSHMEM backend, whose kernels link NVSHMEM's device library)."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    name = "cuda:90" if major >= 9 else "cuda:80"
    t = get_target(name + ("+nvshmem" if backend == "nvshmem" else ""))
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    from dataclasses import replace

    return replace(t, num_sms=props.multi_processor_count, device=props.name)


def _check_world_order(group) -> None:
    """NVSHMEM's device calls name PEs by global rank while kernels use the group's ranks:
    the NVSHMEM lowering needs a group whose rank r is global rank r."""
    import torch.distributed as dist

    if group is None:
        return
    n = dist.get_world_size(group)
    if [dist.get_global_rank(group, r) for r in range(n)] != list(range(n)):
        raise NotSupportedError("backend 'nvshmem' needs a process group whose rank r is "
                                "global rank r (NVSHMEM device calls address global PEs)",
                                hint="use the default group, or backend 'nvshmem-ptr' / "
                                "'torch' for subgroups")


def _agree(choice: str, group) -> None:
    """Every rank must build the same op (same buffers, slots and bounds): a config taken from
    a per-rank tuner cache or environment could differ. Collective."""
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, choice, group=group)
    if len(set(everyone)) > 1:
        lines = "\n".join(f"  rank {r}: {c}" for r, c in enumerate(everyone))
        raise ConfigError("the ranks chose different schedules for one op:\n" + lines,
                          hint="pass the same config (or the same tuner cache, "
                          "TILELINK_CACHE) to every rank")


class ProcessGroupWorld:
    """Where an op's ranks live, for `compile_ops`: one rank per process, one GPU each, the
    ranks of a torch.distributed process group (what `compile_op` builds for).

    The world interface (`one_gpu.OneGpuWorld` is the other world): `size`; `key()` (what
    tells its ops apart in the op cache); `target(backend)` (the schedule's target);
    `annotate(schedule)`; `tuned` (whether the tuner's cache applies); `agree(choice)`
    (every rank builds the same op); `heaps(symmetric, backend)` (one heap per rank built
    here); `barrier()`; `fallback_ops(bound, schedule)` (the non-overlapped plan's op per
    rank built here); `prepare_module(module)`; `engine_streams(rank)` (the copy engine's
    side and service streams, or None for new ones); `group` (handed to the ops).
    """

    tuned = True  # the tuner's cached configs were measured on worlds like this one

    def __init__(self, group=None):
        import torch.distributed as dist

        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def key(self) -> tuple:
        import torch

        return (getattr(self.group, "group_name", None), torch.cuda.current_device())

    def target(self, backend: str):
        target = device_target(backend)
        if target.lang == "nvshmem":
            _check_world_order(self.group)
        return target

    def annotate(self, schedule):
        return schedule

    def agree(self, choice: str) -> None:
        _agree(choice, self.group)

    def heaps(self, symmetric: dict, backend: str) -> list:
        return [SymmetricHeap(symmetric, self.group, backend)]

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)

    def fallback_ops(self, bp: BoundPattern, schedule) -> list:
        return [FallbackOp(bp, schedule, self.group, rank=self.rank)]

    def prepare_module(self, module) -> None:
        pass

    def engine_streams(self, rank: int) -> None:
        """(Each op's copy engine makes its own streams.)"""
        return None
