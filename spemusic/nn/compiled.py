"""Small regions of the training step compiled by torch.compile (inductor).

Eager PyTorch runs a chain of broadcast products and sums as one kernel per operation, each
writing and reading a temporary as large as its input; inductor fuses such a chain into one loop.
Only regions with fixed shapes in training are compiled (the sineSPE filter's tile products,
FAVOR+'s features with the chunked attention and its backward pass, the short convolution): each compiles in seconds
once per shape, and inductor's on-disk cache keeps the result for later runs, where compiling the
whole model took minutes per run.

Inductor needs a C++ compiler on a CPU. Without one (or when compiling fails for another
reason, or with ``TORCH_COMPILE_DISABLE=1``) every region runs its plain function, which
computes the same thing; ``unavailable()`` says why, for the trainer to tell the user once.
"""

from __future__ import annotations

import functools
import os
import shutil
import warnings
from collections.abc import Callable

import torch

_REGIONS: dict[Callable, _CompiledOrEager] = {}
_failure: str | None = None  # why compiling failed in this process, once it has


def unavailable() -> str | None:
    """Why the regions run uncompiled in this process (None: they are compiled)."""
    import torch._dynamo  # here, not at the top: importing it takes as long as importing torch

    if torch._dynamo.config.disable:
        return "torch.compile is disabled (TORCH_COMPILE_DISABLE)"
    if not _has_compiler():
        return "no C++ compiler for torch.compile (install g++ for a faster training step)"
    return _failure


@functools.cache
def _has_compiler() -> bool:
    return shutil.which(os.environ.get("CXX") or "g++") is not None


def compiled(fn: Callable) -> Callable:
    """fn compiled once per process (shapes fixed: one compilation per shape), or fn itself where
    compiling is unavailable."""
    if fn not in _REGIONS:
        _REGIONS[fn] = _CompiledOrEager(fn)
    return _REGIONS[fn]


class _CompiledOrEager:
    def __init__(self, fn: Callable):
        self.fn, self.compiled = fn, torch.compile(fn, dynamic=False)

    def __call__(self, *args, **kwargs):
        global _failure
        if unavailable() is None:  # (a failure so far is one of the reasons)
            try:
                return self.compiled(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - inductor's errors share no base class
                first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
                _failure = f"torch.compile failed ({type(e).__name__}: {first}); the step runs uncompiled"
                warnings.warn(_failure, stacklevel=2)
        return self.fn(*args, **kwargs)
