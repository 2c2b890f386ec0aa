"""Absolute positional embeddings (the baselines SPE is compared against).

All of them are added to the token embeddings and are only defined for
positions < ``max_len``: asking for a position past it raises a
``SpemusicError`` (they do not extrapolate; use an SPE option for that).

* ``ape``: a learned embedding table (max_len, d_model).
* ``sinusoidal``: the fixed sin/cos embedding of Vaswani et al. (it could be
  evaluated further, but a model trained with it has never seen those
  positions, so the same max_len limit is enforced for a fair comparison).
* ``axial``: the axial positional embedding of Ho et al. / Kitaev et al. as in
  the ``axial-positional-embedding`` package: positions are laid out on a
  (rows, cols) grid with cols = the power of two ≥ √max_len, and the
  embedding of p is e_row[p // cols] + e_col[p % cols] ("sum" mode) or their
  concatenation ("concat" mode, d_model split in two halves).
* ``axial-continuous``: the same grid, but each axis's embedding is a small MLP of the axis
  coordinate normalised to [0, 1) over max_len (as the package's
  ``ContinuousAxialPositionalEmbedding``), so it has a value past max_len too (coordinates
  above 1): the one absolute PE here without a length limit; whether what it gives there is of
  any use is what benchmarks/extrapolation.py measures.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from spemusic.errors import SpemusicError

__all__ = ["AbsolutePE", "LearnedPE", "SinusoidalPE", "AxialPE", "ContinuousAxialPE", "build_absolute_pe"]


class AbsolutePE(nn.Module):
    kind = "absolute"

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len, self.d_model = max_len, d_model

    def check(self, start: int, length: int) -> None:
        end = start + length
        if end > self.max_len:
            raise SpemusicError(
                f"the '{self.kind}' positional embedding is only defined up to max_len={self.max_len} "
                f"tokens, but position {end - 1} was requested; use a model with SPE (sinespe/convspe) "
                f"for longer sequences"
            )

    def embed(self, positions: torch.Tensor) -> torch.Tensor:  # (T,) long -> (T, d_model)
        raise NotImplementedError

    def forward(self, start: int, length: int, device=None) -> torch.Tensor:
        self.check(start, length)
        dev = device if device is not None else next(iter(self.buffers()), next(iter(self.parameters()), None)).device
        return self.embed(torch.arange(start, start + length, device=dev))


class LearnedPE(AbsolutePE):
    kind = "ape"

    def __init__(self, max_len: int, d_model: int):
        super().__init__(max_len, d_model)
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def embed(self, positions):
        return self.weight[positions]


class SinusoidalPE(AbsolutePE):
    kind = "sinusoidal"

    def __init__(self, max_len: int, d_model: int):
        super().__init__(max_len, d_model)
        half = d_model // 2
        inv = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / max(half, 1))
        pos = torch.arange(max_len, dtype=torch.float64)[:, None] * inv
        table = torch.zeros(max_len, d_model, dtype=torch.float64)
        table[:, 0:2 * half:2] = torch.sin(pos)
        table[:, 1:2 * half:2] = torch.cos(pos)
        self.register_buffer("table", table.float(), persistent=False)

    def embed(self, positions):
        return self.table[positions]


class AxialPE(AbsolutePE):
    kind = "axial"

    def __init__(self, max_len: int, d_model: int, mode: str = "sum"):
        super().__init__(max_len, d_model)
        if mode not in ("sum", "concat"):
            raise SpemusicError(f"axial positional embedding mode must be 'sum' or 'concat', not {mode!r}")
        self.mode = mode
        self.cols = 1 << max(0, math.ceil(math.log2(math.sqrt(max_len))))
        self.rows = -(-max_len // self.cols)
        if mode == "sum":
            d_row = d_col = d_model
        else:
            d_row = d_model // 2
            d_col = d_model - d_row
        self.row, self.col = self.axis(self.rows, d_row), self.axis(self.cols, d_col)

    def axis(self, n: int, d: int) -> nn.Parameter | nn.Module:
        """The embedding of one axis: a table of its n indices."""
        return nn.Parameter(torch.randn(n, d) * 0.02)

    def at(self, axis, index: torch.Tensor) -> torch.Tensor:
        return axis[index]

    @property
    def axial_shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    def embed(self, positions):
        r, c = self.at(self.row, positions // self.cols), self.at(self.col, positions % self.cols)
        return r + c if self.mode == "sum" else torch.cat((r, c), -1)


class _AxisMLP(nn.Sequential):
    """An axis's index -> its coordinate normalised by the axis length -> a small MLP; the last
    layer starts small, as the tables do."""

    def __init__(self, n: int, d: int, hidden: int = 64):
        super().__init__(nn.Linear(1, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, d))
        self.n = n
        nn.init.normal_(self[-1].weight, std=0.02)
        nn.init.zeros_(self[-1].bias)

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return super().forward((index.float() / self.n)[:, None])


class ContinuousAxialPE(AxialPE):
    kind = "axial-continuous"

    def axis(self, n: int, d: int) -> nn.Module:
        return _AxisMLP(n, d)

    def at(self, axis, index: torch.Tensor) -> torch.Tensor:
        return axis(index)

    def check(self, start: int, length: int) -> None:
        pass  # defined at every position (the row coordinate passes 1 beyond max_len)


def build_absolute_pe(kind: str, max_len: int, d_model: int) -> AbsolutePE:
    if kind == "ape":
        return LearnedPE(max_len, d_model)
    if kind == "sinusoidal":
        return SinusoidalPE(max_len, d_model)
    if kind == "axial":
        return AxialPE(max_len, d_model)
    if kind == "axial-continuous":
        return ContinuousAxialPE(max_len, d_model)
    raise SpemusicError(f"unknown absolute positional embedding {kind!r}")
