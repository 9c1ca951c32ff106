"""tilelink.runtime.fast_launch: later launches skip Triton's per-call path only while
nothing Triton specializes on has changed (checked on the CPU with a stand-in kernel)."""

from __future__ import annotations

import torch
import triton

from tilelink.runtime.fast_launch import FastLauncher


class _Compiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.direct = []

    def run(self, *args):
        self.direct.append(args)


class _Kernel:
    """Looks like a JITFunction to FastLauncher: `kernel[grid](*args, **options)`."""

    arg_names = ["x", "n", "BM", "BN"]

    def __init__(self):
        self.slow = []
        self.compiled = _Compiled()

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.slow.append((grid, args, options))
            return self.compiled
        return launch


OPTS = {"BM": 128, "BN": 64, "num_warps": 8}


def test_the_second_identical_launch_calls_the_compiled_launcher_with_every_argument():
    k, fl, x = _Kernel(), FastLauncher(), torch.zeros(64)
    fl.launch(k, (132,), (x, 7), dict(OPTS), stream=5)
    fl.launch(k, (132,), (x, 7), dict(OPTS), stream=5)
    assert len(k.slow) == 1 and fl.direct_launches == 1
    # grid, stream, function, metadata, no launch hooks, then the arguments in signature order
    assert k.compiled.direct == [(132, 1, 1, 5, "function", "metadata", None, None, None,
                                  x, 7, 128, 64)]


def test_a_change_triton_specializes_on_takes_tritons_path():
    k, fl = _Kernel(), FastLauncher()
    x = torch.zeros(64)
    fl.launch(k, (4,), (x, 7), dict(OPTS), 0)
    fl.launch(k, (4,), (x, 1), dict(OPTS), 0)  # int == 1 is specialized
    fl.launch(k, (4,), (x[1:], 7), dict(OPTS), 0)  # address no longer 16-byte aligned
    fl.launch(k, (4,), (x.to(torch.float16), 7), dict(OPTS), 0)  # dtype
    fl.launch(k, (4,), (x, 7), OPTS | {"BN": 32}, 0)  # a constexpr
    fl.launch(k, (8,), (x, 7), dict(OPTS), 0)  # the grid
    assert len(k.slow) == 6 and fl.direct_launches == 0
    fl.launch(k, (4,), (x, 1), dict(OPTS), 0)  # each key is kept: now direct
    fl.launch(k, (4,), (x.clone(), 7), OPTS | {"BN": 32}, 0)  # another tensor, same key
    assert len(k.slow) == 6 and fl.direct_launches == 2


def test_launch_hooks_and_unknown_argument_types_always_take_tritons_path(monkeypatch):
    k, fl, x = _Kernel(), FastLauncher(), torch.zeros(64)
    fl.launch(k, (4,), (x, 7), dict(OPTS), 0)
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    fl.launch(k, (4,), (x, 7), dict(OPTS), 0)  # a profiler's hook needs Triton's metadata
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", None)
    fl.launch(k, (4,), (x, 7.5), dict(OPTS), 0)  # a float: not keyed, never cached
    fl.launch(k, (4,), (x, 7.5), dict(OPTS), 0)
    assert len(k.slow) == 4 and fl.direct_launches == 0


def test_a_constexpr_left_to_its_default_is_never_launched_directly():
    k, fl, x = _Kernel(), FastLauncher(), torch.zeros(64)
    for _ in range(3):
        fl.launch(k, (4,), (x, 7), {"BM": 128}, 0)  # BN not given: its value is unknown here
    assert len(k.slow) == 3 and fl.direct_launches == 0


def test_option_value_types_and_tritons_debug_knob_take_tritons_path(monkeypatch):
    k, fl, x = _Kernel(), FastLauncher(), torch.zeros(64)
    fl.launch(k, (4,), (x, 7), dict(OPTS), 0)
    fl.launch(k, (4,), (x, 7), OPTS | {"BN": 64.0}, 0)  # == 64 in Python, not to Triton
    fl.launch(k, (4,), (x, 7), OPTS | {"BM": True}, 0)
    monkeypatch.setattr(triton.knobs.runtime, "debug", True)  # Triton recompiles for it
    fl.launch(k, (4,), (x, 7), dict(OPTS), 0)
    assert len(k.slow) == 4 and fl.direct_launches == 0
    fl.launch(k, (4,), (x, 7), dict(OPTS), 0)  # the debug build is cached in its turn
    assert len(k.slow) == 4 and fl.direct_launches == 1



def test_options_match_only_with_their_value_types():
    # 1, True and 1.0 compare equal in Python but are different constexprs to Triton
    from tilelink.runtime.fast_launch import _same_options

    first = {"BM": 128, "EVEN": True, "num_warps": 8}
    assert _same_options(first, dict(first))
    assert _same_options(first, {"num_warps": 8, "EVEN": True, "BM": 128})
    assert not _same_options(first, {"BM": 128, "EVEN": 1, "num_warps": 8})
    assert not _same_options(first, {"BM": 128.0, "EVEN": True, "num_warps": 8})
    assert not _same_options(first, {"BM": 64, "EVEN": True, "num_warps": 8})
    assert not _same_options({"X": 1, "Y": True}, {"Y": 1, "X": True})
