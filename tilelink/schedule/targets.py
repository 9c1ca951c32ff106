"""Compile targets as data: what differs between GPUs and the interpreter is a table row."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, closest


@dataclass(frozen=True)
class Target:
    """Where generated code runs. `lang` is the tilelink.lang module the kernel imports."""

    name: str
    backend: str  # "cuda" | "hip" | "interp"
    arch: int | str | None
    warp_size: int
    num_sms: int  # co-resident persistent programs (one per SM / CU)
    lang: str  # tilelink.lang.<lang>
    dot_fp32: bool  # upcast bf16 dot operands (the interpreter's bf16 dot is wrong)
    tma: bool = False  # tensor descriptors (Hopper's TMA) for GEMM operand loads
    # shared memory one CTA may take (bytes; the opt-in maximum); None: the backend decides
    # its own use (AMD's stream pipeliner), so nothing is checked against it
    smem_bytes: int | None = None
    # the GPU the cost model's constants are taken for (`schedule.cost.device_spec`): the
    # runtime sets the device it runs on; compiling without one assumes the part named here
    # (for Hopper the H200, whose row rests on the most measurements)
    device: str = ""
    # fp8 e4m3 conversions in hardware (Triton's tl.float8e4nv: sm_89 and later); elsewhere
    # kernels round to fp8 in integer arithmetic (`tld.fp8_bits`, exact and slower)
    fp8: bool = False


TARGETS = {
    "cuda:90": Target("cuda:90", "cuda", 90, 32, 132, "nvidia", False, True, 232_448,
                      "NVIDIA H200", fp8=True),
    "cuda:80": Target("cuda:80", "cuda", 80, 32, 108, "nvidia", False, smem_bytes=166_912,
                      device="NVIDIA A100"),
    # the same GPUs with NVSHMEM's device library linked (runtime backend "nvshmem")
    "cuda:90+nvshmem": Target("cuda:90+nvshmem", "cuda", 90, 32, 132, "nvshmem", False, True,
                              232_448, "NVIDIA H200", fp8=True),
    "cuda:80+nvshmem": Target("cuda:80+nvshmem", "cuda", 80, 32, 108, "nvshmem", False,
                              smem_bytes=166_912, device="NVIDIA A100"),
    "hip:gfx942": Target("hip:gfx942", "hip", "gfx942", 64, 304, "amd", False,
                         device="AMD Instinct MI300X"),
    "interp": Target("interp", "interp", None, 32, 8, "interp", True),
}


def get_target(name: str) -> Target:
    """The Target called `name` (cuda:90, cuda:80, hip:gfx942, interp)."""
    if name not in TARGETS:
        hint = closest(name, TARGETS)
        raise ConfigError(f"unknown target '{name}'",
                          hint=f"did you mean '{hint}'?" if hint else
                          "targets: " + ", ".join(TARGETS))
    return TARGETS[name]
