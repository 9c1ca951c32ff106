"""The non-overlapped plan's attention: torch's fused SDPA kernels (what a user runs) on GPUs
in half precision, the fp32 reference everywhere else; the same values either way."""

from __future__ import annotations

import pytest
import torch

from tilelink.frontend import load_pattern
from tilelink.ops.attention import _attend, _partial, _partial_sdpa, _sdpa, _vendor
from tilelink.runtime.bounds import output_bound

from .conftest import EXAMPLES


@pytest.mark.parametrize("offset", [0, 16, 48])
def test_causal_sdpa_sees_the_keys_up_to_each_querys_global_position(offset):
    # a sequence-parallel q shard at rows offset.. against all 64 gathered keys
    g = torch.Generator().manual_seed(offset)
    q, k, v = (torch.randn(n, 2, 8, generator=g) for n in (16, 64, 64))
    torch.testing.assert_close(_sdpa(q, k, v, 1, offset),
                               _attend(q, k, v, 1, offset, torch.float32))
    torch.testing.assert_close(_sdpa(q, k, v, 0, 0), _attend(q, k, v, 0, 0, torch.float32))


def test_the_reference_and_cpu_tensors_never_take_the_vendor_path():
    half = torch.zeros(2, 2, 2, dtype=torch.bfloat16)
    assert not _vendor(half, exact=False)  # on the CPU
    assert not _vendor(half, exact=True)
    # neither flash nor memory-efficient attention runs on the CPU: the plan keeps _partial
    assert _partial_sdpa(*(torch.zeros(1, 2, 8), torch.zeros(1, 4, 2, 8),
                           torch.zeros(1, 4, 2, 8))) is None


def test_the_plans_bound_allows_weights_held_in_the_inputs_dtype():
    bp = load_pattern(str(EXAMPLES / "flash_decode.tl")).bind({}, 2)
    out = bp.pattern.outputs[0]
    assert output_bound(bp, out, plan=True).normwise > output_bound(bp, out).normwise


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_partial_matches_the_reference_on_a_gpu(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 8, 128, generator=g, device="cuda").to(dtype)
    k, v = (torch.randn(2, 4096, 8, 128, generator=g, device="cuda").to(dtype)
            for _ in range(2))
    got, want = _partial_sdpa(q, k, v), _partial(q, k, v)
    assert got is not None and got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got[..., -1], want[..., -1], atol=1e-3, rtol=1e-3)  # lse
    torch.testing.assert_close(got[..., :-1], want[..., :-1], atol=2e-2, rtol=2e-2)
