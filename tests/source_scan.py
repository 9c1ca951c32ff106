"""Helpers of the tests that scan TileLink's source for strings (op kinds, knob names)."""

from __future__ import annotations

import ast


def docstring_ids(tree: ast.AST) -> set[int]:
    """`id`s of the string constants of `tree` that are docstrings (a module's, class's or
    function's first statement), which the scans leave out."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and n.body and isinstance(n.body[0], ast.Expr) and \
                isinstance(n.body[0].value, ast.Constant):
            out.add(id(n.body[0].value))
    return out
