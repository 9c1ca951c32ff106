"""The generated modules that AG-GEMM and GEMM-RS users run today, as a fixed set of renders.

Rendering is pure (IR + plan + schedule -> text), so a change of the code generator that is
meant to keep these kernels as they are can be checked on the CPU: `test_golden_renders.py`
re-renders every case listed here and compares its SHA-256 with `golden/renders.json`.

The set: the bench's design shapes (the defaults the bench and the Python API take, and the
`gemm=ws` variants the next GPU runs name), the tuner's whole eager and CUDA-graph space at
one AG and one GEMM-RS shape, every GPU case of `test_dist.py` at every world size it runs
at, the emulated world's tuner space for the shipped examples, AG-MoE's kernel on both
comm resources, EP MoE's all_to_all kernels (one expert per rank, and top-k routing with
its combine as a receive step), sequence-parallel attention's kernel (causal and not),
Ulysses attention's and flash-decode's over a ragged batch (per-sequence lengths); on
cuda:90, cuda:80, hip:gfx942, the NVSHMEM flavour and the interpreter.

    python -m tests.golden_renders --write            # record the current renders' hashes
                                                      # (and the readable renders' texts)
    python -m tests.golden_renders --dump DIR         # write every render's text into DIR
    python -m tests.golden_renders --check            # what the test does

To explain a difference: `--dump` at the old and the new commit, then `diff -r`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "renders.json"
# one render per (pattern, target, lowerings) as text (`.txt`: generated code, not the
# project's), so a change to generated code shows as a diff a reviewer reads
READABLE = GOLDEN.parent / "readable"
GPU_TARGETS = ("cuda:90", "cuda:80", "hip:gfx942", "cuda:90+nvshmem")
# (examples file, M, N, K): the bench's design shapes (N and K global)
DESIGN = {
    "ag_gemm.tl": [(8192, 8192, 8192), (8192, 28672, 8192), (8192, 49152, 12288),
                   (2048, 28672, 8192), (1024, 8192, 8192)],
    "gemm_rs.tl": [(8192, 8192, 28672), (8192, 8192, 29568), (8192, 8192, 8192),
                   (2048, 8192, 28672)],
}
# the shapes whose whole tuner space is rendered (one per pattern; small enough to plan fast)
SPACE_SHAPES = {"ag_gemm.tl": (2048, 28672, 8192), "gemm_rs.tl": (2048, 8192, 28672)}
WS = {"ag_gemm.tl": {"comm": "copy_engine", "gemm": "ws"},
      "gemm_rs.tl": {"comm": "copy_engine", "reduce_after": "1", "gemm": "ws"}}


def _readable_name(s) -> str:
    """The readable render's file name a schedule falls under: its pattern, target and the
    lowerings composing it (one file per such combination)."""
    lowerings = sorted({type(lw).__name__ for lw in s.composition.lowerings.values()})
    target = s.target.name.replace(":", "").replace("+", "-")
    return f"{s.bound.name}.{target}.{'-'.join(lowerings)}.txt"


def _cases():
    """Yield (key, thunk, readable file name) for every render of the set; the thunk
    returns the module text."""
    from tilelink.codegen import render_triton
    from tilelink.frontend import load_pattern
    from tilelink.schedule import get_target, make_schedule
    from tilelink.tune.space import candidates

    patterns = {f: load_pattern(str(ROOT / "examples" / f)) for f in DESIGN}

    def key(bp, target, cfg) -> str:
        return f"{bp.name}|{bp.sizes_str()}|W={bp.world}|{target}|{cfg}"

    def render(bp, target, overrides=None, base=None, allow_fallback=True):
        s = make_schedule(bp, get_target(target), overrides, base=base,
                          allow_fallback=allow_fallback)
        return key(bp, target, s.config), s

    seen = set()

    def emit(k, s):
        if k not in seen and s.config.comm != "none":
            seen.add(k)
            yield k, (lambda s=s: render_triton(s)), _readable_name(s)

    # the design shapes: the overlapped default and gemm=ws, W = 2 and 4
    for f, shapes in DESIGN.items():
        for m, n, k in shapes:
            for w in (2, 4):
                bp = patterns[f].bind({"M": m, "N": n, "K": k}, w)
                for target in GPU_TARGETS:
                    yield from emit(*render(bp, target, allow_fallback=False))
                yield from emit(*render(bp, "cuda:90", WS[f]))
    # the tuner's whole space at one shape per pattern (eager and CUDA-graph spaces)
    for f, (m, n, k) in SPACE_SHAPES.items():
        bp = patterns[f].bind({"M": m, "N": n, "K": k}, 2)
        for target in GPU_TARGETS:
            t = get_target(target)
            space = candidates(bp, t)
            try:
                space += candidates(bp, t, graph=True)
            except Exception:  # (no capturable config on this target)
                pass
            for cfg in space:
                yield from emit(*render(bp, target, base=cfg))
    # every GPU case at every world size it runs at
    from tests.test_dist_cases_schedule import ALL, ONE_GPU

    for name, spec in sorted((ALL | ONE_GPU).items()):
        # (a composed case runs at W = 1 and on multi-GPU hosts: both)
        for w in ((1,) if name in ONE_GPU else ()) + ((2, 4, 8) if name in ALL else ()):
            bp = load_pattern(spec.pattern).bind(spec.values, w)
            target = "cuda:90+nvshmem" if spec.backend == "nvshmem" else "cuda:90"
            yield from emit(*render(bp, target, spec.config or None))
    # the emulated world: every shipped kernel example, W = 1..4, its tuner space
    for f in DESIGN:
        for w in (1, 2, 4):  # (the examples' default sizes do not divide by 3)
            bp = patterns[f].bind({}, w)
            yield from emit(*render(bp, "interp"))
            for cfg in candidates(bp, get_target("interp")):
                yield from emit(*render(bp, "interp", base=cfg))
    def example(file, gpu_sizes, comms=("sm",)):
        """An example's renders: each of `comms` in the emulated world at W = 1, 2, 4 (its
        default sizes), then SMs on every GPU target at `gpu_sizes`, W = 2."""
        pattern = load_pattern(str(ROOT / "examples" / file))
        for comm in comms:
            for w in (1, 2, 4):
                yield from emit(*render(pattern.bind({}, w), "interp", {"comm": comm}))
        bp = pattern.bind(gpu_sizes, 2)
        for target in GPU_TARGETS:
            yield from emit(*render(bp, target, {"comm": "sm"}))

    # AG-MoE (the grouped GEMM's kernel after an all_gather): both comm resources in the
    # emulated world (the grouped lowering refuses the copy engine's gather on GPU targets)
    yield from example("ag_moe.tl", {"T": 1200, "K": 1000, "N": 1200}, ("sm", "copy_engine"))
    # MoE-RS (the combine in the grouped GEMM's epilogue, chunks reduce-scattered)
    yield from example("moe_rs.tl", {"T": 1200, "K": 1024, "N": 1024})
    # EP MoE (all_to_all's pushes by run-time counts, the GEMM waiting per chunk and skipping
    # tiles past a source's count, the combine in a kernel of its own), at GPU sizes off the
    # tiles
    yield from example("ep_moe.tl", {"T": 1000, "H": 520, "CAP": 768})
    # sequence-parallel attention (attention's kernel waiting per block of gathered keys):
    # both comm resources in the emulated world; causal with grouped-query heads and not
    for f in ("sp_attention.tl", "sp_attention_causal.tl"):
        yield from example(f, {"S": 8192, "H": 32, "D": 128}, ("sm", "copy_engine"))
    # Ulysses attention (all_to_all_dims re-sharding to heads and back, attention's tiles
    # waiting per source rank's chunks)
    yield from example("sp_ulysses.tl", {"S": 4096, "H": 32, "D": 128})
    # EP MoE with top-k routing (the combine's weighted sum a receive step in the kernel of
    # the all_to_all landing the expert outputs, waiting per source slot on its rows' chunks)
    yield from example("ep_moe_topk.tl", {"T": 500, "H": 520, "CAP": 768})
    # EP MoE from plain routing (the grouping and counts computed by kernels of their own,
    # the combine's all_to_all sending back the counts the dispatch landed)
    yield from example("ep_moe_routed.tl", {"T": 500, "H": 520, "CAP": 768})
    # flash-decode over a ragged batch (attention_partial reading each sequence's length:
    # its splits' loops end at the length, its combines take rows with no key), several
    # splits on the GPU targets
    yield from example("flash_decode_varlen.tl", {"B": 5, "H": 32, "HKV": 8, "S": 2 * 1000,
                                                  "D": 128})


# a user tile function's module is named after a hash of its file's absolute path
_USER_MODULE = re.compile(r"(_tilelink_user_\w+?_)[0-9a-f]{8}\b")


def _portable(text: str) -> str:
    """A render or key with the checkout's path replaced (renders name the pattern file, and
    user tile functions' modules a hash of its path)."""
    return _USER_MODULE.sub(r"\1<path hash>", text.replace(str(ROOT), "<repo>"))


@contextlib.contextmanager
def _derive_each_once():
    """While open, the plan's dependency derivation runs once per distinct input.

    The set's ~900 schedules make ~1,300 derivations but only ~240 distinct ones (the
    configs of one shape share tile sizes), and deriving is two thirds of the set's time.
    `derive` is a function of its arguments alone (a tensor name, two frozen tile grids,
    the tensor's extents), so a repeat gets a copy of the first result: the same plan,
    rendered to the same text, not re-derived. The copies are shallow but for `notes`,
    the one field `build_plan` extends; it sets the others anew on each."""
    from tilelink.plan import plan

    real, seen = plan.derive, {}

    def fresh(deps):
        return [dataclasses.replace(d, notes=list(d.notes)) for d in deps]

    def derive(tensor, producer, consumer, extents):
        key = (tensor, producer, consumer, tuple(extents))
        if key not in seen:
            seen[key] = fresh(real(tensor, producer, consumer, extents))
        return fresh(seen[key])

    plan.derive = derive
    try:
        yield
    finally:
        plan.derive = real


def renders(progress: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """(key -> SHA-256 of the render, for every case; readable file name -> its text, for
    the first case of each pattern, target and set of lowerings), independent of the
    checkout's path."""
    out, readable = {}, {}
    with _derive_each_once():
        for i, (k, thunk, name) in enumerate(_cases()):
            text = _portable(thunk())
            out[_portable(k)] = hashlib.sha256(text.encode()).hexdigest()
            if name not in readable:
                readable[name] = f"# golden render of {_portable(k)}\n{text}"
            if progress and i % 100 == 0:
                print(f"  {i} renders", file=sys.stderr)
    return out, readable


def readable_differences(now: dict[str, str]) -> list[str]:
    """What differs between the readable renders `now` and those checked in: a unified diff
    (its first lines) per changed file, a line per file added or gone."""
    out = []
    kept = {f.name: f.read_text() for f in READABLE.glob("*.txt")}
    for name in sorted(set(kept) | set(now)):
        if name not in now:
            out.append(f"{name}: no longer rendered")
        elif name not in kept:
            out.append(f"{name}: new (not checked in)")
        elif kept[name] != now[name]:
            diff = difflib.unified_diff(kept[name].splitlines(), now[name].splitlines(),
                                        f"golden/readable/{name}", "now", lineterm="", n=1)
            out.append("\n".join(list(diff)[:40]))
    return out


def write_readable(now: dict[str, str]) -> None:
    """Check in the readable renders `now` (removing files no case renders any more)."""
    READABLE.mkdir(parents=True, exist_ok=True)
    for f in READABLE.glob("*.txt"):
        if f.name not in now:
            f.unlink()
    for name, text in now.items():
        (READABLE / name).write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="record the hashes in golden/")
    g.add_argument("--check", action="store_true", help="compare with the recorded hashes")
    g.add_argument("--dump", metavar="DIR", help="write every render's text into DIR")
    args = p.parse_args(argv)
    if args.dump:
        d = Path(args.dump)
        d.mkdir(parents=True, exist_ok=True)
        index = {}
        with _derive_each_once():
            for i, (k, thunk, _) in enumerate(_cases()):
                (d / f"{i:05d}.py").write_text(thunk())
                index[f"{i:05d}.py"] = _portable(k)
        (d / "index.json").write_text(json.dumps(index, indent=1))
        print(f"wrote {len(index)} renders to {d}")
        return 0
    now, readable = renders(progress=True)
    if args.write:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(now, indent=0, sort_keys=True) + "\n")
        write_readable(readable)
        print(f"recorded {len(now)} renders in {GOLDEN} and {len(readable)} readable ones in "
              f"{READABLE}")
        return 0
    readable_diffs = readable_differences(readable)
    for text in readable_diffs:
        print(text)
    want = json.loads(GOLDEN.read_text())
    changed = sorted(k for k in want if now.get(k) not in (None, want[k]))
    missing = sorted(set(want) - set(now))
    added = sorted(set(now) - set(want))
    for what, keys in (("changed", changed), ("no longer rendered", missing), ("new", added)):
        for k in keys:
            print(f"{what}: {k}")
    print(f"{len(want)} recorded, {len(changed)} changed, {len(missing)} gone, {len(added)} new")
    return 1 if changed or missing or readable_diffs else 0


if __name__ == "__main__":
    sys.exit(main())


def render_key(key: str) -> str:
    """Render the schedule a key of the set names (pattern|sizes|W=w|target|config) with
    the current code generator."""
    from tilelink.codegen import render_triton
    from tilelink.frontend import load_pattern
    from tilelink.schedule import Config, get_target, make_schedule

    name, sizes, world, target, config = key.split("|")
    values = dict(kv.split("=") for kv in sizes.split(", "))
    values.pop("W", None)
    w = int(world.split("=")[1])
    bp = load_pattern(str(ROOT / "examples" / f"{name}.tl")).bind(values, w)
    cfg = Config().with_values(dict(kv.split("=") for kv in config.split()))
    return render_triton(make_schedule(bp, get_target(target), base=cfg))
