"""Compare the compiled kernels of two renders of the same schedules (before and after a
code-generator change): is the machine code the same, up to register and label names?

    python -m tests.golden_renders --dump /tmp/old        # at the old commit
    python tools/compare_kernels.py /tmp/old [--target cuda:90] [--match SUBSTRING] [-n 20]

For each render in the dump whose key matches, the current code generator renders the same
schedule again; both modules' kernels are compiled for the target and their PTX compared as
instruction sequences (comments, debug locations, register numbers and label names removed).
Prints one line per render: identical, or how many instructions differ and a short diff.
No GPU needed (Triton compiles for cuda:90 on the CPU).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

_REG = re.compile(r"%(r|rd|f|fd|p|rs|h|hh|b|tmp|r[a-z]*)\d+")
_LABEL = re.compile(r"\$L__\w+")


def normalise(ptx: str) -> list[str]:
    """PTX instructions with names that carry no meaning removed."""
    out = []
    for line in ptx.splitlines():
        line = line.split("//")[0].strip()
        if not line or line.startswith((".loc", ".file", "@@", ".section", "$L__")) or \
                line.endswith(":"):
            continue
        line = _LABEL.sub("L", _REG.sub(r"%\1", line))
        out.append(line)
    return out


def opcodes(lines: list[str]) -> dict[str, int]:
    """How often each instruction (opcode with its modifiers) occurs, parameters left out."""
    out: dict[str, int] = {}
    for line in lines:
        if line.startswith("."):
            continue  # directives: parameter lists, registers
        op = line.split()[0]
        if op.startswith("@"):  # a predicate: the instruction after it
            parts = line.split()
            op = parts[1] if len(parts) > 1 else op
        out[op] = out.get(op, 0) + 1
    return out


def ptx_of(source: str, target) -> list[str]:
    from tilelink.codegen.compile import compile_module, kernel_names, load_module

    names = [n for n in kernel_names(load_module(source))]
    return [compile_module(source, target, n).asm["ptx"] for n in names]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump", help="a directory written by `python -m tests.golden_renders --dump`")
    p.add_argument("--target", default="cuda:90")
    p.add_argument("--match", default="", help="only keys containing this")
    p.add_argument("-n", type=int, default=10, help="renders to compare at most")
    p.add_argument("--diff", type=int, default=0, help="show this many differing lines")
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.golden_renders import render_key
    from tilelink.schedule import get_target

    target = get_target(args.target)
    index = json.loads((Path(args.dump) / "index.json").read_text())
    done = 0
    for fname, key in index.items():
        if args.match not in key or f"|{args.target}|" not in key:
            continue
        old = (Path(args.dump) / fname).read_text()
        try:
            new = render_key(key)
        except Exception as e:  # (a variant the current generator refuses)
            print(f"NOT RENDERED ({type(e).__name__}: {str(e)[:120]}): {key}")
            continue
        a, b = ptx_of(old, target), ptx_of(new, target)
        if len(a) != len(b):
            print(f"{key}: {len(a)} kernels before, {len(b)} now")
        for i, (x, y) in enumerate(zip(a, b)):
            x, y = normalise(x), normalise(y)
            if x == y:
                print(f"IDENTICAL kernel {i} ({len(x)} instructions): {key}")
                continue
            hx, hy = opcodes(x), opcodes(y)
            delta = {op: hy.get(op, 0) - hx.get(op, 0) for op in set(hx) | set(hy)
                     if hy.get(op, 0) != hx.get(op, 0)}
            print(f"DIFFERENT kernel {i} ({len(x)} -> {len(y)} instructions; opcode counts "
                  f"that differ: {dict(sorted(delta.items()))}): {key}")
            if args.diff:
                diff = [d for d in difflib.unified_diff(x, y, lineterm="", n=0)
                        if d[:1] in "+-" and not d.startswith(("+++", "---"))]
                for d in diff[:args.diff]:
                    print("    " + d[:150])
        done += 1
        if done >= args.n:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
