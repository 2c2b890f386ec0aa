"""Small regions of the training step compiled by torch.compile (inductor).

Eager PyTorch runs a chain of broadcast products and sums as one kernel per operation, each
writing and reading a temporary as large as its input; inductor fuses such a chain into one loop.
Only regions with fixed shapes in training are compiled (the sineSPE filter's tile products, the
short convolution): each compiles in seconds once per shape, and inductor's on-disk cache keeps
the result for later runs, where compiling the whole model took minutes per run.

A machine where compiling fails (no C++ compiler, say) is told so once and runs the plain
functions, which compute the same thing. ``TORCH_COMPILE_DISABLE=1`` turns compiling off.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

_REGIONS: dict[Callable, "_CompiledOrEager"] = {}


def compiled(fn: Callable) -> Callable:
    """fn compiled once per process (shapes fixed: one compilation per shape), or fn itself where
    compiling fails."""
    if fn not in _REGIONS:
        _REGIONS[fn] = _CompiledOrEager(fn)
    return _REGIONS[fn]


class _CompiledOrEager:
    def __init__(self, fn: Callable):
        self.fn, self.compiled = fn, torch.compile(fn, dynamic=False)

    def __call__(self, *args):
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as e:  # inductor's errors (compiler missing, …) share no base class
                warnings.warn(f"torch.compile of {self.fn.__name__} failed ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:120] if str(e) else ''}); it runs uncompiled", stacklevel=2)
                self.compiled = None
        return self.fn(*args)
