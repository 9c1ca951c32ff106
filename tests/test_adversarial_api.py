"""Adversarial Python use: the Python DSL misused inside a pattern function, and the Python
API (tk.emulate, tk.check, bind, the loaders, parse/format, tile functions, sizes,
run_emulated, compile_op) called with what it does not take.

Every case must end in a TileLinkError of the expected class naming the problem (the
user's line for DSL misuse), with a hint, no other exception and no hang. Nothing here runs
the emulated world: every refusal comes before a rank starts, so the suite takes seconds.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import triton
from hypothesis import given, settings
from hypothesis import strategies as st

import tilelink as tk
from tilelink.errors import (
    ConfigError,
    DSLSyntaxError,
    NotSupportedError,
    PatternError,
    RuntimeCheckError,
    TileLinkError,
    UsageError,
)
from tilelink.frontend import LoadError
from tilelink.frontend.text import parse_text
from tilelink.runtime import run_emulated
from tilelink.runtime.reference import make_inputs

from .adversarial import SIZES_NO_GPU_HOLDS, deadline

ROOT = Path(__file__).resolve().parent.parent
AG = str(ROOT / "examples" / "ag_gemm.tl")
PATTERNS = str(ROOT / "examples" / "patterns.py")
# the patterns examples/patterns.py defines, counted in its text (the loader's message names
# how many it found)
PY_PATTERNS = (ROOT / "examples" / "patterns.py").read_text().count("\n@tk.pattern\n")



def assert_clean(err: TileLinkError) -> None:
    text = str(err)
    assert "Traceback" not in text and len(text) < 6000, text


# ---- the Python DSL, misused inside a pattern function ----------------------------------------

MODULE = '''import tilelink as tk


@tk.pattern
def p(M=64, K=32, dtype="bf16"):
    {body}
'''

# (id, body of the pattern function (line 6 on), error class, start of the message, line)
PY_CASES = [
    ('input-no-args', 'return tk.input()', PatternError,
     'tk.input takes a shape and a dtype, got 0', 6),
    ('input-one-arg', 'return tk.input((M, K))', PatternError,
     'tk.input takes a shape and a dtype, got 1', 6),
    ('input-four-args', "return tk.input('a', (M,), dtype, 0)", PatternError,
     'tk.input takes a shape and a dtype, got 4', 6),
    ('input-float-dim', 'return tk.input((M, 2.5), dtype)', PatternError,
     'a size must be an int or a size expression, got 2.5', 6),
    ('input-str-dim', "return tk.input((M, 'K'), dtype)", PatternError,
     "a size must be an int or a size expression, got 'K'", 6),
    ('input-none-dim', 'return tk.input((M, None), dtype)', PatternError,
     'a size must be an int or a size expression, got None', 6),
    ('input-bool-dim', 'return tk.input((M, True), dtype)', PatternError,
     'a size must be an int or a size expression, got True', 6),
    ('input-nested-shape', 'return tk.input(((M, K),), dtype)', PatternError,
     'a size must be an int or a size expression, got', 6),
    ('input-tensor-dim', 'a = tk.input((M,), dtype)\n    return tk.input((a,), dtype)',
     PatternError, 'a size must be an int or a size expression, got', 7),
    ('input-float-expr', 'return tk.input((M * 1.5,), dtype)', UsageError,
     'M * 1.5: a size is combined with ints and sizes', 6),
    ('input-true-div-float', 'return tk.input((M / 2.0,), dtype)', UsageError,
     'M / 2.0: a size is combined with ints and sizes', 6),
    ('input-pow', 'return tk.input((M ** 2,), dtype)', UsageError,
     'M ** 2 needs the value of M, and sizes have none', 6),
    ('input-compare', 'return tk.input((M if M > 4 else K,), dtype)', UsageError,
     'comparing M > 4 needs the value of M, and sizes', 6),
    ('input-range', 'return tk.input((len(range(M)),), dtype)', UsageError,
     'using M as an int needs the value of M, and sizes', 6),
    ('input-int', 'return tk.input((int(M),), dtype)', UsageError,
     'int(M) needs the value of M, and sizes have none', 6),
    ('input-div-zero', 'return tk.input((M / 0,), dtype)', PatternError,
     'a dim of input_0 divides by zero: M / 0 = 64 / 0', 6),
    ('input-negative', 'return tk.input((-M,), dtype)', PatternError,
     'dim 0 - M of input_0 is -64; sizes must be positive', 6),
    ('input-zero', 'return tk.input((M - M,), dtype)', PatternError,
     'dim M - M of input_0 is 0; sizes must be positive', 6),
    ('input-unknown-dtype', "return tk.input((M,), 'bfloat16')", PatternError,
     "unknown dtype 'bfloat16'", 6),
    ('input-int-dtype', 'return tk.input((M,), 16)', PatternError, 'unknown dtype 16', 6),
    ('input-size-as-dtype', 'return tk.input((M,), K)', PatternError, "'K' is a size, not a dtype",
     6),
    ('input-shard-str', "return tk.input((M,), dtype, shard='0')", PatternError,
     "shard= takes a dim (an int), got '0'", 6),
    ('input-shard-float', 'return tk.input((M,), dtype, shard=0.0)', PatternError,
     'shard= takes a dim (an int), got 0.0', 6),
    ('input-shard-bool', 'return tk.input((M,), dtype, shard=True)', PatternError,
     'shard= takes a dim (an int), got True', 6),
    ('input-shard-out-of-range', 'return tk.input((M,), dtype, shard=1)', PatternError,
     'shard(1) is out of range for input_0, which has 1 dims', 6),
    ('input-shard-and-placement', "return tk.input((M,), dtype, shard=0, placement='partial')",
     PatternError, 'give either shard= or placement=, not both', 6),
    ('input-placement-unknown', "return tk.input((M,), dtype, placement='everywhere')",
     PatternError, "unknown placement 'everywhere'", 6),
    ('input-placement-shard', "return tk.input((M,), dtype, placement='shard')", PatternError,
     "unknown placement 'shard'", 6),
    ('input-placement-int', 'return tk.input((M,), dtype, placement=0)', PatternError,
     'unknown placement 0', 6),
    ('input-name-not-identifier', "return tk.input((M,), dtype, name='a b')", PatternError,
     "name= must be an identifier, got 'a b'", 6),
    ('input-name-int', 'return tk.input((M,), dtype, name=3)', PatternError,
     'name= must be an identifier, got 3', 6),
    ('input-unknown-kwarg', 'return tk.input((M,), dtype, shards=0)', LoadError,
     'importing {file} failed: TypeError: input() got', 6),
    ('op-non-tensor', 'return tk.gemm(M, K)', PatternError,
     'argument 1 of gemm must be a tensor, got Sym', 6),
    ('op-list-arg', 'a = tk.input((M, K), dtype)\n    return tk.gemm([a], a)', PatternError,
     'argument 1 of gemm must be a tensor, got list', 7),
    ('op-arity', 'a = tk.input((M, K), dtype)\n    return tk.gemm(a)', PatternError,
     'gemm takes 2 tensor argument(s), got 1', 7),
    ('op-unknown-kwarg',
     'a = tk.input((M, K), dtype, shard=0)\n    return tk.all_gather(a, axis=0)', PatternError,
     "all_gather has no argument 'axis'", 7),
    ('op-dim-str', "a = tk.input((M, K), dtype, shard=0)\n    return tk.all_gather(a, dim='0')",
     PatternError, "dim= must be an int or a size expression, got '0'", 7),
    ('op-dim-float', 'a = tk.input((M, K), dtype, shard=0)\n    return tk.all_gather(a, dim=0.0)',
     PatternError, 'dim= must be an int or a size expression, got 0.0', 7),
    ('op-dim-bool', 'a = tk.input((M, K), dtype, shard=0)\n    return tk.all_gather(a, dim=False)',
     PatternError, 'dim= takes a dim (an integer; negative counts from', 7),
    ('op-dim-tensor', 'a = tk.input((M, K), dtype, shard=0)\n    return tk.all_gather(a, dim=a)',
     PatternError, 'dim= must be an int or a size expression, got', 7),
    ('op-dim-out-of-range',
     'a = tk.input((M, K), dtype, shard=0)\n    return tk.all_gather(a, dim=5)', PatternError,
     'dim = 5 is out of range for a, which has 2 dims', 7),
    ('op-dim-unknown-size',
     'a = tk.input((M, K), dtype, shard=0)\n    return tk.all_gather(a, dim=tk.W - tk.W - 9)',
     PatternError, 'dim = -9 is out of range for a, which has 2 dims', 7),
    ('op-causal', 'q = tk.input((M, 2, K), dtype)\n    return tk.attention(q, q, q, causal=2)',
     PatternError, 'attention(causal = 2): causal is a flag (0 or 1)', 7),
    ('op-name-clash',
     "a = tk.input((M, K), dtype, name='x')\n    return tk.all_reduce(a, name='x')", PatternError,
     "'x' is already defined", 7),
    ('op-name-param', "a = tk.input((M, K), dtype, name='M')\n    return a", PatternError,
     "'M' is already defined", 6),
    ('op-map-no-function', 'a = tk.input((M, K), dtype)\n    return tk.map(a)', PatternError,
     "map's first argument must be a @tk.tile_function", 7),
    ('op-map-function', 'a = tk.input((M, K), dtype)\n    return tk.map(print, a)', PatternError,
     "map's first argument must be a @tk.tile_function", 7),
    ('op-gemm-shapes', 'a = tk.input((M, K), dtype)\n    return tk.gemm(a, a)', PatternError,
     'gemm inner dimensions differ: a is [64, 32] and a', 7),
    ('op-gemm-dtypes',
     "a = tk.input((M, K), dtype)\n    b = tk.input((K, M), 'fp32')\n    return tk.gemm(a, b)",
     PatternError, 'gemm needs operands of one dtype: a is bf16, b is fp32', 8),
    ('return-none', 'tk.input((M,), dtype)', PatternError,
     'pattern p must return a tensor or a tuple of', 6),
    ('return-int', 'return 3', PatternError, 'pattern p must return a tensor or a tuple of', 6),
    ('return-mixed', 'a = tk.input((M,), dtype)\n    return a, 3', PatternError,
     'pattern p must return a tensor or a tuple of', 7),
    ('return-dict', "a = tk.input((M,), dtype)\n    return {'a': a}", PatternError,
     'pattern p must return a tensor or a tuple of', 7),
    ('raise-in-pattern', "raise ValueError('my bug')", LoadError,
     'importing {file} failed: ValueError: my bug', 6),
    ('exit-in-pattern', 'import sys\n    sys.exit(2)', LoadError,
     '{file} called sys.exit(2) while it was imported', 7),
    ('deep-expression',
     's = M\n    for _ in range(500):\n        s = s + 1\n    return tk.input((s,), dtype)',
     PatternError, 'a size expression nests more than 200 operations', 8),
    ('huge-dim', 'return tk.input((2 ** 70,), dtype)', PatternError,
     'input_0 is too large for any GPU: dim 0 is', 6),
    ('huge-product', 'return tk.input((M * 2 ** 40, 2 ** 30), dtype)', PatternError,
     'input_0 is too large for any GPU: dim 0 is', 6),
    ('too-many-dims', 'return tk.input((M,) * 12, dtype)', PatternError,
     'input_0 has 12 dims (shape [64, 64, 64, 64, 64, 64,', 6),
]


@pytest.mark.parametrize("case", PY_CASES, ids=[c[0] for c in PY_CASES])
def test_python_dsl_misuse(tmp_path, case):
    cid, body, cls, words, line = case
    f = tmp_path / f"{cid.replace('-', '_')}.py"
    f.write_text(MODULE.format(body=body))
    with deadline(10), pytest.raises(TileLinkError) as e:
        tk.load_pattern(f"{f}:p").bind({}, 2)
    err = e.value
    assert type(err) is cls, str(err)
    assert err.message.startswith(words.replace("{file}", str(f))), str(err)
    assert err.loc is not None and (Path(err.loc.file).resolve(), err.loc.line) == (
        f.resolve(), line), str(err)
    assert err.hint, str(err)
    assert_clean(err)


# ---- the Python API, called with what it does not take --------------------------------------


@tk.pattern
def ag(M=64, N=32, K=32, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=0)
    b = tk.input((K, N / tk.W), dtype)
    return tk.gemm(tk.all_gather(a, dim=0), b)


def plain(M=4):
    return M


BP = ag.bind({}, 2)


def ins(**change):
    """Good inputs for BP, with some replaced."""
    given = make_inputs(BP, 0)
    given.update(change)
    return given


def jit_fn():
    @triton.jit
    def k(x):
        pass

    return k


_SOURCE: list[str] = []


def SRC() -> str:
    """The overlapped module of BP (rendered once)."""
    if not _SOURCE:
        from tilelink.codegen import render_triton
        from tilelink.runtime.api import schedule_for

        _SOURCE.append(render_triton(schedule_for(BP, config={"comm": "sm"})))
    return _SOURCE[0]


# (id, call, error class, start of the message)
API_CASES = [
    ('emulate-plain-function', lambda: tk.emulate(plain, 2), UsageError,
     'tk.emulate needs a pattern: a @tk.pattern function,'),
    ('emulate-int', lambda: tk.emulate(7), UsageError,
     'tk.emulate needs a pattern: a @tk.pattern function,'),
    ('emulate-none', lambda: tk.emulate(None), UsageError,
     'tk.emulate needs a pattern: a @tk.pattern function,'),
    ('emulate-bytes', lambda: tk.emulate(b"examples/ag_gemm.tl"), UsageError,
     'tk.emulate needs a pattern: a @tk.pattern function,'),
    ('emulate-list', lambda: tk.emulate([AG]), UsageError,
     'tk.emulate needs a pattern: a @tk.pattern function,'),
    ('emulate-dict', lambda: tk.emulate({"pattern": AG}), UsageError,
     'tk.emulate needs a pattern: a @tk.pattern function,'),
    ('emulate-module', lambda: tk.emulate(tk), UsageError,
     'tk.emulate needs a pattern: a @tk.pattern function,'),
    ('emulate-class', lambda: tk.emulate(tk.TileLinkError), UsageError,
     'tk.emulate needs a pattern: a @tk.pattern function,'),
    ('emulate-source-text', lambda: tk.emulate(open(AG).read()), UsageError,
     'tk.emulate was given pattern source text, not a path'),
    ('emulate-missing-file', lambda: tk.emulate("nope/missing.tl"), LoadError,
     'no such pattern file: nope/missing.tl'),
    ('emulate-directory', lambda: tk.emulate("examples"), LoadError,
     "cannot load a pattern from 'examples'"),
    ('emulate-py-without-function', lambda: tk.emulate("examples/patterns.py"), LoadError,
     f'examples/patterns.py holds {PY_PATTERNS} patterns (ag_cols_gemm,'),
    ('emulate-world-str', lambda: tk.emulate(ag, "2"), UsageError,
     "the world size must be an int, got '2' (str)"),
    ('emulate-world-float', lambda: tk.emulate(ag, 2.5), UsageError,
     'the world size must be an int, got 2.5 (float)'),
    ('emulate-world-bool', lambda: tk.emulate(ag, True), UsageError,
     'the world size must be an int, got True (bool)'),
    ('emulate-world-zero', lambda: tk.emulate(ag, 0), PatternError,
     'world size must be >= 1, got 0'),
    ('emulate-world-negative', lambda: tk.emulate(ag, -4), PatternError,
     'world size must be >= 1, got -4'),
    ('emulate-world-list', lambda: tk.emulate(ag, [2]), UsageError,
     'the world size must be an int, got list'),
    ('emulate-values-str', lambda: tk.emulate(ag, 2, "M=64"), UsageError,
     "values= takes a dict of parameter values, got 'M=64' (str)"),
    ('emulate-values-list', lambda: tk.emulate(ag, 2, [("M", 64)]), UsageError,
     'values= takes a dict of parameter values, got'),
    ('emulate-values-int-key', lambda: tk.emulate(ag, 2, {0: 64}), UsageError,
     'parameter names are strings, got 0 (int)'),
    ('emulate-values-W', lambda: tk.emulate(ag, 2, {"W": 4}), PatternError,
     'W is the world size, not a parameter of pattern ag'),
    ('emulate-values-unknown', lambda: tk.emulate(ag, 2, {"Q": 4}), PatternError,
     "pattern ag has no parameter 'Q'"),
    ('emulate-values-float', lambda: tk.emulate(ag, 2, {"M": 64.5}), PatternError,
     'M = 64.5 has a fraction; sizes are integers'),
    ('emulate-values-bool', lambda: tk.emulate(ag, 2, {"M": True}), PatternError,
     'M = True is a bool, not an integer'),
    ('emulate-values-dtype', lambda: tk.emulate(ag, 2, {"dtype": "fp8"}), PatternError,
     'dtype = fp8 is not a dtype'),
    ('emulate-values-huge', lambda: tk.emulate(ag, 2, {"M": 10**30}), PatternError,
     'M = 1000000000000000000000000000000 is too large:'),
    ('emulate-values-uneven', lambda: tk.emulate(ag, 3, {"M": 64, "N": 32}), PatternError,
     '2 sizes do not divide evenly with W = 3:'),
    ('emulate-config-str', lambda: tk.emulate(ag, 2, config="comm=sm"), UsageError,
     "config= takes a dict of schedule values, got 'comm=sm' (str)"),
    ('emulate-config-list', lambda: tk.emulate(ag, 2, config=[("comm", "sm")]), UsageError,
     'config= takes a dict of schedule values, got'),
    ('emulate-config-int-key', lambda: tk.emulate(ag, 2, config={1: "sm"}), UsageError,
     'config keys are strings, got 1 (int)'),
    ('emulate-config-float', lambda: tk.emulate(ag, 2, config={"block_m": 64.0}), UsageError,
     'config block_m= takes an int or a string, got 64.0 (float)'),
    ('emulate-config-none-value', lambda: tk.emulate(ag, 2, config={"block_m": None}), UsageError,
     'config block_m= takes an int or a string, got None'),
    ('emulate-config-bool', lambda: tk.emulate(ag, 2, config={"block_m": True}), UsageError,
     'config block_m= takes an int or a string, got True (bool)'),
    ('emulate-config-unknown-key', lambda: tk.emulate(ag, 2, config={"blockm": 64}), ConfigError,
     "unknown config key 'blockm'"),
    ('emulate-config-bad-int', lambda: tk.emulate(ag, 2, config={"block_m": "big"}), ConfigError,
     "config block_m='big' must be an integer"),
    ('emulate-seed-negative', lambda: tk.emulate(ag, seed=-1), UsageError,
     'seed= takes an int from 0 to 9223372036854765807,'),
    ('emulate-seed-huge', lambda: tk.emulate(ag, seed=99999999999999999999), UsageError,
     'seed= takes an int from 0 to 9223372036854765807,'),
    ('emulate-seed-float', lambda: tk.emulate(ag, seed=0.5), UsageError,
     'seed= takes an int from 0 to 9223372036854765807,'),
    ('emulate-seed-str', lambda: tk.emulate(ag, seed="0"), UsageError,
     'seed= takes an int from 0 to 9223372036854765807,'),
    ('emulate-progress-str', lambda: tk.emulate(ag, progress="quiet"), UsageError,
     "progress= is True, False or a number of seconds >= 0, got 'quiet' (str)"),
    ('emulate-progress-negative', lambda: tk.emulate(ag, progress=-1), UsageError,
     "progress= is True, False or a number of seconds >= 0, got -1 (int)"),
    ('emulate-calls-zero', lambda: tk.emulate(ag, calls=0), UsageError,
     'calls= takes an int from 1 to 10000, got 0 (int)'),
    ('emulate-calls-negative', lambda: tk.emulate(ag, calls=-1), UsageError,
     'calls= takes an int from 1 to 10000, got -1 (int)'),
    ('emulate-calls-huge', lambda: tk.emulate(ag, calls=10**12), UsageError,
     'calls= takes an int from 1 to 10000, got 1000000000000 (int)'),
    ('emulate-calls-float', lambda: tk.emulate(ag, calls=1.0), UsageError,
     'calls= takes an int from 1 to 10000, got 1.0 (float)'),
    ('emulate-delays-int', lambda: tk.emulate(ag, delays=1), UsageError,
     'delays= is True or False, got 1 (int)'),
    ('emulate-timeout-nan', lambda: tk.emulate(ag, timeout=float("nan")), UsageError,
     'timeout= takes a number of seconds > 0, got nan (float)'),
    ('emulate-timeout-inf', lambda: tk.emulate(ag, timeout=float("inf")), UsageError,
     'timeout= takes a number of seconds > 0, got inf (float)'),
    ('emulate-timeout-zero', lambda: tk.emulate(ag, timeout=0), UsageError,
     'timeout= takes a number of seconds > 0, got 0 (int)'),
    ('emulate-timeout-negative', lambda: tk.emulate(ag, timeout=-1.0), UsageError,
     'timeout= takes a number of seconds > 0, got -1.0 (float)'),
    ('emulate-timeout-str', lambda: tk.emulate(ag, timeout="60"), UsageError,
     "timeout= takes a number of seconds > 0, got '60' (str)"),
    ('emulate-timeout-bool', lambda: tk.emulate(ag, timeout=True), UsageError,
     'timeout= takes a number of seconds > 0, got True (bool)'),
    ('emulate-fault-int', lambda: tk.emulate(ag, fault=1), UsageError,
     'fault= takes a string or None, got 1 (int)'),
    ('emulate-fault-list', lambda: tk.emulate(ag, fault=["drop_notify"]), UsageError,
     "fault= takes a string or None, got ['drop_notify'] (list)"),
    ('emulate-first-epoch-str', lambda: tk.emulate(ag, first_epoch="1"), UsageError,
     'first_epoch= takes an int from -4611686018427387904'),
    ('emulate-first-epoch-huge', lambda: tk.emulate(ag, first_epoch=2**70), UsageError,
     'first_epoch= takes an int from -4611686018427387904'),
    ('emulate-bound-with-values', lambda: tk.emulate(BP, values={"M": 64}), UsageError,
     'tk.emulate was given a BoundPattern (its sizes are'),
    ('emulate-bound-other-world', lambda: tk.emulate(BP, 4), UsageError,
     'the pattern was bound for W = 2, but world_size=4'),
    ('emulate-inputs-str', lambda: tk.emulate(BP, inputs="a"), RuntimeCheckError,
     'inputs= takes {name: [tensor of rank 0, ...]} or a'),
    ('emulate-inputs-int', lambda: tk.emulate(BP, inputs=3), RuntimeCheckError,
     'inputs= takes {name: [tensor of rank 0, ...]} or a'),
    ('emulate-inputs-empty-list', lambda: tk.emulate(BP, inputs=[]), RuntimeCheckError,
     'inputs= takes {name: [tensor of rank 0, ...]} or a'),
    ('emulate-inputs-list-of-int', lambda: tk.emulate(BP, inputs=[1]), RuntimeCheckError,
     'inputs must be a dict {name: [tensor of rank 0,'),
    ('emulate-inputs-missing', lambda: tk.emulate(BP, inputs={"a": make_inputs(BP, 0)["a"]}),
     RuntimeCheckError, "input 'b' is missing"),
    ('emulate-inputs-extra', lambda: tk.emulate(BP, inputs=ins(z=[])), RuntimeCheckError,
     "there is no input named 'z'"),
    ('emulate-inputs-int-name', lambda: tk.emulate(BP, inputs=ins(**{}) | {1: []}),
     RuntimeCheckError, 'there is no input named 1'),
    ('emulate-inputs-one-rank', lambda: tk.emulate(BP, inputs=ins(a=make_inputs(BP, 0)["a"][:1])),
     RuntimeCheckError, "input 'a' must be a list of 2 tensors, one per"),
    ('emulate-inputs-tensor-not-list', lambda: tk.emulate(BP, inputs=ins(a=torch.zeros(32, 32))),
     RuntimeCheckError, "input 'a' must be a list of 2 tensors, one per"),
    ('emulate-inputs-numpy',
     lambda: tk.emulate(BP, inputs=ins(a=[x.float().numpy() for x in make_inputs(BP, 0)["a"]])),
     RuntimeCheckError, "input 'a' of rank 0 is a ndarray, not a torch.Tensor"),
    ('emulate-inputs-shape',
     lambda: tk.emulate(BP, inputs=ins(a=[torch.zeros(64, 32, dtype=torch.bfloat16)] * 2)),
     RuntimeCheckError, "input 'a' of rank 0 has shape [64, 32], expected"),
    ('emulate-inputs-global-shape',
     lambda: tk.emulate(BP, inputs=ins(b=[torch.zeros(32, 32, dtype=torch.bfloat16)] * 2)),
     RuntimeCheckError, "input 'b' of rank 0 has shape [32, 32], expected"),
    ('emulate-inputs-dtype', lambda: tk.emulate(BP, inputs=ins(a=[torch.zeros(32, 32)] * 2)),
     RuntimeCheckError, "input 'a' of rank 0 is torch.float32, expected"),
    ('emulate-inputs-int-dtype',
     lambda: tk.emulate(BP, inputs=ins(a=[torch.zeros(32, 32, dtype=torch.int32)] * 2)),
     RuntimeCheckError, "input 'a' of rank 0 is torch.int32, expected"),
    ('emulate-inputs-0d', lambda: tk.emulate(BP, inputs=ins(a=[torch.tensor(1.0)] * 2)),
     RuntimeCheckError, "input 'a' of rank 0 is torch.float32, expected"),
    ('emulate-inputs-strided',
     lambda: tk.emulate(BP, inputs=ins(a=[torch.zeros(32, 64, dtype=torch.bfloat16)[:, ::2]] * 2)),
     RuntimeCheckError, "input 'a' of rank 0 is not contiguous"),
    ('emulate-inputs-sparse',
     lambda: tk.emulate(BP, inputs=ins(a=[torch.zeros(32, 32).to_sparse()] * 2)),
     RuntimeCheckError, "input 'a' of rank 0 has layout torch.sparse_coo; a"),
    ('emulate-inputs-nested',  # a RuntimeError traceback from torch ("doesn't support sizes")
     lambda: tk.emulate(BP, inputs=ins(a=[torch.nested.nested_tensor(
         [torch.zeros(32, 32, dtype=torch.bfloat16)] * 2)] * 2)),
     RuntimeCheckError, "input 'a' of rank 0 is a nested tensor; a dense tensor"),
    ('emulate-inputs-jagged',
     lambda: tk.emulate(BP, inputs=ins(a=[torch.nested.nested_tensor(
         [torch.zeros(3, 32), torch.zeros(5, 32)], layout=torch.jagged)] * 2)),
     RuntimeCheckError, "input 'a' of rank 0 is a nested tensor; a dense tensor"),
    ('emulate-inputs-requires-grad',  # ran, and the gradient was lost without a word
     lambda: tk.emulate(BP, inputs=ins(b=[x.clone().requires_grad_()
                                          for x in make_inputs(BP, 0)["b"]])),
     RuntimeCheckError, "input 'b' of rank 0 requires grad, but TileLink ops do not "
     "propagate gradients"),
    ('emulate-inputs-meta',
     lambda: tk.emulate(BP, inputs=ins(a=[torch.empty(32, 32, device="meta").bfloat16()] * 2)),
     RuntimeCheckError, "input 'a' of rank 0 is on meta; the emulated world"),
    ('emulate-inputs-calls-mismatch',
     lambda: tk.emulate(BP, calls=3, inputs=[make_inputs(BP, 0)] * 2), RuntimeCheckError,
     "inputs= holds 2 calls' inputs but calls=3"),
    ('check-pattern', lambda: tk.check(ag, None), UsageError,
     'tk.check needs the schedule or bound pattern of the'),
    ('check-none', lambda: tk.check(None, None), UsageError,
     'tk.check needs the schedule or bound pattern of the'),
    ('check-result-dict', lambda: tk.check(BP, {"c": []}), UsageError,
     "tk.check needs the result of tk.emulate, got {'c':"),
    ('bind-world-str', lambda: ag.bind({}, "2"), UsageError,
     "the world size must be an int, got '2' (str)"),
    ('bind-values-tuple', lambda: ag.bind((("M", 64),), 2), UsageError,
     'values must be a dict of parameter values, got tuple'),
    ('bind-values-int-key', lambda: ag.bind({None: 4}, 2), UsageError,
     'parameter names are strings, got None (NoneType)'),
    ('bind-W', lambda: ag.bind({"W": 8}, 2), PatternError,
     'W is the world size, not a parameter of pattern ag'),
    ('bind-values-string-float', lambda: ag.bind({"M": "64.0"}, 2), PatternError,
     "M = '64.0' is not an integer"),
    ('bind-values-nan', lambda: ag.bind({"M": float("nan")}, 2), PatternError,
     'M = nan is a float; sizes are integers'),
    ('bind-values-negative', lambda: ag.bind({"M": -64}, 2), PatternError,
     'M = -64 must be positive'),
    ('bind-values-dtype-int', lambda: ag.bind({"dtype": 2}, 2), PatternError,
     'dtype = 2 is not a dtype'),
    ('parse-bytes', lambda: tk.parse_text(b"pattern p()\n"), UsageError,
     'parse_text takes the source as a str, got bytes'),
    ('parse-none', lambda: tk.parse_text(None), UsageError,
     'parse_text takes the source as a str, got NoneType'),
    ('parse-path', lambda: tk.parse_text(Path(AG)), UsageError,
     'parse_text takes the source as a str, got PosixPath'),
    ('parse-huge', lambda: tk.parse_text("#" * (2**20 + 1)), DSLSyntaxError,
     '<string> is 1048577 characters long; a pattern is'),
    ('load-int', lambda: tk.load_pattern(3), UsageError,
     'a pattern path is a str or a path object, got int'),
    ('load-none', lambda: tk.load_pattern(None), UsageError,
     'a pattern path is a str or a path object, got NoneType'),
    ('load-empty', lambda: tk.load_pattern(""), LoadError, "cannot load a pattern from ''"),
    ('load-colon', lambda: tk.load_pattern(":"), LoadError, "cannot load a pattern from ':'"),
    ('load-py-empty-name', lambda: tk.load_pattern("examples/patterns.py:"), LoadError,
     "cannot load a pattern from 'examples/patterns.py:'"),
    ('load-py-bad-name', lambda: tk.load_pattern("examples/patterns.py:1x"), LoadError,
     "cannot load a pattern from 'examples/patterns.py:1x'"),
    ('load-py-missing-name', lambda: tk.load_pattern("examples/patterns.py:ag_gemmm"), LoadError,
     "examples/patterns.py has no pattern 'ag_gemmm'"),
    ('load-py-not-a-pattern', lambda: tk.load_pattern("examples/patterns.py:tk"), LoadError,
     'examples/patterns.py:tk is a module, not a pattern'),
    ('load-py-many', lambda: tk.load_pattern("examples/patterns.py"), LoadError,
     f'examples/patterns.py holds {PY_PATTERNS} patterns (ag_cols_gemm,'),
    ('load-tl-with-name', lambda: tk.load_pattern("examples/ag_gemm.tl:ag_gemm"), LoadError,
     "cannot load a pattern from 'examples/ag_gemm.tl:ag_gemm'"),
    ('load-text-py', lambda: tk.load_text("examples/patterns.py"), LoadError,
     'examples/patterns.py is a Python file; load_text'),
    ('load-text-none', lambda: tk.load_text(None), UsageError,
     'a pattern path is a str or a path object, got NoneType'),
    ('format-none', lambda: tk.format_text(None), UsageError,
     'format_text takes a Pattern, got NoneType'),
    ('format-str', lambda: tk.format_text(open(AG).read()), UsageError,
     'format_text takes a Pattern, got str'),
    ('tile-function-plain', lambda: tk.tile_function(reads={"x": "rows"})(plain), PatternError,
     '@tk.tile_function needs a @triton.jit function, got function'),
    ('tile-function-reads-str', lambda: tk.tile_function(reads="x")(jit_fn()), PatternError,
     'reads= must name the tensor parameters the function reads'),
    ('tile-function-reads-unknown', lambda: tk.tile_function(reads={"y": "rows"})(jit_fn()),
     PatternError, "k has no parameter 'y'"),
    ('tile-function-region', lambda: tk.tile_function(reads={"x": "cols"})(jit_fn()), PatternError,
     "unknown region kind 'cols'"),
    ('W-plus-str', lambda: tk.W + "a", UsageError,
     "W + 'a': a size is combined with ints and sizes"),
    ('W-times-float', lambda: tk.W * 1.5, UsageError,
     'W * 1.5: a size is combined with ints and sizes'),
    ('W-pow', lambda: tk.W ** 2, UsageError, 'W ** 2 needs the value of W, and sizes have none'),
    ('W-int', lambda: int(tk.W), UsageError, 'int(W) needs the value of W, and sizes have none'),
    ('W-compare', lambda: tk.W < 3, UsageError, 'comparing W < 3 needs the value of W, and sizes'),
    ('W-range', lambda: range(tk.W), UsageError,
     'using W as an int needs the value of W, and sizes'),
    ('input-outside', lambda: tk.input((4,), "bf16"), PatternError,
     'tk.input can only be called inside a @tk.pattern function'),
    ('gemm-outside', lambda: tk.gemm(None, None), PatternError,
     'tk.gemm can only be called inside a @tk.pattern function'),
    ('pattern-on-class', lambda: tk.pattern(int), PatternError,
     '@tk.pattern needs a function, got type'),
    ('pattern-on-lambda', lambda: tk.pattern(lambda M=4: None), PatternError,
     '@tk.pattern needs a named function, got <lambda>'),
    ('pattern-star-args', lambda: tk.pattern(lambda *a: None), PatternError,
     '@tk.pattern needs a named function, got <lambda>'),
    ('run-emulated-world', lambda: run_emulated(SRC(), 3, [make_inputs(BP, 0)]), RuntimeCheckError,
     'the module was generated for W = 2 ranks,'),
    ('run-emulated-no-calls', lambda: run_emulated(SRC(), 2, []), RuntimeCheckError,
     "run_emulated takes a non-empty list of calls'"),
    ('run-emulated-dict', lambda: run_emulated(SRC(), 2, make_inputs(BP, 0)), RuntimeCheckError,
     "run_emulated takes a non-empty list of calls'"),
    ('run-emulated-rows',
     lambda: run_emulated(SRC(), 2, [ins(a=[torch.zeros(16, 32, dtype=torch.bfloat16)] * 2)]),
     RuntimeCheckError, "input 'a' of rank 0 has shape [16, 32], expected"),
    ('run-emulated-not-python', lambda: run_emulated("def launch(:", 2, [make_inputs(BP, 0)]),
     RuntimeCheckError, "the source given to run_emulated is not Python:"),
    ('run-emulated-not-generated', lambda: run_emulated("x = 1\n", 2, [make_inputs(BP, 0)]),
     RuntimeCheckError, "the source given to run_emulated is not a module TileLink generated:"),
    ('run-emulated-raises', lambda: run_emulated("1 / 0\n", 2, [make_inputs(BP, 0)]),
     RuntimeCheckError, "importing the source given to run_emulated raised ZeroDivisionError"),
    ('run-emulated-bytes', lambda: run_emulated(b"x", 2, [make_inputs(BP, 0)]),
     RuntimeCheckError, "run_emulated takes the generated module's source text, got a bytes"),
    ('emulate-no-ops',  # an IndexError in codegen
     lambda: tk.emulate(tk.parse_text("pattern p(M = 64)\n    a : [M, 64] bf16 shard(0)\n"
                                      "    return a\n"), 2),
     PatternError, "pattern p has no ops: it returns its inputs unchanged"),
    ('compile-op-cpu', lambda: __import__("tilelink.runtime.gpu", fromlist=["c"]).compile_op(ag),
     NotSupportedError, 'compile_op runs on GPUs, and torch sees none'),
]

# messages of modules other than this suite's that have no hint yet (their owners')
NO_HINT_YET = {"emulate-config-bad-int"}


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_python_api_misuse(case):
    cid, call, cls, words = case
    with deadline(30), pytest.raises(TileLinkError) as e:
        call()
    err = e.value
    assert type(err) is cls, str(err)
    assert err.message.startswith(words), str(err)
    assert err.hint or cid in NO_HINT_YET, str(err)
    assert_clean(err)


def test_the_case_ids_are_unique():
    ids = [c[0] for c in PY_CASES + API_CASES]
    assert len(set(ids)) == len(ids) >= 180


# ---- generated classes ------------------------------------------------------------------------

JUNK = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=8),
                 st.binary(max_size=4), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.integers(), st.integers(), max_size=1))
# an option and a value of it that tk.emulate must refuse before running anything
BAD_OPTIONS = st.one_of(
    st.tuples(st.just("world_size"), JUNK.filter(lambda v: v is not None)
              | st.integers(max_value=0)),
    st.tuples(st.just("seed"), JUNK | st.integers(max_value=-1) | st.integers(min_value=2**63)),
    st.tuples(st.just("calls"), JUNK | st.integers(max_value=0)
              | st.integers(min_value=10_001)),
    st.tuples(st.just("timeout"), JUNK.filter(lambda v: not (isinstance(v, float) and v > 0
                                                              and math.isfinite(v)))
              | st.floats(max_value=0) | st.just(math.inf)),
    st.tuples(st.just("delays"), JUNK.filter(lambda v: not isinstance(v, bool))
              | st.integers()),
    st.tuples(st.just("fault"), JUNK.filter(lambda v: v is not None and not isinstance(v, str))),
    st.tuples(st.just("values"), JUNK.filter(lambda v: v is not None and not isinstance(v, dict))),
    st.tuples(st.just("config"), JUNK.filter(lambda v: v is not None and v != {})),
    st.tuples(st.just("first_epoch"), JUNK | st.integers(min_value=2**62 + 1)),
    st.tuples(st.just("inputs"), JUNK.filter(lambda v: v is not None)),
)


@pytest.mark.slow
@settings(max_examples=200, deadline=5000)
@given(option=BAD_OPTIONS)
def test_any_bad_emulate_option_is_refused_before_running(option):
    name, value = option
    with deadline(30), pytest.raises(TileLinkError) as e:
        tk.emulate(ag, **{name: value})
    assert isinstance(e.value, (UsageError, PatternError, RuntimeCheckError)), str(e.value)
    assert_clean(e.value)


@settings(max_examples=100, deadline=5000)
@given(pattern=JUNK | st.integers() | st.just(plain) | st.just(print))
def test_anything_but_a_pattern_is_refused(pattern):
    with deadline(30), pytest.raises(TileLinkError) as e:
        tk.emulate(pattern, 2)
    assert isinstance(e.value, (UsageError, tk.LoadError)), str(e.value)
    assert_clean(e.value)


@settings(max_examples=100, deadline=5000)
@given(dim=JUNK | st.integers(-2**80, 2**80) | st.tuples(st.integers()))
def test_any_object_as_a_dim_of_tk_input_binds_or_fails_cleanly(dim):
    def build(M=64):
        return tk.input((M, dim), "bf16")

    with deadline(30):
        try:
            bp = tk.pattern(build).bind({}, 2)
        except TileLinkError as err:
            assert_clean(err)
            assert err.loc is not None and err.loc.file == __file__
        else:
            assert isinstance(dim, int) and 0 < dim < 2**31
            assert bp.tensors["input_0"].shape == (64, dim)


@settings(max_examples=100, deadline=5000)
@given(value=JUNK | st.integers(-2**70, 2**70))
def test_any_object_as_an_attribute_binds_or_fails_cleanly(value):
    def build(M=64):
        a = tk.input((M, M), "bf16", shard=0)
        return tk.all_gather(a, dim=value)

    with deadline(30):
        try:
            bp = tk.pattern(build).bind({}, 2)
        except TileLinkError as err:
            assert_clean(err)
            assert err.loc is not None and err.loc.file == __file__
        else:
            assert value in (0, -2) and bp.op_attrs(bp.ops[0])["dim"] == 0


# ---- sizes no GPU holds: refused before any plan, from every Python entry point -----------

EXAMPLE_FILES = sorted((ROOT / "examples").glob("*.tl"))
# (no_planning: the fixture of tests/conftest.py)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_sizes_no_gpu_holds_are_refused_before_any_plan(path, no_planning):
    from tilelink.runtime.api import schedule_for

    pat = tk.load_pattern(str(path))
    for name in [p.name for p in pat.params if p.kind == "int"]:
        for value in SIZES_NO_GPU_HOLDS:
            seen = set()
            for call in (lambda: pat.bind({name: value}, 2),
                         lambda: schedule_for(pat, 2, {name: value}, None, "cuda:90"),
                         lambda: schedule_for(pat, 2, {name: value}, None, "interp"),
                         lambda: tk.emulate(pat, 2, {name: value}),
                         lambda: tk.emulate(str(path), 2, {name: value}, {"comm": "none"})):
                try:
                    with deadline(20):
                        call()
                except TileLinkError as e:
                    assert_clean(e)
                    assert e.loc is not None and e.loc.file == str(path), str(e)
                    assert e.hint, str(e)
                    seen.add(str(e))
                else:
                    # only bind may accept sizes within its bounds (a dim < 2**31, at most
                    # 512 GiB a rank): the schedule or the emulated world refuses them
                    assert call is not None and value == 2**31 - 2 and not seen, (name, value)
            assert seen, (name, value)
            if value != 2**31 - 2:  # past a bound of bind's: one refusal, whichever entry
                assert len(seen) == 1, seen
            assert no_planning == [], (name, value)


def test_all_the_tensors_one_rank_holds_are_bounded():
    from tilelink.ir.tensor import MAX_RANK_BYTES

    src = ("pattern p(R = 262144, C = 262144)\n"
           "    a : [R, C] int64\n"
           "    return a\n")
    pat = parse_text(src, "p.tl")
    assert pat.bind({}, 1).tensors["a"].local_bytes == MAX_RANK_BYTES == 2**39  # at the bound
    with pytest.raises(PatternError) as e:
        pat.bind({"C": 262145}, 1)
    assert e.value.message.startswith("pattern p is too large for any GPU: one rank would hold "
                                      "512 GiB of its tensors (a [262144, 262145] int64 512 GiB)")
    assert (e.value.loc.file, e.value.loc.line) == ("p.tl", 2)
    assert e.value.hint.startswith("one rank holds at most 512 GiB (2**39 bytes) of a "
                                   "pattern's inputs and results; check the sizes (-D)")


def test_op_results_count_towards_what_a_rank_holds():
    # AG-GEMM at M = 2**31 - 2: a is 256 GiB a rank, the gathered a_full 512 and c 384
    with pytest.raises(PatternError) as e:
        tk.load_pattern(AG).bind({"M": 2**31 - 2}, 2)
    assert "one rank would hold 1.1 TiB of its tensors (a_full [2147483646, 128] bf16 512 " \
           "GiB, c [2147483646, 96] bf16 384 GiB, a [1073741823, 128] bf16 256 GiB" in str(e.value)
    assert e.value.loc.line == 6  # a_full, the largest, where it is computed


def test_a_plan_too_large_to_derive_is_refused_at_the_op(no_planning):
    from tilelink.plan import TileSizes, build_plan
    from tilelink.plan.plan import MAX_PLAN_TILES

    bp = tk.load_pattern(AG).bind({"M": 2**21}, 2)
    with deadline(10), pytest.raises(NotSupportedError) as e:
        build_plan(bp, TileSizes(128, 128, 1, 0))  # one row a chunk
    assert e.value.message.startswith("the plan of all_gather (a_full) would have 2097152 "
                                      "tiles (chunk 2097152; tiles of block_m=128, "
                                      "block_n=128, comm_block_m=1, comm_block_n=0)")
    assert f"at most {MAX_PLAN_TILES} (2**20) tiles per op" in e.value.message
    assert "--config comm_block_m, comm_block_n" in e.value.hint
    assert e.value.loc.line == 6 and no_planning == []


def test_a_kernel_less_schedule_derives_its_plan_only_when_asked(no_planning):
    from tilelink.runtime.api import schedule_for

    s = schedule_for(tk.load_pattern(AG), 2, {"M": 2**27}, {"comm": "none"}, "cuda:90")
    assert s.kernel is None and no_planning == []  # nothing to run needs it
    small = schedule_for(tk.load_pattern(AG), 2, {}, {"comm": "none"}, "cuda:90")
    assert small.plan.grids["c"].size > 0 and no_planning == ["a_full"]  # derived on demand


@pytest.mark.parametrize("failure", [MemoryError(), RuntimeError(
    "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
    "to allocate 2147483648 bytes. Error code 12 (Cannot allocate memory)")])
@pytest.mark.parametrize("config", [{"comm": "none"}, {"comm": "sm"}])
def test_running_out_of_memory_in_the_emulated_world_is_a_clean_refusal(failure, config,
                                                                        monkeypatch):
    # under a process memory limit the first input's allocation failed with a traceback
    from tilelink.runtime import api

    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(api, "call_inputs", fail)
    with deadline(30), pytest.raises(NotSupportedError) as e:
        tk.emulate(AG, 2, {"M": 64, "N": 64, "K": 32}, config)
    assert e.value.message.startswith("out of memory allocating the tensors of ag_gemm (")
    assert e.value.loc.line == 6 and "smaller -D sizes" in e.value.hint


def test_other_runtime_errors_are_not_taken_for_memory(monkeypatch):
    from tilelink.runtime import api

    def fail(*args, **kwargs):
        raise RuntimeError("something else")

    monkeypatch.setattr(api, "call_inputs", fail)
    with pytest.raises(RuntimeError, match="something else"):
        tk.emulate(AG, 2, {"M": 64, "N": 64, "K": 32}, {"comm": "none"})


# ---- dtypes the ops do not take: the same refusal from every entry point -------------------

FLOAT_OPS = [  # (op, the pattern's body around it, the operand that gets the integer dtype)
    ("gemm", "a : [M, M] dtype\n    c = gemm(a, a)\n    return c", "a"),
    ("attention", "q : [M, 2, 4] dtype\n    c = attention(q, q, q)\n    return c", "q"),
    ("attention_partial", "q : [2, 2, 4] dtype\n    k : [2, M, 2, 4] dtype\n"
     "    c = attention_partial(q, k, k)\n    return c", "q"),
    ("lse_combine", "p : [M, 2, 5] dtype\n    c = lse_combine(p, splits = 1)\n    return c", "p"),
    ("grouped_gemm", "x : [M, 4] dtype\n    w : [2, 4, 4] dtype\n    ids : [M, 1] int32\n"
     "    c = grouped_gemm(x, w, ids)\n    return c", "x"),
]


@pytest.mark.parametrize("op,body,operand", FLOAT_OPS, ids=[c[0] for c in FLOAT_OPS])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_every_float_op_refuses_integer_operands_at_bind(op, body, operand, dtype):
    src = f"pattern p(M = 8, dtype = bf16)\n    {body}\n"
    pat = parse_text(src, "p.tl")
    for ok in ("bf16", "fp16", "fp32"):
        pat.bind({"dtype": ok}, 1)
    line = next(i for i, x in enumerate(src.splitlines(), 1) if f"= {op}(" in x)
    with pytest.raises(PatternError) as e:
        pat.bind({"dtype": dtype}, 1)
    assert e.value.message.startswith(f"{op} (c = {op}(")
    assert e.value.message.endswith(f"takes bf16, fp16 or fp32 tensors; its operand {operand} "
                                    f"is {dtype}")
    assert e.value.loc.line == line and f"at p.tl:{line}:" in e.value.message
    assert e.value.hint == (f"{operand} is {dtype} because the parameter dtype = {dtype}: pass "
                            "-D dtype=bf16 (or fp16, fp32); from Python, values={'dtype': "
                            "'bf16'}")


def test_collectives_move_integers_and_grouped_gemm_routes_by_them():
    src = ("pattern p(M = 8, dtype = int32)\n"
           "    a : [M, 4] dtype shard(0)\n"
           "    p : [M, 4] dtype\n"
           "    b = all_gather(a, dim = 0)\n"
           "    c = all_reduce(p)\n"
           "    d = reduce_scatter(p, dim = 0)\n"
           "    return b, c, d\n")
    bp = parse_text(src).bind({"dtype": "int64"}, 2)
    assert [bp.tensors[x].dtype for x in "bcd"] == ["int64"] * 3
    src = ("pattern p(M = 8)\n    x : [M, 4] bf16\n    w : [2, 4, 4] bf16\n"
           "    ids : [M, 1] fp32\n    c = grouped_gemm(x, w, ids)\n    return c\n")
    with pytest.raises(PatternError) as e:
        parse_text(src, "g.tl").bind({}, 1)
    assert e.value.message.endswith("takes int32 or int64 tensors; its operand ids is fp32")
    assert e.value.hint == "declare ids as int32 or int64"


def test_a_declared_integer_input_is_named_in_the_hint():
    src = "pattern p(M = 8)\n    a : [M, M] int32\n    c = gemm(a, a)\n    return c\n"
    with pytest.raises(PatternError) as e:
        parse_text(src, "p.tl").bind({}, 1)
    assert e.value.hint == "declare a as bf16, fp16 or fp32"
    assert e.value.loc.line == 3


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8", "bool", torch.int8, True])
def test_integer_dtypes_are_one_refusal_from_every_python_entry_point(dtype):
    from tilelink.runtime.api import schedule_for

    texts = []
    for call in (lambda: tk.load_pattern(AG).bind({"dtype": dtype}, 2),
                 lambda: schedule_for(tk.load_pattern(AG), 2, {"dtype": dtype}),
                 lambda: tk.emulate(AG, 2, {"dtype": dtype}),
                 lambda: tk.emulate(AG, 2, {"dtype": dtype}, {"comm": "none"}),
                 lambda: tk.emulate(f"{PATTERNS}:ag_gemm", 2, {"dtype": dtype})):
        with deadline(20), pytest.raises(PatternError) as e:
            call()
        assert_clean(e.value)
        assert "gemm (c = gemm(a_full, b), at " in e.value.message
        assert "takes bf16, fp16 or fp32 tensors" in e.value.message
        assert e.value.hint.endswith("-D dtype=bf16 (or fp16, fp32); from Python, "
                                     "values={'dtype': 'bf16'}")
        texts.append(str(e.value))
    assert len(set(texts[:4])) == 1, texts  # the .tl pattern: one message, whichever entry
    assert texts[4].startswith(f"{PATTERNS}:")  # the Python DSL's: at its own line
