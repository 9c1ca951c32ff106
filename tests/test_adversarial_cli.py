"""Malformed and adversarial command lines for run, compile, tune and bench.

Every case must end in exit code 2 (an argparse error with the usage line, or a TileLinkError
with a hint), name the bad value, print no traceback and finish within a bound. The CLI runs
in this process (fast); nothing here reaches a kernel.
"""

from __future__ import annotations

import os
import re

import pytest

from tilelink.runtime import emulated

from .adversarial import SIZES_NO_GPU_HOLDS, assert_refused, cli
from .conftest import EXAMPLES

AG = str(EXAMPLES / "ag_gemm.tl")
PATTERN_COMMANDS = ["compile", "run", "tune", "bench"]
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _argv(command: str, *extra: str) -> list[str]:
    return [command, AG, *extra]


def _value_error(option: str, value: str) -> list[str]:
    """What an argparse refusal of `value` for `option` must say."""
    return [f"argument {option}", repr(value), "usage: tilelink"]


# ---------------------------------------------------------------- whole-number options

BAD_WHOLE = ["0", "-1", "abc", "1.5", "", "1e3", "0x10", "nan", "99999999999999999999"]


@pytest.mark.parametrize("command", PATTERN_COMMANDS)
@pytest.mark.parametrize("value", BAD_WHOLE + ["257", "-999999"])
def test_world_size(command, value, capsys):
    assert_refused(_argv(command, "-W", value), _value_error("--world-size/-W", value) +
                   ["from 1 to 256"], capsys)


@pytest.mark.parametrize("value", BAD_WHOLE + ["100001"])
def test_run_calls(value, capsys):
    # --calls 0 / -1 --check printed "check: OK" having checked nothing
    assert_refused(_argv("run", "--check", "--calls", value),
                   _value_error("--calls", value), capsys)


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("value", ["-1", "4294967296", "99999999999999999999", "abc", "1.5",
                                   "", "nan"])
def test_seed(command, value, capsys):
    # 99999999999999999999 was an OverflowError traceback from torch.manual_seed
    assert_refused(_argv(command, "--seed", value), _value_error("--seed", value), capsys)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", "2147483648", ""])
def test_run_spin_limit(value, capsys):
    assert_refused(_argv("run", "--spin-limit", value), _value_error("--spin-limit", value),
                   capsys)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", ""])
def test_tune_top(value, capsys):
    # --top 0 showed every row and --top -1 none
    assert_refused(_argv("tune", "--emulate", "--top", value), _value_error("--top", value),
                   capsys)


@pytest.mark.parametrize("command,option,value", [
    (c, "--warmup", v) for c in ("tune", "bench") for v in ("-1", "abc", "1.5")] + [
    (c, "--iters", v) for c in ("tune", "bench") for v in ("0", "-1", "x")] + [
    ("bench", o, v) for o in ("--rounds", "--reps") for v in ("0", "-1")])
def test_timing_counts(command, option, value, capsys):
    assert_refused(_argv(command, option, value), _value_error(option, value), capsys)


@pytest.mark.parametrize("value,needle", [("0", "--budget must be >= 1"),
                                          ("-3", "--budget must be >= 1"),
                                          ("abc", "invalid int value: 'abc'")])
def test_tune_budget(value, needle, capsys):
    assert_refused(_argv("tune", "--emulate", "--budget", value), needle, capsys)


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_tune_time(value, capsys):
    assert_refused(_argv("tune", "--emulate", "--time", value),
                   ["--time must be > 0 and finite", f"got {value}", "hint:"],
                   capsys)


# ---------------------------------------------------------------- seconds

BAD_SECONDS = ["nan", "NaN", "inf", "-inf", "0", "-0", "-1", "abc", "", "1e308", "604801"]


@pytest.mark.parametrize("command", ["run", "tune"])
@pytest.mark.parametrize("value", BAD_SECONDS)
def test_timeout(command, value, capsys):
    # nan / inf switched the watchdog off (a hang never reported); 0 / -1 faked a hang.
    # (--timeout=VALUE: argparse reads a separate "-inf" as an option, not a value)
    assert_refused(_argv(command, f"--timeout={value}"), _value_error("--timeout", value) +
                   ["number of seconds > 0"], capsys)


# ---------------------------------------------------------------- choices, targets, stages


@pytest.mark.parametrize("value", ["ptx2", "", "TRITON", "cubin"])
def test_compile_emit_choice(value, capsys):
    assert_refused(_argv("compile", "--emit", value),
                   _value_error("--emit", value) + ["invalid choice"], capsys)


@pytest.mark.parametrize("value", ["mpi", "", "NVSHMEM"])
def test_run_backend_choice(value, capsys):
    assert_refused(_argv("run", "--backend", value),
                   _value_error("--backend", value) + ["invalid choice"], capsys)


@pytest.mark.parametrize("value", ["cuda", "", "hip:gfx000", "interp:90", "cuda:91", "x" * 500,
                                   "cuda:90 "])
def test_compile_unknown_target(value, capsys):
    assert_refused(_argv("compile", "--target", value), [f"unknown target '{value}'", "hint:"],
                   capsys)


@pytest.mark.parametrize("stage,target,needles", [
    # the interpreter target said "hint: stages: " with nothing after it
    ("ptx", "interp", ["--emit ptx: target interp runs in the Triton interpreter",
                       "hint: compile for a GPU target"]),
    ("ttir", "interp", ["--emit ttir: target interp", "or print what the interpreter runs"]),
    ("amdgcn", "cuda:90", ["--emit amdgcn is not a stage of target cuda:90",
                           "hint: stages: ttir, ttgir, llir, ptx"]),
    ("ptx", "hip:gfx942", ["--emit ptx is not a stage of target hip:gfx942",
                           "hint: stages: ttir, ttgir, llir, amdgcn"]),
])
def test_compile_stage_not_of_target(stage, target, needles, capsys):
    err = assert_refused(_argv("compile", "--emit", stage, "--target", target), needles, capsys)
    assert "stages: \n" not in err + "\n"


# ---------------------------------------------------------------- -D and --config items

MALFORMED = [("M", "is not NAME=VALUE"), ("=5", "is not NAME=VALUE"),
             (" =3", "is not NAME=VALUE"), ("M=", "gives M no value")]


@pytest.mark.parametrize("command", PATTERN_COMMANDS)
@pytest.mark.parametrize("item,words", MALFORMED)
def test_define_malformed(command, item, words, capsys):
    err = assert_refused(_argv(command, "-D", item), [f"-D '{item}' {words}",
                                                      "hint: write e.g. -D M=4096"], capsys)
    assert "--config" not in err


@pytest.mark.parametrize("command", PATTERN_COMMANDS)
def test_define_world_size_points_to_w(command, capsys):
    assert_refused(_argv(command, "-D", "W=4"), ["W is the world size", "hint: use -W 4"],
                   capsys)


@pytest.mark.parametrize("command", ["compile", "run"])
def test_define_given_twice(command, capsys):
    assert_refused(_argv(command, "-D", "M=128", "-D", "M=256"),
                   ["gives M twice (M=128 and M=256)", "hint: give M once"], capsys)


@pytest.mark.parametrize("item,needle", [
    ("M=abc", "M = 'abc' is not an integer"), ("M=-5", "M = -5 must be positive"),
    ("M=0", "M = 0 must be positive"), ("M=1.5", "M = '1.5' is not an integer"),
    ("M=1e9", "M = '1e9' is not an integer"), ("Q=3", "has no parameter 'Q'"),
    ("dtype=int128", "int128"), ("M=3", "multiple of 2"),
    ("M=99999999999999999999", "too large"),
])
def test_define_values_the_pattern_refuses(item, needle, capsys):
    assert_refused(_argv("compile", "-D", item), needle, capsys)


@pytest.mark.parametrize("command", ["compile", "run", "tune"])
@pytest.mark.parametrize("item,words", [("block_m", "is not NAME=VALUE"),
                                        ("=3", "is not NAME=VALUE"),
                                        ("block_m=", "gives block_m no value"),
                                        ("comm=", "gives comm no value")])
def test_config_malformed_hint_shows_a_config_item(command, item, words, capsys):
    # the hint suggested `--config M=4096`, a -D size
    err = assert_refused(_argv(command, "--config", item),
                         [f"--config '{item}' {words}", "hint: write e.g. --config block_m=128"],
                         capsys)
    assert "M=4096" not in err


@pytest.mark.parametrize("item,needle", [
    ("block_m=48", "power of two"), ("blockm=3", "unknown config key 'blockm'"),
    ("comm=carrier-pigeon", "comm=carrier-pigeon is not one of"),
    ("block_m=-64", "block_m=-64"), ("block_m=abc", "block_m='abc' must be an integer"),
    ("block_m=99999999999999999999", "block_m=99999999999999999999"),
    ("stages=0", "stages=0 is not one of"), ("warps=3", "warps=3 is not one of"),
    ("num_programs=0", "num_programs=0 must be in"), ("M=4096", "unknown config key 'M'"),
])
def test_config_values_the_schedule_refuses(item, needle, capsys):
    assert_refused(_argv("compile", "--config", item), needle, capsys)


@pytest.mark.parametrize("item,needle", [("block_m=48", "power of two"),
                                         ("comm=carrier-pigeon", "is not one of")])
def test_run_config_refused_before_any_rank_starts(item, needle, capsys):
    assert_refused(_argv("run", "--config", item), needle, capsys)


# ---------------------------------------------------------------- pattern paths


@pytest.fixture
def paths(tmp_path):
    (tmp_path / "dir.tl").mkdir()
    os.mkfifo(tmp_path / "fifo.tl")
    (tmp_path / "notes.txt").write_text("pattern")
    deep = "/".join(["d" * 200] * 25)  # longer than PATH_MAX
    return {
        "missing": (str(tmp_path / "missing.tl"), "no such pattern file"),
        "a directory": (str(tmp_path / "dir.tl"), "is a directory"),
        "a FIFO": (str(tmp_path / "fifo.tl"), "is not a file"),
        "a name too long": (str(tmp_path / ("x" * 300 + ".tl")), "File name too long"),
        "a path too long": (str(tmp_path / deep) + ".tl", "too long"),
        "under a FIFO": (str(tmp_path / "fifo.tl" / "x.tl"), "not a directory"),
        "a wrong suffix": (str(tmp_path / "notes.txt"), "cannot load a pattern from"),
        "empty": ("", "cannot load a pattern from ''"),
        "a missing .py": (str(tmp_path / "missing.py") + ":f", "no such pattern file"),
        "a bad function name": (str(EXAMPLES / "patterns.py") + ":not a name",
                                "cannot load a pattern from"),
        "a missing function": (str(EXAMPLES / "patterns.py") + ":nope", "has no pattern 'nope'"),
    }


PATH_CASES = ["missing", "a directory", "a FIFO", "a name too long", "a path too long",
              "under a FIFO", "a wrong suffix", "empty", "a missing .py", "a bad function name",
              "a missing function"]


@pytest.mark.parametrize("command", PATTERN_COMMANDS)
@pytest.mark.parametrize("case", PATH_CASES)
def test_pattern_path(command, case, paths, capsys):
    # a name longer than the file system allows was an OSError traceback; a FIFO must not
    # block
    path, needle = paths[case]
    if command == "bench" and not path:  # (bench's pattern is optional: --suite instead)
        needle = "bench needs a pattern or --suite design"
    err = assert_refused([command, path], needle, capsys)
    assert len(err) < 2000  # a long path is shortened, not echoed whole


@pytest.mark.skipif(IS_ROOT, reason="root reads any file")
@pytest.mark.parametrize("command", ["compile", "run"])
def test_unreadable_pattern(command, tmp_path, capsys):
    path = tmp_path / "secret.tl"
    path.write_text((EXAMPLES / "ag_gemm.tl").read_text())
    path.chmod(0)
    assert_refused([command, str(path)], ["cannot read", "secret.tl"], capsys)


def test_nul_in_a_path_is_refused(capsys):
    assert_refused(["compile", "bad\0name.tl"], "embedded null byte", capsys)


# ---------------------------------------------------------------- GPU-only run options


@pytest.mark.parametrize("extra,named", [
    (["--graph"], "--graph applies"), (["--backend", "nvshmem"], "--backend applies"),
    (["--backend", "nvshmem-ptr"], "--backend applies"), (["--spin-limit", "5"], "--spin-limit"),
    (["--graph", "--spin-limit", "5"], "--graph, --spin-limit apply"),
    (["--emulate", "--graph"], "--emulate was given"),
])
def test_gpu_only_options_are_refused_on_the_emulated_world(extra, named, capsys):
    # they were silently ignored there
    assert_refused(_argv("run", *extra), [named, "GPU runs only", "emulated world", "hint: drop"],
                   capsys)


@pytest.mark.parametrize("command", [["run"], ["tune", "--emulate"]])
@pytest.mark.parametrize("world", ["65", "128", "256"])
def test_a_world_too_large_to_emulate(command, world, monkeypatch, capsys):
    monkeypatch.setattr(emulated, "_cores", lambda: 2)  # as on a 2-core CI machine
    monkeypatch.setattr(emulated, "_available_memory", lambda: 64 << 30)
    m = str(32 * int(world))
    assert_refused([command[0], AG, *command[1:], "-W", world, "-D", f"M={m}", "-D",
                    f"N={8 * int(world)}"],
                   [f"at most 64 ranks here, not {world}", "hint: use -W 8"], capsys)


# ---------------------------------------------------------------- the command line itself


@pytest.mark.parametrize("argv,needle", [
    ([], "the following arguments are required: command"),
    (["nope"], "invalid choice: 'nope'"),
    (["run"], "the following arguments are required: pattern"),
    (["run", AG, "--nope"], "unrecognized arguments: --nope"),
    (["compile", AG, "--emit"], "expected one argument"),
    (["run", AG, "--calls"], "expected one argument"),
    (["tune", AG, "--top"], "expected one argument"),
    (["bench", "--suite", "everything"], "invalid choice: 'everything'"),
])
def test_malformed_command_lines(argv, needle, capsys):
    assert_refused(argv, needle, capsys)


# ---------------------------------------------------------------- sizes no GPU holds

# every entry point that takes a pattern and sizes: each must refuse them before a plan is
# derived (a MemoryError, an OverflowError or minutes of planning before)
SIZE_ENTRY_POINTS = [["compile", "--emit", "plan"], ["compile", "--emit", "schedule"],
                     ["compile", "--emit", "triton"], ["run", "--check"], ["tune"], ["bench"]]


@pytest.mark.parametrize("command", SIZE_ENTRY_POINTS, ids=" ".join)
@pytest.mark.parametrize("param", ["M", "N", "K"])
@pytest.mark.parametrize("value", [str(v) for v in SIZES_NO_GPU_HOLDS])
def test_sizes_no_gpu_holds_are_refused_before_planning(command, param, value, no_planning,
                                                        capsys):
    err = assert_refused([command[0], AG, *command[1:], "-D", f"{param}={value}"],
                         ["too large", "hint: "], capsys)
    assert err.startswith(f"{AG}:"), err  # located in the pattern
    assert no_planning == []


@pytest.mark.parametrize("command", SIZE_ENTRY_POINTS[:4], ids=" ".join)
@pytest.mark.parametrize("define,line", [("M=16777216", 4), ("K=8388608", 4), ("N=16777216", 5)])
def test_sizes_past_the_kernels_int32_offsets_are_refused_before_planning(
        command, define, line, no_planning, capsys):
    # a GPU holds these (4 GiB a tensor), the overlapped kernels cannot index them: refused
    # at the tensor's declaration, before the plan (it took a minute to derive first)
    err = assert_refused([command[0], AG, *command[1:], "-D", define, "--config", "comm=sm"],
                         ["int32 offsets", "fewer than 1073741824 (2**30) per rank's tensor",
                          "hint: use --config comm=none"], capsys)
    assert f"{AG}:{line}:5: config error: tensor " in err, err
    assert no_planning == []


def test_the_non_overlapped_plan_of_large_sizes_is_not_planned_until_shown(no_planning,
                                                                          capsys):
    big = ["-D", "M=134217728", "--config", "comm=none"]  # 72 GiB a rank: an H200 holds it
    code, out, err, took = cli(["compile", AG, *big, "--emit", "schedule"], capsys)
    assert code == 0 and "kernels: none: the non-overlapped plan" in out, err
    assert no_planning == [] and took < 10
    # --emit plan would derive 2**21 tiles: refused at the op, with what to change
    err = assert_refused(["compile", AG, *big, "--emit", "plan"],
                         ["the plan of gemm (c) would have 2097152 tiles (rank 2 x m 1048576 x n "
                          "1;", "takes at most 1048576 (2**20) tiles per op",
                          "hint: use smaller sizes (-D) or fewer ranks, or larger tiles "
                          "(--config block_m, block_n)"], capsys)
    assert err.startswith(f"{AG}:7:9: not supported: ")
    assert no_planning == []


def test_the_emulated_world_refuses_sizes_this_machine_cannot_hold(monkeypatch, capsys):
    monkeypatch.setattr(emulated, "_available_memory", lambda: 64 << 30)
    err = assert_refused(["run", AG, "--check", "-D", "M=134217728", "--config", "comm=none"],
                         ["the emulated world needs at least 528 GiB for these sizes (2 ranks, "
                          "each holding 40 GiB of inputs and outputs per call for 3 call(s) and "
                          "a reference of 144 GiB; the largest tensor is a_full, 32 GiB per "
                          "rank); 64 GiB of memory are available here",
                          "hint: use smaller -D sizes"],
                         capsys)
    assert f"{AG}:6:14: not supported" in err


# ---------------------------------------------------------------- dtypes the ops do not take

DTYPE_ENTRY_POINTS = [["compile", "--emit", "ir"], ["compile", "--emit", "plan"],
                      ["compile", "--emit", "schedule"], ["compile", "--emit", "triton"],
                      ["run", "--check"], ["run", "--check", "--config", "comm=none"],
                      ["run", "--check", "--config", "comm=sm"], ["tune"], ["bench"]]
EVERY_EXAMPLE = sorted(str(p) for p in EXAMPLES.glob("*.tl")) + [
    f"{EXAMPLES / 'patterns.py'}:{f}" for f in ("ag_rmsnorm", "ag_gemm_bias", "flash_decode")]


@pytest.mark.parametrize("pattern", EVERY_EXAMPLE, ids=lambda p: p.rsplit("/", 1)[-1])
@pytest.mark.parametrize("dtype", ["int32", "int64", "int8", "bool"])
def test_integer_dtypes_on_float_ops_are_one_located_refusal_everywhere(pattern, dtype, capsys):
    # int32 / int64 ran the non-overlapped plan (a torch GEMM of ints, "check: OK") or ended
    # in a config error naming a lowering; int8 / bool were "not a dtype" with int32 and
    # int64 offered. Now: the same message from every entry point, naming the op and place
    # and the dtypes that work.
    errors = {" ".join(c): assert_refused([c[0], pattern, *c[1:], "-D", f"dtype={dtype}"],
                                          ["takes bf16, fp16 or fp32 tensors", f"{dtype}",
                                           "hint: ", "-D dtype=bf16 (or fp16, fp32)"], capsys)
              for c in DTYPE_ENTRY_POINTS}
    assert len(set(errors.values())) == 1, errors
    err = next(iter(errors.values()))
    assert re.search(r"\b(gemm|grouped_gemm|attention|attention_partial|map|group_by_dest) \(\w+ = \w+\(.*\), "
                     r"at [^ ]+:\d+:\d+\)", err), err
    if dtype in ("int8", "bool"):
        assert f"dtype = {dtype} is not a dtype (TileLink's are bf16, fp16, fp32, int32, " \
               "int64)" in err
    else:
        assert f"is {dtype}" in err and f"because the parameter dtype = {dtype}" in err


# ---------------------------------------------------------------- lse_combine's splits


@pytest.mark.parametrize("command", [["compile", "--emit", "plan"], ["compile", "--emit", "triton"],
                                     ["run", "--check"]], ids=" ".join)
@pytest.mark.parametrize("splits,needle", [
    ("-1", "lse_combine(splits = -1): splits is the number of partials stacked on dim 0"),
    ("0", "lse_combine(splits = 0): splits is the number of partials stacked on dim 0"),
    ("1", "lse_combine(splits = 1): parts stacks 2 partials on dim 0"),
    ("4", "lse_combine(splits = 4): parts stacks 2 partials on dim 0"),
])
def test_lse_combine_splits_that_are_not_the_gathered_partials(command, splits, needle, tmp_path,
                                                               capsys):
    # -1 was a ValueError traceback from the plan; 0 silently meant W; 1 and 4 ran and the
    # check passed (the reference combined the same wrong rows)
    path = tmp_path / "fd.tl"
    path.write_text((EXAMPLES / "flash_decode.tl").read_text().replace(
        "lse_combine(parts)", f"lse_combine(parts, splits = {splits})"))
    err = assert_refused([command[0], str(path), *command[1:]], [needle, "hint: write splits"],
                         capsys)
    assert err.startswith(f"{path}:9:")


@pytest.mark.parametrize("command", [["compile", "--emit", "ir"], ["run", "--check"]],
                         ids=" ".join)
@pytest.mark.parametrize("dim", [1, 2, -1])
@pytest.mark.parametrize("splits", ["", ", splits = 2"])
def test_lse_combine_of_partials_gathered_along_another_dim(command, dim, splits, tmp_path,
                                                            capsys):
    # gathered along dim 1 (heads) or 2 (columns) the partials sit side by side in a row;
    # lse_combine split rows instead, ran and the check passed on a meaningless result
    path = tmp_path / "fd.tl"
    path.write_text((EXAMPLES / "flash_decode.tl").read_text().replace(
        "all_gather(part, dim = 0)", f"all_gather(part, dim = {dim})").replace(
        "lse_combine(parts)", f"lse_combine(parts{splits})"))
    shown = dim % 3
    err = assert_refused([command[0], str(path), *command[1:]],
                         ["lse_combine combines partials stacked on dim 0, but parts holds them "
                          f"along another dim: all_gather at {path}:8:13 gathers part along "
                          f"dim {shown}",
                          "hint: gather the partials along dim 0: parts = all_gather(part, "
                          "dim = 0)"], capsys)
    assert err.startswith(f"{path}:9:21: error: "), err


# ---------------------------------------------------------------- repeated --config options


def test_repeated_config_options_are_merged(capsys):
    # `--config block_m=64 --config order=natural` ran (and certified) block_m=32: argparse
    # kept the last --config only
    code, out, err, _ = cli(_argv("compile", "--emit", "schedule", "--config", "comm=sm",
                                  "block_m=64", "--config", "order=natural"), capsys)
    config = next(line for line in out.splitlines() if line.startswith("config: "))
    assert code == 0 and "comm=sm" in config and "block_m=64" in config \
        and "order=natural" in config, out + err


@pytest.mark.parametrize("command", PATTERN_COMMANDS)
def test_every_command_merges_its_config_options(command):
    from tilelink.cli.main import build_parser

    args = build_parser().parse_args(_argv(command, "--config", "comm=sm", "block_m=64",
                                           "--config", "order=natural"))
    assert args.config == ["comm=sm", "block_m=64", "order=natural"]


@pytest.mark.parametrize("command", PATTERN_COMMANDS)
def test_a_config_key_given_twice_with_two_values_is_refused(command, capsys):
    assert_refused(_argv(command, "--config", "block_m=64", "--config", "block_m=32"),
                   ["--config gives block_m twice (block_m=64 and block_m=32)",
                    "hint: give block_m once"], capsys)


@pytest.mark.parametrize("command", PATTERN_COMMANDS)
def test_help_says_how_config_options_combine(command, capsys):
    cli([command, "--help"], capsys)  # (argparse exits 0 after printing)
    code, out, _, _ = cli([command, "--help"], capsys)
    assert code == 0 and "are merged" in " ".join(out.split())


# ---------------------------------------------------------------- options that would be ignored


@pytest.mark.parametrize("extra,named", [
    (["--json", "x.json"], "--json"), (["--tuned"], "--tuned"), (["--graph"], "--graph"),
    (["--systems", "gemm"], "--systems"), (["--iters", "3"], "--iters"),
    (["--warmup", "0"], "--warmup"), (["--rounds", "2"], "--rounds"), (["--reps", "2"], "--reps"),
    (["--seed", "3"], "--seed"), (["-W", "4"], "--world-size"), (["--world", "gpus"], "--world"),
])
def test_bench_from_refuses_the_options_of_a_measuring_run(extra, named, tmp_path, capsys):
    # --from measures nothing: these were accepted and ignored without a word
    from tilelink.bench.report import dump_json

    saved = tmp_path / "run.json"
    dump_json([], {}, str(saved))
    err = assert_refused(["bench", "--from", str(saved), *extra],
                         ["measures nothing", named, f"hint: drop {named}"], capsys)
    assert "x.json" not in os.listdir(tmp_path)


@pytest.mark.parametrize("extra,named", [(["--warmup", "0"], "--warmup"),
                                         (["--iters", "4"], "--iters"), (["--force"], "--force"),
                                         (["--iters", "4", "--force"], "--iters, --force")])
def test_emulated_tune_refuses_the_gpu_timing_options(extra, named, capsys):
    assert_refused(_argv("tune", "--emulate", *extra),
                   [named, "tuning on GPUs only", "times nothing", "--emulate was given",
                    "hint: drop"], capsys)


# ---------------------------------------------------------------- the --calls limit


def test_calls_has_one_limit_and_says_why(capsys):
    # the CLI took 100000 calls (3.4 GB at the smallest sizes, and no end); the API 10000
    import tilelink as tk
    from tilelink.cli.main import build_parser
    from tilelink.errors import UsageError
    from tilelink.runtime.inputs import MAX_CALLS

    assert build_parser().parse_args(_argv("run", "--calls", str(MAX_CALLS))).calls == MAX_CALLS
    err = assert_refused(_argv("run", "--calls", str(MAX_CALLS + 1)),
                         _value_error("--calls", str(MAX_CALLS + 1)) +
                         [f"from 1 to {MAX_CALLS}", "made up front and kept"], capsys)
    with pytest.raises(UsageError) as api:
        tk.emulate(AG, 2, calls=MAX_CALLS + 1)
    assert f"from 1 to {MAX_CALLS}" in str(api.value) and "made up front" in str(api.value)
    assert err


# ---------------------------------------------------------------- debug knobs in tune


@pytest.mark.parametrize("extra", [[], ["--emulate"]])
def test_tune_refuses_debug_knobs(extra, capsys):
    # `tune --config debug_reverse_roles=1` ran ~14 minutes of designed deadlocks
    assert_refused(_argv("tune", *extra, "--config", "debug_reverse_roles=1"),
                   ["debug_reverse_roles=1: debug knobs are not tuned", "deadlock",
                    "hint: drop --config debug_reverse_roles"], capsys)


# ---------------------------------------------------------------- bench's files


@pytest.fixture
def saved_run(tmp_path):
    from tilelink.bench.report import BenchResult, dump_json

    row = BenchResult(pattern="p", ops="all_gather>gemm", sizes={"M": 64, "N": 64, "K": 32},
                      world=2, flops_per_rank=1 << 20, comm_bytes_per_rank=1 << 12,
                      steady_ms={"tilelink": 1.0, "gemm": 0.5, "nccl_comm": 0.4})
    path = tmp_path / "run.json"
    dump_json([row], {"date": "today"}, str(path))
    return path


@pytest.mark.parametrize("what,needle", [
    ("a FIFO", "not a regular file (a FIFO)"),  # blocked forever in open()
    ("/dev/zero", "not a regular file (a character device)"),  # read until 6.9 GB
    ("a directory", "not a regular file (a directory)"),
    ("nested", "nested too deeply"),  # a RecursionError traceback
    ("nested results", "nested too deeply"),
    ("a field of the wrong kind", "field 'steady_ms' holds a str"),  # AttributeError later
    ("too large", "more than any saved run"),
])
def test_bench_from_reads_regular_bounded_json_only(what, needle, tmp_path, monkeypatch, capsys):
    from tilelink.bench import files

    path = tmp_path / "r.json"
    if what == "a FIFO":
        os.mkfifo(path)
    elif what == "/dev/zero":
        path = "/dev/zero"
    elif what == "a directory":
        path.mkdir()
    elif what == "nested":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif what == "nested results":
        path.write_text('{"results": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif what == "a field of the wrong kind":
        path.write_text('{"results": [{"pattern": "p", "ops": "gemm", "sizes": {}, "world": 2, '
                        '"flops_per_rank": 1, "comm_bytes_per_rank": 1, "steady_ms": "x"}]}')
    elif what == "too large":
        monkeypatch.setattr(files, "MAX_JSON_BYTES", 100)
        path.write_text('{"results": []' + " " * 200 + "}")
    assert_refused(["bench", "--from", str(path)], [f"--from {path}", needle,
                                                    "hint: give a JSON written by"], capsys)


@pytest.mark.slow
def test_bench_plot_replaces_a_planted_link_instead_of_writing_through_it(saved_run, tmp_path,
                                                                          capsys):
    pytest.importorskip("matplotlib")
    victim = tmp_path / "victim"  # another user's file (root-owned 0600 became a PNG)
    victim.write_text("precious\n")
    victim.chmod(0o600)
    chart = tmp_path / "chart.png"
    os.symlink(victim, chart)
    code, out, err, _ = cli(["bench", "--from", str(saved_run), "--plot", str(chart)], capsys)
    assert code == 0, err
    assert victim.read_text() == "precious\n"
    assert not os.path.islink(chart) and chart.read_bytes()[:4] == b"\x89PNG"
    assert sorted(os.listdir(tmp_path)) == ["chart.png", "run.json", "victim"]  # no temporary


def test_bench_json_replaces_a_planted_link_instead_of_writing_through_it(saved_run, tmp_path):
    from tilelink.bench.report import dump_json, load_json

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out.json"
    os.symlink(victim, out)
    meta, rows = load_json(str(saved_run))
    dump_json(rows, meta, str(out))
    assert victim.read_text() == "precious\n" and not os.path.islink(out)
    assert load_json(str(out))[1] == rows


@pytest.mark.parametrize("option", ["--plot", "--json"])
@pytest.mark.parametrize("what,needle", [("a directory", "a directory is in its place"),
                                         ("a FIFO", "a FIFO is in its place"),
                                         ("a missing folder", "does not exist"),
                                         ("under /proc", "cannot write in '/proc'")])
def test_bench_outputs_that_cannot_be_written_are_refused_before_measuring(
        option, what, needle, saved_run, tmp_path, capsys):
    if option == "--plot":
        pytest.importorskip("matplotlib")
    suffix = ".png" if option == "--plot" else ".json"
    target = tmp_path / f"out{suffix}"
    if what == "a directory":
        target.mkdir()
    elif what == "a FIFO":
        os.mkfifo(target)
    elif what == "a missing folder":
        target = tmp_path / "missing" / f"out{suffix}"
    else:
        target = f"/proc/out{suffix}"
    # a measuring run refuses it first (no GPU is looked for): exit 2, no traceback
    err = assert_refused(_argv("bench", option, str(target)), [f"{option} {target}", needle,
                                                                "hint: "], capsys)
    assert "CUDA GPUs" not in err
    if option == "--plot":  # and so does a re-plot, before printing anything
        assert_refused(["bench", "--from", str(saved_run), option, str(target)], needle, capsys)


# ---------------------------------------------------------------- a pattern with no ops


@pytest.mark.parametrize("command", [["compile"], ["compile", "--emit", "ttir"], ["run"],
                                     ["tune"], ["bench"]], ids=" ".join)
def test_a_pattern_with_no_ops_is_a_located_refusal(command, tmp_path, capsys):
    # an IndexError traceback in codegen (no kernel to take the warps of)
    path = tmp_path / "ident.tl"
    path.write_text("pattern ident(M = 64, dtype = bf16)\n    a : [M, 64] dtype shard(0)\n"
                    "    return a\n")
    err = assert_refused([command[0], str(path), *command[1:]],
                         [f"{path}:1:9: error: pattern ident has no ops",
                          "hint: compute what it returns with ops"], capsys)
    assert "IndexError" not in err


@pytest.mark.parametrize("stage", ["ir", "plan", "schedule"])
def test_a_pattern_with_no_ops_still_prints_its_ir_plan_and_schedule(stage, tmp_path, capsys):
    path = tmp_path / "ident.tl"
    path.write_text("pattern ident(M = 64, dtype = bf16)\n    a : [M, 64] dtype shard(0)\n"
                    "    return a\n")
    code, out, err, _ = cli(["compile", str(path), "--emit", stage], capsys)
    assert code == 0 and out and "Traceback" not in err, err
