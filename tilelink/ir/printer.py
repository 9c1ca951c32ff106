"""Readable dump of a pattern's IR (`tilelink compile --emit ir`)."""

from __future__ import annotations

from .pattern import BoundPattern, Pattern


def format_pattern(p: Pattern, bound: BoundPattern | None = None) -> str:
    """The pattern as IR records, with bound shapes and placements beside each tensor."""
    params = ", ".join(f"{x.name} = {x.default}" if x.default is not None else x.name
                       for x in p.params)
    lines = [f"pattern {p.name}({params})"]
    if bound is not None:
        lines.append(f"  # bound: {bound.sizes_str()}")

    def shapes(name: str) -> str:
        if bound is None:
            return ""
        t = bound.tensors[name]
        local = f", local {list(t.local_shape)}" if t.local_shape != t.shape else ""
        return f"    # {list(t.shape)} {t.dtype} {t.placement}{local}"

    for t in p.inputs:
        lines.append(f"  input {t}{shapes(t.name)}")
    for op in p.ops:
        lines.append(f"  {op}{shapes(op.result)}")
    lines.append(f"  return {', '.join(p.outputs)}")
    return "\n".join(lines)
