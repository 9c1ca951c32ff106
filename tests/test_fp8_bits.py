"""`tld.fp8_bits` / `tld.fp8_value` (the fp8 e4m3 payload of `all_to_all(..., fp8 = 1)`):
the encoding rounds to nearest even exactly as torch's `float8_e4m3fn` conversion (and the
GPUs') does, byte for byte, and the decoding gives every finite byte's value; run in the
Triton interpreter (a child process, `_interp_worker`), and compiled for every GPU target
(cuda:80 has no e4m3 type: the primitives are integer arithmetic)."""

from __future__ import annotations

import os
import sys

import pytest
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _interp_worker import get, run_worker, worker_main
from _triton_compile import compile_for

from tilelink.lang import core


@triton.jit
def _roundtrip(x_ptr, bytes_ptr, back_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    b = core.fp8_bits(tl.load(x_ptr + offs, mask=m, other=0.0))
    tl.store(bytes_ptr + offs, b.to(tl.uint8), mask=m)
    tl.store(back_ptr + offs, core.fp8_value(tl.load(bytes_ptr + offs, mask=m, other=0)), mask=m)


def _values():
    """Random magnitudes across fp8's range (normal, subnormal, past its rounding edges) and
    the edges themselves: zeros, the largest, the smallest subnormal and the ties around it,
    the normal/subnormal boundary, and values that round up into the next binade."""
    import torch

    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(20000, generator=gen) * 100,
                   torch.randn(20000, generator=gen) * 0.01,
                   (torch.rand(20000, generator=gen) - 0.5) * 896,
                   torch.randn(4000, generator=gen) * 2.0**-8]).clamp(-448, 448)
    edges = torch.tensor([0.0, -0.0, 448.0, -448.0, 2.0**-9, 2.0**-10, 3 * 2.0**-10,
                          -5 * 2.0**-10, 2.0**-6, 2.0**-6 * (1 - 2.0**-5), 1.5 * 2.0**-6,
                          31.5, 31.9, -127.9, 240.0 + 8.0, 15.75, 1.0625, 1.1875])
    return torch.cat([edges, x])


def _case_roundtrip():
    import torch

    x = _values()
    q = torch.empty(x.numel(), dtype=torch.uint8)
    back = torch.empty(x.numel())
    _roundtrip[(triton.cdiv(x.numel(), 1024),)](x, q, back, x.numel(), BLOCK=1024)
    want = x.to(torch.float8_e4m3fn)
    every = torch.arange(256, dtype=torch.uint8)
    decoded = torch.empty(256)
    _roundtrip_bytes[(1,)](every, decoded)
    finite = ~torch.isnan(every.view(torch.float8_e4m3fn).float())
    return {"n": x.numel(),
            "byte_mismatches": int((q != want.view(torch.uint8)).sum()),
            "value_mismatches": int((back != want.float()).sum()),
            "decode_mismatches": int((decoded[finite]
                                      != every.view(torch.float8_e4m3fn).float()[finite]).sum()),
            "finite_bytes": int(finite.sum()),
            "nonzero": int((q != 0).sum())}


@triton.jit
def _roundtrip_bytes(bytes_ptr, out_ptr):
    offs = tl.arange(0, 256)
    tl.store(out_ptr + offs, core.fp8_value(tl.load(bytes_ptr + offs)))


def _case_nan():
    import torch

    x = torch.tensor([float("nan"), -float("nan"), 1.0, 0.0])
    q = torch.empty(4, dtype=torch.uint8)
    back = torch.empty(4)
    _roundtrip[(1,)](x, q, back, 4, BLOCK=4)
    return {"bytes": q.tolist(), "nan": [bool(v) for v in torch.isnan(back)]}


_CASES = {"roundtrip": _case_roundtrip, "nan": _case_nan}


@pytest.fixture(scope="module")
def interp_results():
    return run_worker(__file__)


def test_the_encoding_rounds_like_torch_and_the_decoding_is_exact(interp_results):
    r = get(interp_results, "roundtrip")
    assert r["n"] > 60000 and r["nonzero"] > 50000  # (the values really span the range)
    assert r["byte_mismatches"] == 0 and r["value_mismatches"] == 0
    assert r["finite_bytes"] == 254 and r["decode_mismatches"] == 0


def test_nan_stays_nan(interp_results):
    r = get(interp_results, "nan")
    assert r["bytes"][0] == 0x7F and r["bytes"][1] == 0xFF and r["bytes"][2:] == [0x38, 0]
    assert r["nan"] == [True, True, False, False]


@pytest.mark.parametrize("target", ["cuda:90", "cuda:80", "hip:gfx942"])
def test_the_primitives_compile_for_every_gpu_target(target):
    k = compile_for(_roundtrip, {"x_ptr": "*fp32", "bytes_ptr": "*u8", "back_ptr": "*fp32",
                                 "n": "i32"}, {"BLOCK": 1024}, target)
    assert k.asm.get("ptx") or k.asm.get("amdgcn")


if __name__ == "__main__":
    worker_main(_CASES)
