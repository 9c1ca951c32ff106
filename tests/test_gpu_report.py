"""What a GPU rank's HangError says, checked on the CPU: `gpu_report.raise_recorded` reads the
diagnostic words a kernel recorded (here written by hand) and names the waits that gave up."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tilelink.codegen import render_triton
from tilelink.codegen.compile import load_module
from tilelink.errors import HangError
from tilelink.frontend import load_text
from tilelink.lang.core import DIAG_FIELDS, DIAG_HEADER, DIAG_WORDS
from tilelink.runtime.gpu_report import raise_recorded
from tilelink.schedule import get_target, make_schedule

from .conftest import EXAMPLES

SP = load_text(EXAMPLES / "sp_attention_causal.tl")
SIZES = {"S": "8192", "H": "32", "HKV": "8", "D": "128"}


def _rank(world: int, slot_rank: int, comm: str):
    """A schedule and module of causal SP attention on cuda:90, and a rank 0 whose diagnostic
    words hold one wait that gave up: a compute tile's wait for the k chunk of `slot_rank`."""
    s = make_schedule(SP.bind(SIZES, world), get_target("cuda:90"), {"comm": comm})
    mod = load_module(render_triton(s))
    site = next(k for k, v in mod.WAIT_SITES.items() if "chunk of k_full" in v)
    dep = s.plan.deps[mod.WAIT_SITE_DEPS[site]]
    slot = next(i for i in range(dep.producer.size)
                if dep.producer.rank(dep.producer.unlinear(i)) == slot_rank)
    diag = torch.zeros(DIAG_WORDS, dtype=torch.int32)
    diag[0] = 1
    diag[DIAG_HEADER:DIAG_HEADER + DIAG_FIELDS] = torch.tensor(
        [0, 6, site, slot, 1, 0, 20_000_000, 0], dtype=torch.int32)
    rt = SimpleNamespace(rank=0, diag=diag, abort=torch.zeros(1, dtype=torch.int32),
                         spin_limit=20_000_000)
    return s, mod, rt


def test_a_wait_for_own_rows_copied_on_the_copy_engine_says_why_it_may_hang():
    # comm=copy_engine copies this rank's own keys into its buffer on this GPU (attention
    # reads the gathered buffer, not the input): a wait for them that gave up gets the hint
    s, mod, rt = _rank(1, 0, "copy_engine")
    assert mod.OWN_DIRECT == 0
    with pytest.raises(HangError) as e:
        raise_recorded(rt, s, mod, None)
    assert "sig_k_full" in str(e.value) and "(this rank)" in str(e.value)
    assert "copy on this GPU" in e.value.hint and "num_programs=128" in e.value.hint
    assert int(rt.diag[0]) == 0  # the records are cleared


@pytest.mark.parametrize("world,slot_rank,comm", [(2, 1, "copy_engine"), (2, 0, "sm")])
def test_other_waits_keep_the_plain_hint(world, slot_rank, comm):
    # a peer's chunk on the copy engine, or the own rows pushed by SM programs: no copy on
    # this GPU is involved
    s, mod, rt = _rank(world, slot_rank, comm)
    with pytest.raises(HangError) as e:
        raise_recorded(rt, s, mod, None)
    assert "copy on this GPU" not in e.value.hint
    assert "producer tile" in e.value.hint
