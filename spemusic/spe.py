"""Stochastic Positional Encoding (Liutkus et al., ICML 2021).

SPE gives linear attention a *relative* positional kernel in expectation. For
each head h and key feature d we draw R-dimensional random codes Q̄_m[h, d, :],
K̄_n[h, d, :] whose cross-covariance is a learned function of m - n:

    E[Q̄_m[d] · K̄_n[d]] = P_d(m - n),

and filter the queries and keys of an attention layer with them:

    q̂_m = Σ_d q_m[d] Q̄_m[d, :],     k̂_n = Σ_d k_n[d] K̄_n[d, :]      (R-dim)

so that E[q̂_m · k̂_n] = Σ_d q_m[d] k_n[d] P_d(m - n).

Objects in this module:

* ``SineSPE``: P_d(τ) = Σ_k λ_k² cos(2π f_k τ + θ_k); the code is closed-form in
  the position, so it can be evaluated at any position (no maximum length).
* ``ConvSPE``: Q̄ = Z ∗ φ_Q, K̄ = Z ∗ φ_K (causal filters of length L over white
  noise Z), so P(τ) = Σ_l φ_Q[l] φ_K[l - τ]. The noise at every position is
  reproducible from (seed, position block) so the parallel and streaming paths
  see the same realization; streaming keeps a ring buffer of the last L samples.
* ``SPEFilter``: the per-layer filter (with optional gating
  Q̄ ← √(1-g) Q̄ + √g ε, ε a position-independent draw) that turns q, k into
  q̂, k̂ given a shared *context* prepared once per forward by the code
  generator (``SineSPE.context`` / ``ConvSPE.context``).

Normalisation: every Gaussian in a code has variance 1/R, so E[q̂·k̂] equals the
formula above exactly (no extra factor R) and |q̂|² ≈ Σ_d q_d² P_d(0).

Shapes used throughout: q, k are (B, T, H, D) (D = features per head); codes
are (T, H, D, R); q̂, k̂ are (B, T, H, R).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from .compiled import compiled

__all__ = ["SineSPE", "ConvSPE", "SPEFilter", "SineCode", "ConvCode", "mix_seed"]

NOISE_BLOCK = 256  # positions per reproducible convSPE noise block

_MASK64 = (1 << 63) - 1


def mix_seed(*parts: int) -> int:
    """Deterministic 63-bit hash of integers (splitmix64-style), for generator seeds."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (int(p) & 0xFFFFFFFFFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        x = z ^ (z >> 31)
    return x & _MASK64


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


# --------------------------------------------------------------------------- sineSPE


@dataclass
class SineCode:
    """One draw of a sineSPE realization: Z (H, D, 2K, R) and gate noise eps (H, D, R)."""

    z: torch.Tensor
    eps: torch.Tensor


class SineSPE(nn.Module):
    """Sinusoidal SPE code generator (closed-form in the position).

    Q̄_m[d] = Σ_k λ_k [cos(2π f_k m + θ_k) Z_k,1 + sin(2π f_k m + θ_k) Z_k,2]
    K̄_n[d] = Σ_k λ_k [cos(2π f_k n)       Z_k,1 + sin(2π f_k n)       Z_k,2]
    with Z ~ N(0, 1/R), hence E[Q̄_m · K̄_n] = Σ_k λ_k² cos(2π f_k (m - n) + θ_k).
    """

    def __init__(self, n_heads: int, d_head: int, n_sines: int = 5, n_realizations: int = 64):
        super().__init__()
        self.n_heads, self.d_head, self.n_sines, self.R = n_heads, d_head, n_sines, n_realizations
        shape = (n_heads, d_head, n_sines)
        # Frequencies f = sigmoid(raw)/2 ∈ [0, 0.5]; the -4 offset starts them low
        # (periods of tens of tokens), as in the reference implementation.
        self.freqs = nn.Parameter(torch.randn(shape) - 4.0)
        self.phases = nn.Parameter(torch.randn(shape))
        # Gains λ: Σ_k λ_k² ≈ 1 at init so that P_d(0) ≈ 1 and q̂ has q's scale.
        self.gains = nn.Parameter(torch.randn(shape) / math.sqrt(n_sines))

    # ---- code ----
    def draw(self, generator: torch.Generator | None = None, device=None) -> SineCode:
        H, D, K, R = self.n_heads, self.d_head, self.n_sines, self.R
        dev = device if device is not None else self.freqs.device
        if generator is None:  # training: fresh draw from the global RNG, on device
            z = torch.randn(H, D, 2 * K, R, device=dev)
            eps = torch.randn(H, D, R, device=dev)
        else:
            z = torch.randn(H, D, 2 * K, R, generator=generator).to(dev)
            eps = torch.randn(H, D, R, generator=generator).to(dev)
        s = 1.0 / math.sqrt(R)
        return SineCode(z * s, eps * s)

    def frequencies(self) -> torch.Tensor:
        return torch.sigmoid(self.freqs) / 2

    def kernel(self, tau: torch.Tensor) -> torch.Tensor:
        """Closed-form P_d(τ) for lags τ (any shape): returns (*tau.shape, H, D)."""
        f = self.frequencies().double()
        ph = 2 * math.pi * f * tau.double()[..., None, None, None] + self.phases.double()
        return (self.gains.double() ** 2 * torch.cos(ph)).sum(-1).float()

    @staticmethod
    def _reduce(ph: torch.Tensor) -> torch.Tensor:
        """float64 phases modulo 2π, as fp32: positions like 100,000 stay exact to fp32 precision
        whatever the call layout (block or one at a time)."""
        return torch.remainder(ph, 2 * math.pi).float()

    def features(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Trig features at integer positions (T,) -> two (T, H, D, 2K) fp32 (queries, keys; last
        axis [cos, sin] per sine). The gains λ are not applied here: the filter applies them with
        its gate (``feature_gains()``), so one unweighted tensor serves every layer."""
        f = self.frequencies().double().transpose(1, 2)  # (H, K, D): D innermost, for the filter
        pos = positions.to(device=f.device, dtype=torch.float64)[:, None, None, None]
        base = 2 * math.pi * f * pos  # (T, H, K, D) float64
        phq, phk = self._reduce(base + self.phases.double().transpose(1, 2)), self._reduce(base)
        # (T, H, K, 2, D) -> views (T, H, D, 2K)
        return tuple(_CosSin.apply(ph).flatten(2, 3).transpose(2, 3) for ph in (phq, phk))

    def feature_gains(self) -> torch.Tensor:
        """λ per feature, (H, D, 2K) (each sine's gain for its cos and its sin)."""
        return self.gains.repeat_interleave(2, dim=-1)

    @torch.no_grad()
    def step_tables(self, code: SineCode) -> "SineStepTables":
        """Constants for the code at one position at a time (generation): one sin call gives
        every feature (cos x = sin(x + π/2)), the gains are folded into Z, and every table has
        the full (H, D, 2, K, 2) shape (broadcasting small tensors costs more than the arithmetic)."""
        th = self.phases.double()
        quarter, zero = torch.full_like(th, math.pi / 2), torch.zeros_like(th)
        # sin(2πf·t + offset) = [cos, sin] of the query phase 2πf·t + θ (row 0), of the key phase (row 1)
        offs = torch.stack((torch.stack((th + quarter, th), -1), torch.stack((quarter, zero), -1)), 2)
        f2pi = (2 * math.pi * self.frequencies().double())[:, :, None, :, None].expand_as(offs).contiguous()
        H, D, K = self.n_heads, self.d_head, self.n_sines
        z = code.z.view(H, D, K, 2, self.R) * self.gains[..., None, None]
        return SineStepTables(f2pi, offs, z.view(H * D, 2 * K, self.R))

    @staticmethod
    def code_at(tables: "SineStepTables", t: int) -> torch.Tensor:
        """Codes [Q̄_t; K̄_t] at position t alone: (2, H, D, R) (a permuted view)."""
        H, D, _, K, _ = tables.offs.shape
        f = torch.sin(SineSPE._reduce(torch.add(tables.offs, tables.f2pi, alpha=t)))  # (H, D, 2, K, 2)
        qk = torch.bmm(f.view(H * D, 2, 2 * K), tables.z)  # (H·D, 2, R)
        return qk.view(H, D, 2, -1).permute(2, 0, 1, 3)

    def context(self, code: SineCode, positions: torch.Tensor) -> "SPEContext":
        fq, fk = self.features(positions)
        z_rows = torch.cat((code.z, code.eps[:, :, None]), 2).transpose(1, 2).reshape(self.n_heads, -1, self.R)
        return SPEContext(kind="sine", a_q=fq, a_k=fk, z=code.z, eps=code.eps, gains=self.feature_gains(),
                          z_rows=z_rows)

    @staticmethod
    def materialize(ctx: "SPEContext") -> tuple[torch.Tensor, torch.Tensor]:
        """The (ungated) codes Q̄, K̄ as (T, H, D, R) tensors (for tests/inspection)."""
        qbar = torch.einsum("thdj,hdjr->thdr", ctx.a_q * ctx.gains, ctx.z)
        kbar = torch.einsum("thdj,hdjr->thdr", ctx.a_k * ctx.gains, ctx.z)
        return qbar, kbar


@dataclass
class SineStepTables:
    f2pi: torch.Tensor  # (H, D, 2, K, 2) float64 angular frequencies
    offs: torch.Tensor  # (H, D, 2, K, 2) float64 phase offsets
    z: torch.Tensor  # (H·D, 2K, R) the code's Z times the gains


# --------------------------------------------------------------------------- convSPE


@dataclass
class ConvCode:
    """A convSPE realization: a seed from which the noise at every position derives
    (eval mode), or None for a fresh on-device draw (training); eps (H, D, R)."""

    seed: int | None
    eps: torch.Tensor
    noise_cache: dict = field(default_factory=dict)


class ConvSPE(nn.Module):
    """Convolutional SPE code generator: Q̄ = Z ∗ φ_Q, K̄ = Z ∗ φ_K (causal, length L)."""

    def __init__(self, n_heads: int, d_head: int, kernel_size: int = 128, n_realizations: int = 64):
        super().__init__()
        self.n_heads, self.d_head, self.L, self.R = n_heads, d_head, kernel_size, n_realizations
        # Same init for both filters: P starts as a symmetric autocorrelation with
        # P(0) ≈ 1; training moves them apart.
        phi = torch.randn(n_heads, d_head, kernel_size) / math.sqrt(kernel_size)
        self.filters = nn.Parameter(torch.stack((phi, phi.clone())))  # (2, H, D, L): Q, K

    def draw(self, generator: torch.Generator | None = None, device=None, seed: int | None = None) -> ConvCode:
        H, D, R = self.n_heads, self.d_head, self.R
        dev = device if device is not None else self.filters.device
        if generator is None:
            eps = torch.randn(H, D, R, device=dev)
        else:
            eps = torch.randn(H, D, R, generator=generator).to(dev)
        return ConvCode(seed=seed, eps=eps / math.sqrt(R))

    # Noise at position p: (H, D, R) ~ N(0, 1/R), reproducible from (seed, p // NOISE_BLOCK).
    def noise_block(self, code: ConvCode, j: int, device) -> torch.Tensor:
        blk = code.noise_cache.get(j)
        if blk is None:
            g = _gen(mix_seed(code.seed, j))
            blk = torch.randn(NOISE_BLOCK, self.n_heads, self.d_head, self.R, generator=g)
            blk = (blk / math.sqrt(self.R)).to(device)
            if len(code.noise_cache) > 8:
                code.noise_cache.clear()
            code.noise_cache[j] = blk
        return blk

    def noise(self, code: ConvCode, start: int, end: int, device) -> torch.Tensor:
        """Noise for positions [start, end) (start may be negative): (end-start, H, D, R)."""
        if code.seed is None:
            return torch.randn(end - start, self.n_heads, self.d_head, self.R, device=device) / math.sqrt(self.R)
        j0, j1 = start // NOISE_BLOCK, (end - 1) // NOISE_BLOCK
        blocks = [self.noise_block(code, j, device) for j in range(j0, j1 + 1)]
        allz = torch.cat(blocks) if len(blocks) > 1 else blocks[0]
        off = start - j0 * NOISE_BLOCK
        return allz[off:off + end - start]

    def codes_from_noise(self, z: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal convolution of noise z (T+L-1, H, D, R) -> Q̄, K̄ (T, H, D, R), via FFT."""
        L = self.L
        n = T + L - 1
        nfft = 1 << (n - 1).bit_length()
        zf = torch.fft.rfft(z.float(), n=nfft, dim=0)  # (F, H, D, R)
        ff = torch.fft.rfft(self.filters.float(), n=nfft, dim=-1)  # (2, H, D, F)
        ff = ff.permute(0, 3, 1, 2)[..., None]  # (2, F, H, D, 1)
        out = torch.fft.irfft(zf[None] * ff, n=nfft, dim=1)  # (2, nfft, H, D, R)
        # out[t] = Σ_l φ[l] z[t - l]; position p = index p + L - 1 in z
        out = out[:, L - 1:L - 1 + T]
        return out[0], out[1]

    def context(self, code: ConvCode, start: int, T: int, device=None) -> "SPEContext":
        dev = device if device is not None else self.filters.device
        z = self.noise(code, start - self.L + 1, start + T, dev)
        qbar, kbar = self.codes_from_noise(z, T)
        return SPEContext(kind="conv", a_q=qbar, a_k=kbar, z=None, eps=code.eps)

    def cross_correlation(self) -> torch.Tensor:
        """P(τ) = Σ_l φ_Q[l] φ_K[l - τ] for τ = -(L-1)..(L-1): (2L-1, H, D)."""
        L = self.L
        fq, fk = self.filters[0], self.filters[1]
        out = []
        for tau in range(-(L - 1), L):
            if tau >= 0:
                out.append((fq[..., tau:] * fk[..., :L - tau]).sum(-1))
            else:
                out.append((fq[..., :L + tau] * fk[..., -tau:]).sum(-1))
        return torch.stack(out)

    @staticmethod
    def materialize(ctx: "SPEContext") -> tuple[torch.Tensor, torch.Tensor]:
        return ctx.a_q, ctx.a_k

    # ---- streaming ----
    def stream_init(self, code: ConvCode, start: int, device) -> "ConvStream":
        """Ring buffer holding the noise at positions start-L .. start-1 (slot p % L)."""
        L = self.L
        z = self.noise(code, start - L, start, device)  # (L, H, D, R)
        HD = self.n_heads * self.d_head
        buf = torch.empty(HD, L, self.R, device=device)
        slots = torch.arange(start - L, start) % L
        buf[:, slots] = z.reshape(L, HD, self.R).transpose(0, 1)
        return ConvStream(buf=buf)

    def stream_step(self, code: ConvCode, stream: "ConvStream", t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes at position t alone: (1, H, D, R) each; pushes Z_t into the ring buffer."""
        L, H, D, R = self.L, self.n_heads, self.d_head, self.R
        dev = stream.buf.device
        zt = self.noise(code, t, t + 1, dev)[0]  # (H, D, R)
        stream.buf[:, t % L] = zt.reshape(H * D, R)
        # slot s holds Z_{p} with p ≡ s (mod L), p ∈ (t-L, t]; lag l = (t - s) mod L.
        if stream.lag_index is None or stream.lag_index.device != dev:
            stream.lag_index = torch.arange(L, device=dev)
        idx = (t - stream.lag_index) % L
        w = self.filters.detach().reshape(2, H * D, L)[:, :, idx].transpose(0, 1)  # (HD, 2, L)
        codes = torch.bmm(w, stream.buf)  # (HD, 2, R)
        codes = codes.transpose(0, 1).reshape(2, 1, H, D, R)
        return codes[0], codes[1]


@dataclass
class ConvStream:
    buf: torch.Tensor  # (H*D, L, R) ring buffer of noise samples
    lag_index: torch.Tensor | None = None

    def clone(self) -> "ConvStream":
        return ConvStream(buf=self.buf.clone(), lag_index=self.lag_index)


# --------------------------------------------------------------------------- filter


@dataclass
class SPEContext:
    """What every layer's SPEFilter needs for one forward (shared across layers).

    sine: a_q, a_k are trig features (T, H, D, 2K), gains λ (H, D, 2K), z (H, D, 2K, R), and
    z_rows = [Z; ε] in the filter's layout (H, (2K+1)·D, R), rows ordered (j, d): without a
    gate the filter uses the first 2K·D rows;
    conv: a_q, a_k are the codes Q̄, K̄ themselves (T, H, D, R), z, gains and z_rows are None.
    """

    kind: str
    a_q: torch.Tensor
    a_k: torch.Tensor
    z: torch.Tensor | None
    eps: torch.Tensor
    gains: torch.Tensor | None = None
    z_rows: torch.Tensor | None = None


SINE_TILE_ROWS = 1024  # (batch × positions) rows per tile of the sineSPE filter


class _CosSin(torch.autograd.Function):
    """[cos x, sin x] stacked on a new second-to-last axis, keeping only that output for the
    backward pass (d/dx [cos, sin] = [-sin, cos]): the phases need not be held as well."""

    @staticmethod
    def forward(ctx, x):
        out = torch.stack((torch.cos(x), torch.sin(x)), -2)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return out[..., 0, :] * grad[..., 1, :] - out[..., 1, :] * grad[..., 0, :]


class _SineFilter(torch.autograd.Function):
    """x̂[b, t, h] = Σ_{d, j} x[b, t, h, d] · trig[t, h, d, j] · scale[h, d, j] · zz[h, (j, d)]
    (+ Σ_d x[b, t, h, d] · extra[h, d] · zz[h, (J, d)] when gated: the ε rows).

    Written out by hand so that autograd keeps only x (the projection's output, held anyway), the
    trig features (shared by every layer) and the small scales, not a gated copy of x per layer.
    The (H, B, t, J, D) products are formed a tile of positions at a time, forward and backward
    (in one piece they are too large for the caches), head-major with D innermost so that the
    elementwise products run along contiguous rows and feed one batched product per tile. The
    tiles' elementwise products and the batched products run in ``mm_dtype`` (bf16 under autocast:
    the tile is the filter's largest tensor, and converting it to and from fp32 took more time than
    the products); the sums over positions (the gradients of the small per-feature factors)
    accumulate in fp32. trig is expected as a view of a (T, H, J, D)-contiguous tensor
    (``SineSPE.features`` makes it so); any layout is correct.
    """

    @staticmethod
    def forward(ctx, x, trig, scale, extra, zz, mm_dtype):
        ctx.save_for_backward(x, trig, scale, extra, zz)
        ctx.mm_dtype = mm_dtype
        B, T, H, _ = x.shape
        zz = zz.to(mm_dtype)
        out = x.new_empty(B, H, T, zz.shape[-1], dtype=mm_dtype)
        # training (x needs a gradient): the compiled tile product; elsewhere shapes vary, eager
        product = compiled(_tile_product) if x.requires_grad else _tile_product
        for t0, t1 in _tiles(B, T):
            p = product(_tile_x(x, t0, t1), trig[t0:t1], scale, extra, mm_dtype)
            res = torch.bmm(p.view(H, B * (t1 - t0), -1), zz)
            out[:, :, t0:t1] = res.view(H, B, t1 - t0, -1).transpose(0, 1)
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad):
        x, trig, scale, extra, zz = ctx.saved_tensors
        B, T, H, D = x.shape
        zzt = zz.to(ctx.mm_dtype).transpose(1, 2)
        want_trig = ctx.needs_input_grad[1]
        grad_x = torch.empty_like(x)
        grad_trig = torch.empty_like(trig) if want_trig else None
        grad_scale = torch.zeros_like(scale)
        grad_extra = torch.zeros_like(extra) if extra is not None else None
        for t0, t1 in _tiles(B, T):
            t = t1 - t0
            g = grad[:, t0:t1].permute(2, 0, 1, 3).to(ctx.mm_dtype).reshape(H, B * t, -1)
            gp = torch.bmm(g, zzt).view(H, B, t, -1, D)  # ∂L/∂(GEMM input), in mm_dtype
            gx, gt, gs, ge = compiled(_tile_grads)(gp, _tile_x(x, t0, t1), trig[t0:t1], scale, extra, want_trig)
            grad_x[:, t0:t1] = gx
            grad_scale += gs
            if want_trig:
                grad_trig[t0:t1] = gt
            if extra is not None:
                grad_extra += ge
        return grad_x, grad_trig, grad_scale, grad_extra, None, None


def _tile_x(x, t0, t1):
    """x's tile as a (H, B, t, 1, D) view."""
    return x[:, t0:t1].permute(2, 0, 1, 3)[..., None, :]


def _tile_features(trig, scale, extra):
    """A tile's per-feature factors trig · scale [, extra]: (H, t, J[+1], D) from trig (t, H, D, J)."""
    f = trig.permute(1, 0, 3, 2) * scale.transpose(1, 2)[:, None]
    if extra is None:
        return f
    return torch.cat((f, extra.transpose(1, 2)[:, None].expand(-1, f.shape[1], -1, -1)), 2)


def _tile_product(x, trig, scale, extra, dtype):
    """The GEMM input of one tile, in dtype: x (H, B, t, 1, D) times its features (H, t, J', D)."""
    return x.to(dtype) * _tile_features(trig, scale, extra).to(dtype)[:, None]


def _tile_grads(gp, x, trig, scale, extra, want_trig: bool):
    """One tile's gradients from gp = ∂L/∂(x·features) (H, B, t, J', D), summed in fp32:
    ∂L/∂x (B, t, H, D) in x's dtype, ∂L/∂trig (t, H, D, J) (None unless want_trig), and this
    tile's shares of ∂L/∂scale (H, D, J) and ∂L/∂extra (H, D, 1) (None without extra)."""
    J = trig.shape[-1]
    f = _tile_features(trig, scale, extra)
    gx = (gp.float() * f[:, None]).sum(3).to(x.dtype).permute(1, 2, 0, 3)
    gf = (gp.float() * x.float()).sum(1)  # (H, t, J', D)
    gs = gf[:, :, :J]
    # ∂L/∂trig laid out as trig is ((t, H, J, D) in memory, seen as (t, H, D, J)), so that storing
    # it is a plain copy, not a transposing one
    g_trig = (gs * scale.transpose(1, 2)[:, None]).permute(1, 0, 2, 3).contiguous().transpose(2, 3) if want_trig else None
    g_scale = (gs * trig.permute(1, 0, 3, 2)).sum(1).transpose(1, 2)
    g_extra = gf[:, :, J:].sum(1).transpose(1, 2) if extra is not None else None
    return gx, g_trig, g_scale, g_extra


def _tiles(B: int, T: int):
    step = max(1, SINE_TILE_ROWS // B)
    return [(t0, min(T, t0 + step)) for t0 in range(0, T, step)]


def _sine_filter(x, trig, scale, extra, zz) -> torch.Tensor:
    """x (B, T, H, D), trig (T, H, D, J), scale (H, D, J), extra (H, D, 1) or None, zz (H, J[+1]·D, R)
    -> (B, T, H, R); see _SineFilter."""
    dev = x.device.type
    mm_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else torch.float32
    with torch.autocast(dev, enabled=False):
        return _SineFilter.apply(x, trig, scale, extra, zz, mm_dtype)


class SPEFilter(nn.Module):
    """Per-layer SPE filter with optional gating.

    Gated code: Q̄' = √(1-g) Q̄ + √g ε, K̄' = √(1-g) K̄ + √g ε with g = sigmoid(gate)
    per head and feature. By linearity, q̂ = filter(q ⊙ √(1-g)) + (q ⊙ √g) · ε,
    which never materialises the (T, H, D, R) gated code.
    """

    def __init__(self, n_heads: int, d_head: int, gated: bool = True):
        super().__init__()
        self.gated = gated
        if gated:
            self.gate = nn.Parameter(torch.zeros(n_heads, d_head))

    def gate_values(self) -> torch.Tensor | None:
        return torch.sigmoid(self.gate) if self.gated else None

    def forward(self, q: torch.Tensor, k: torch.Tensor, ctx: SPEContext) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k: (B, T, H, D) -> q̂, k̂: (B, T, H, R)."""
        if ctx.kind == "sine":
            # gated: [λ√(1-g) per sine feature, √g] scale x's d-th feature against [Z; ε]
            J, D = ctx.a_q.shape[-1], q.shape[-1]
            scale, extra, zz = ctx.gains, None, ctx.z_rows[:, : J * D]  # Z's rows, before ε's
            if self.gated:
                g = torch.sigmoid(self.gate)
                scale, extra, zz = scale * torch.sqrt(1 - g)[..., None], torch.sqrt(g)[..., None], ctx.z_rows
            return _sine_filter(q, ctx.a_q, scale, extra, zz), _sine_filter(k, ctx.a_k, scale, extra, zz)
        if self.gated:
            g = torch.sigmoid(self.gate)
            qs, ks = q * torch.sqrt(1 - g), k * torch.sqrt(1 - g)
        else:
            qs, ks = q, k
        qh = torch.einsum("bthd,thdr->bthr", qs, ctx.a_q)
        kh = torch.einsum("bthd,thdr->bthr", ks, ctx.a_k)
        if self.gated:
            sg = torch.sqrt(g)
            qh = qh + torch.einsum("bthd,hdr->bthr", q * sg, ctx.eps)
            kh = kh + torch.einsum("bthd,hdr->bthr", k * sg, ctx.eps)
        return qh, kh

    def code(self, ctx: SPEContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The effective (gated) codes Q̄', K̄' as (T, H, D, R) (for tests/inspection)."""
        if ctx.kind == "sine":
            qbar, kbar = SineSPE.materialize(ctx)
        else:
            qbar, kbar = ctx.a_q, ctx.a_k
        if self.gated:
            g = torch.sigmoid(self.gate)[..., None]
            qbar = torch.sqrt(1 - g) * qbar + torch.sqrt(g) * ctx.eps
            kbar = torch.sqrt(1 - g) * kbar + torch.sqrt(g) * ctx.eps
        return qbar, kbar
