"""The NVSHMEM flavour of the device primitives (tilelink.lang.nvshmem), checked on the CPU.

The same generated kernel is rendered for `cuda:90` and `cuda:90+nvshmem`: only the import of
the primitives differs, and the NVSHMEM one, compiled by stock Triton with NVSHMEM's device
bitcode linked, calls NVSHMEM's put and atomic-set (its transfer paths) and carries NVSHMEM's
device state. (Running it needs GPUs: tests/test_dist.py's NVSHMEM cases.)
"""

from __future__ import annotations

import difflib

import pytest

from tilelink.codegen import render_triton
from tilelink.codegen.compile import compile_module
from tilelink.frontend import load_pattern
from tilelink.lang import nvshmem
from tilelink.schedule import get_target, make_schedule

from .conftest import EXAMPLES


def _render(example, target, config, values=None, world=2):
    bp = load_pattern(str(EXAMPLES / example)).bind(values or {}, world)
    return make_schedule(bp, get_target(target), config)


def _bitcode():
    try:
        return nvshmem.device_library(90)
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("example,config", [
    ("ag_gemm.tl", {"comm": "sm"}),
    ("ag_gemm.tl", {"comm": "copy_engine"}),
    ("gemm_rs.tl", {"comm": "sm", "reduce_after": "1"}),
    ("gemm_rs.tl", {"comm": "copy_engine"}),
])
def test_same_kernel_modulo_the_lowering(example, config):
    plain = render_triton(_render(example, "cuda:90", config)).splitlines()
    shmem = render_triton(_render(example, "cuda:90+nvshmem", config)).splitlines()
    changed = [line for line in difflib.unified_diff(plain, shmem, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    changed = [line for line in changed if "target:" not in line]  # the header names it
    assert changed == ["-from tilelink.lang import nvidia as tld",
                       "+from tilelink.lang import nvshmem as tld"], changed


def test_ag_gemm_compiles_with_nvshmem_put_and_signal():
    _bitcode()
    s = _render("ag_gemm.tl", "cuda:90+nvshmem", {"comm": "sm"},
                {"M": "1000", "N": "520", "K": "1000"})  # ragged: no tile divides it
    ptx = compile_module(render_triton(s), s.target).asm["ptx"]
    assert "nvshmemi_device_state_d" in ptx  # what nvshmemx_cumodule_init fills in
    assert "nvshmemi_transfer_rma" in ptx  # putmem_block's path for peers off this node
    assert "nvshmemi_transfer_amo_nonfetch" in ptx  # the atomic set of the signal
    # the same kernel without NVSHMEM links nothing of it
    plain = _render("ag_gemm.tl", "cuda:90", {"comm": "sm"}, {"M": "1000", "N": "520",
                                                                 "K": "1000"})
    assert "nvshmem" not in compile_module(render_triton(plain), plain.target).asm["ptx"]


def test_gemm_rs_signals_through_nvshmem():
    _bitcode()
    s = _render("gemm_rs.tl", "cuda:90+nvshmem", {"comm": "sm", "reduce_after": "1"})
    ptx = compile_module(render_triton(s), s.target).asm["ptx"]
    assert "nvshmemi_transfer_amo_nonfetch" in ptx
    assert "nvshmemi_device_state_d" in ptx


def test_missing_bitcode_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("TILELINK_NVSHMEM_BC", str(tmp_path / "nope.bc"))
    with pytest.raises(FileNotFoundError, match="TILELINK_NVSHMEM_BC"):
        nvshmem.device_library(90)
    monkeypatch.delenv("TILELINK_NVSHMEM_BC")
    monkeypatch.setenv("NVSHMEM_LIB_DIR", str(tmp_path))
    monkeypatch.setattr(nvshmem, "_candidate_dirs", lambda: [str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="nvidia-nvshmem-cu13==3.4.5"):
        nvshmem.device_library(90)


def test_fault_injection_drops_the_signal_of_a_put():
    s = _render("ag_gemm.tl", "cuda:90+nvshmem", {"comm": "sm"})
    src, broken = render_triton(s), render_triton(s, fault="drop_notify")
    assert "tld.put_signal(" in src and "tld.put_signal(" not in broken
    assert "tld.put(" in broken and "fault injected (drop_notify): no signal" in broken
    compile(broken, "broken", "exec")  # still valid Python
