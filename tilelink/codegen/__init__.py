"""Codegen: render a schedule to a Python module with Triton kernels (pure text)."""

from .render import render_triton

__all__ = ["render_triton"]
