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
  generator.
* ``SPECodes``: a model's code generators (one shared by the layers, or one per
  layer) and the realization in use: fresh per forward in training, fixed by a
  seed in eval.

Both generators implement one interface (``SPE``), so the model never asks which it has:
``draw`` a realization, its ``context`` for positions start..start+T (the parallel path),
``stream_init`` at a position and ``code_at`` one position at a time (the recurrent path).
A third variant is one more subclass here.

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

from spemusic.nn.fused import sine_filter

__all__ = ["SPE", "SineSPE", "ConvSPE", "SPECodes", "SPEFilter", "SineCode", "ConvCode", "mix_seed"]

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


class SPE(nn.Module):
    """The interface of an SPE code generator (see the module doc). A code is one realization;
    ``seed`` is a tuple of integers it derives from (None: a fresh draw from the global RNG, on the
    device: training)."""

    n_heads: int
    d_head: int
    R: int

    def draw(self, seed: tuple[int, ...] | None = None, device=None):
        raise NotImplementedError

    def context(self, code, start: int, T: int, device=None) -> SineContext | ConvContext:
        """What every layer's filter needs for positions start..start+T."""
        raise NotImplementedError

    def stream_init(self, code, start: int = 0, device=None):
        """The state that gives the codes one position at a time from ``start`` (has ``clone``)."""
        raise NotImplementedError

    def code_at(self, code, stream, t: int) -> torch.Tensor:
        """[Q̄_t; K̄_t] at position t alone: (2, H, D, R); the stream moves to t + 1."""
        raise NotImplementedError

    @staticmethod
    def materialize(ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """The (ungated) codes Q̄, K̄ of a context as (T, H, D, R) tensors (tests, inspection)."""
        return ctx.codes()


# --------------------------------------------------------------------------- sineSPE


@dataclass
class SineCode:
    """One draw of a sineSPE realization: Z (H, D, 2K, R) and gate noise eps (H, D, R)."""

    z: torch.Tensor
    eps: torch.Tensor

    def to(self, device) -> SineCode:
        self.z, self.eps = self.z.to(device), self.eps.to(device)
        return self


class SineSPE(SPE):
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
    def draw(self, seed: tuple[int, ...] | None = None, device=None) -> SineCode:
        H, D, K, R = self.n_heads, self.d_head, self.n_sines, self.R
        dev = device if device is not None else self.freqs.device
        if seed is None:  # training: fresh draw from the global RNG, on device
            z = torch.randn(H, D, 2 * K, R, device=dev)
            eps = torch.randn(H, D, R, device=dev)
        else:
            g = _gen(mix_seed(*seed))
            z = torch.randn(H, D, 2 * K, R, generator=g).to(dev)
            eps = torch.randn(H, D, R, generator=g).to(dev)
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
        """float64 phases modulo 2π, as fp32, for one position at a time (code_at): positions like
        100,000 stay exact to fp32 precision, as in the block path (features, which reduces with fmod)."""
        return torch.remainder(ph, 2 * math.pi).float()

    @torch.no_grad()
    def features(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Trig features at integer positions (T,) -> two (T, H, D, 2K) fp32 (queries, keys; last
        axis [cos, sin] per sine). The gains λ are not applied here: the filter applies them with
        its gate (``feature_gains()``), so one unweighted tensor serves every layer. Values only:
        the filter returns the gradients of the frequencies and phases itself (SineFilter)."""
        f = self.frequencies().double().transpose(1, 2)  # (H, K, D): D innermost, for the filter
        pos = positions.to(device=f.device, dtype=torch.float64)[:, None, None, None]
        # (T, H, K, D) float64, reduced once (fmod: half remainder's time, and any value within a
        # turn or two of 0 keeps fp32's precision); the query phases add their offsets after
        base = torch.fmod(2 * math.pi * f * pos, 2 * math.pi)
        phq, phk = (base + self.phases.double().transpose(1, 2)).float(), base.float()
        # (T, H, K, 2, D) -> views (T, H, D, 2K)
        return tuple(torch.stack((torch.cos(ph), torch.sin(ph)), -2).flatten(2, 3).transpose(2, 3)
                     for ph in (phq, phk))

    def feature_gains(self) -> torch.Tensor:
        """λ per feature, (H, D, 2K) (each sine's gain for its cos and its sin)."""
        return self.gains.repeat_interleave(2, dim=-1)

    @torch.no_grad()
    def stream_init(self, code: SineCode, start: int = 0, device=None) -> SineStepTables:
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

    def code_at(self, code: SineCode, tables: SineStepTables, t: int) -> torch.Tensor:
        """Codes [Q̄_t; K̄_t] at position t alone: (2, H, D, R) (a permuted view); the code is
        closed-form in t, so the tables do not change."""
        H, D, _, K, _ = tables.offs.shape
        f = torch.sin(self._reduce(torch.add(tables.offs, tables.f2pi, alpha=t)))  # (H, D, 2, K, 2)
        qk = torch.bmm(f.view(H * D, 2, 2 * K), tables.z)  # (H·D, 2, R)
        return qk.view(H, D, 2, -1).permute(2, 0, 1, 3)

    def context(self, code: SineCode, start: int, T: int, device=None) -> SineContext:
        positions = torch.arange(start, start + T, dtype=torch.float64)
        fq, fk = self.features(positions)
        z_rows = torch.cat((code.z, code.eps[:, :, None]), 2).transpose(1, 2).reshape(self.n_heads, -1, self.R)
        return SineContext(a_q=fq, a_k=fk, z=code.z, eps=code.eps, gains=self.feature_gains(), z_rows=z_rows,
                           omega=2 * math.pi * self.frequencies(), theta=self.phases,
                           positions=positions.to(device=fq.device, dtype=torch.float32))


@dataclass
class SineStepTables:
    """The stream of a sineSPE code: constants only (the code is closed-form in the position)."""

    f2pi: torch.Tensor  # (H, D, 2, K, 2) float64 angular frequencies
    offs: torch.Tensor  # (H, D, 2, K, 2) float64 phase offsets
    z: torch.Tensor  # (H·D, 2K, R) the code's Z times the gains

    def clone(self) -> SineStepTables:
        return self  # never written

    def nbytes(self) -> int:
        return 0  # constants shared by every clone, as the plan's are


@dataclass
class SineContext:
    """A sineSPE code at T positions, as the filter uses it: trig features a_q, a_k (T, H, D, 2K),
    gains λ (H, D, 2K), Z (H, D, 2K, R), ε (H, D, R), and z_rows = [Z; ε] in the filter's layout
    (H, (2K+1)·D, R), rows ordered (j, d): without a gate the filter uses the first 2K·D rows.
    The features' angular frequencies ω = 2πf and phases θ (H, D, K) and the positions (T,) are
    what the filter returns the features' gradients through."""

    a_q: torch.Tensor
    a_k: torch.Tensor
    z: torch.Tensor
    eps: torch.Tensor
    gains: torch.Tensor
    z_rows: torch.Tensor
    omega: torch.Tensor
    theta: torch.Tensor
    positions: torch.Tensor

    def filter(self, q: torch.Tensor, k: torch.Tensor, g: torch.Tensor | None):
        """q, k (B, T, H, D), gate values g (H, D) or None -> q̂, k̂ (B, T, H, R) (see SPEFilter)."""
        # gated: [λ√(1-g) per sine feature, √g] scale x's d-th feature against [Z; ε]
        J, D = self.a_q.shape[-1], q.shape[-1]
        scale, extra, zz = self.gains, None, self.z_rows[:, : J * D]  # Z's rows, before ε's
        if g is not None:
            scale, extra, zz = scale * torch.sqrt(1 - g)[..., None], torch.sqrt(g)[..., None], self.z_rows
        return (sine_filter(q, self.a_q, scale, extra, zz, self.omega, self.theta, self.positions),
                sine_filter(k, self.a_k, scale, extra, zz, self.omega, None, self.positions))

    def codes(self) -> tuple[torch.Tensor, torch.Tensor]:
        qbar = torch.einsum("thdj,hdjr->thdr", self.a_q * self.gains, self.z)
        kbar = torch.einsum("thdj,hdjr->thdr", self.a_k * self.gains, self.z)
        return qbar, kbar


# --------------------------------------------------------------------------- convSPE


@dataclass
class ConvCode:
    """A convSPE realization: a seed from which the noise at every position derives
    (eval mode), or None for a fresh on-device draw (training); eps (H, D, R)."""

    seed: int | None
    eps: torch.Tensor
    noise_cache: dict = field(default_factory=dict)

    def to(self, device) -> ConvCode:
        if self.eps.device != torch.device(device):
            self.eps = self.eps.to(device)
            self.noise_cache.clear()
        return self


class ConvSPE(SPE):
    """Convolutional SPE code generator: Q̄ = Z ∗ φ_Q, K̄ = Z ∗ φ_K (causal, length L)."""

    def __init__(self, n_heads: int, d_head: int, kernel_size: int = 128, n_realizations: int = 64):
        super().__init__()
        self.n_heads, self.d_head, self.L, self.R = n_heads, d_head, kernel_size, n_realizations
        # Same init for both filters: P starts as a symmetric autocorrelation with
        # P(0) ≈ 1; training moves them apart.
        phi = torch.randn(n_heads, d_head, kernel_size) / math.sqrt(kernel_size)
        self.filters = nn.Parameter(torch.stack((phi, phi.clone())))  # (2, H, D, L): Q, K

    def draw(self, seed: tuple[int, ...] | None = None, device=None) -> ConvCode:
        H, D, R = self.n_heads, self.d_head, self.R
        dev = device if device is not None else self.filters.device
        if seed is None:
            return ConvCode(seed=None, eps=torch.randn(H, D, R, device=dev) / math.sqrt(R))
        eps = torch.randn(H, D, R, generator=_gen(mix_seed(*seed))).to(dev)
        return ConvCode(seed=mix_seed(*seed, 1), eps=eps / math.sqrt(R))

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

    def context(self, code: ConvCode, start: int, T: int, device=None) -> ConvContext:
        dev = device if device is not None else self.filters.device
        z = self.noise(code, start - self.L + 1, start + T, dev)
        qbar, kbar = self.codes_from_noise(z, T)
        return ConvContext(a_q=qbar, a_k=kbar, eps=code.eps)

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

    # ---- streaming ----
    def stream_init(self, code: ConvCode, start: int = 0, device=None) -> ConvStream:
        """Ring buffer holding the noise at positions start-L .. start-1 (slot p % L)."""
        L = self.L
        device = device if device is not None else self.filters.device
        z = self.noise(code, start - L, start, device)  # (L, H, D, R)
        HD = self.n_heads * self.d_head
        buf = torch.empty(HD, L, self.R, device=device)
        slots = torch.arange(start - L, start) % L
        buf[:, slots] = z.reshape(L, HD, self.R).transpose(0, 1)
        return ConvStream(buf=buf)

    def code_at(self, code: ConvCode, stream: ConvStream, t: int) -> torch.Tensor:
        """Codes [Q̄_t; K̄_t] at position t alone: (2, H, D, R); pushes Z_t into the ring buffer."""
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
        return codes.transpose(0, 1).reshape(2, H, D, R)


@dataclass
class ConvStream:
    buf: torch.Tensor  # (H*D, L, R) ring buffer of noise samples
    lag_index: torch.Tensor | None = None

    def clone(self) -> ConvStream:
        return ConvStream(buf=self.buf.clone(), lag_index=self.lag_index)

    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()


@dataclass
class ConvContext:
    """A convSPE code at T positions: the codes Q̄, K̄ themselves (T, H, D, R), and ε (H, D, R)."""

    a_q: torch.Tensor
    a_k: torch.Tensor
    eps: torch.Tensor

    def filter(self, q: torch.Tensor, k: torch.Tensor, g: torch.Tensor | None):
        """q, k (B, T, H, D), gate values g (H, D) or None -> q̂, k̂ (B, T, H, R) (see SPEFilter)."""
        qs, ks = (q * torch.sqrt(1 - g), k * torch.sqrt(1 - g)) if g is not None else (q, k)
        qh = torch.einsum("bthd,thdr->bthr", qs, self.a_q)
        kh = torch.einsum("bthd,thdr->bthr", ks, self.a_k)
        if g is not None:
            sg = torch.sqrt(g)
            qh = qh + torch.einsum("bthd,hdr->bthr", q * sg, self.eps)
            kh = kh + torch.einsum("bthd,hdr->bthr", k * sg, self.eps)
        return qh, kh

    def codes(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a_q, self.a_k


# --------------------------------------------------------------------------- filter


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

    def forward(self, q: torch.Tensor, k: torch.Tensor, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k: (B, T, H, D) -> q̂, k̂: (B, T, H, R), ctx: the code's SineContext or ConvContext."""
        return ctx.filter(q, k, self.gate_values())

    def step(self, q: torch.Tensor, k: torch.Tensor, code_t: torch.Tensor,
             eps: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One position (recurrent decoding): q, k (B, H, D) and code_t = [Q̄_t; K̄_t] (2, H, D, R)
        from the generator's ``code_at`` -> q̂_t, k̂_t (B, H, R). eps: the code's ε, for a gated
        filter (``code.eps``)."""
        if self.gated and eps is None:
            raise ValueError("a gated SPEFilter needs the code's eps")
        qbar, kbar = self._gated(code_t[0], code_t[1], eps)
        return torch.einsum("bhd,hdr->bhr", q, qbar), torch.einsum("bhd,hdr->bhr", k, kbar)

    def code(self, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """The effective (gated) codes Q̄', K̄' as (T, H, D, R) (for tests/inspection)."""
        return self._gated(*ctx.codes(), ctx.eps)

    def _gated(self, qbar: torch.Tensor, kbar: torch.Tensor, eps) -> tuple[torch.Tensor, torch.Tensor]:
        """Q̄' = √(1-g) Q̄ + √g ε, and K̄' alike (ungated: the codes as they are)."""
        if not self.gated:
            return qbar, kbar
        g = torch.sigmoid(self.gate)[..., None]
        return torch.sqrt(1 - g) * qbar + torch.sqrt(g) * eps, torch.sqrt(1 - g) * kbar + torch.sqrt(g) * eps


class SPECodes(nn.ModuleList):
    """A model's SPE code generators (one shared by every layer, or one per layer; a ModuleList,
    so the checkpoints' parameter names are those of a plain list) and the realization in use:
    a fresh draw per forward in training, the one fixed by ``resample`` in eval."""

    def __init__(self, modules, n_layers: int):
        super().__init__(modules)
        self.n_layers = n_layers
        self.seed: int | None = None
        self.fixed: list | None = None  # eval-mode codes, one per module

    def resample(self, seed: int, device) -> None:
        self.seed = int(seed)
        self.fixed = [m.draw((self.seed, i), device) for i, m in enumerate(self)]

    def codes(self, training: bool, device) -> list:
        if training:
            return [m.draw(None, device) for m in self]
        if self.fixed is None:
            self.resample(0 if self.seed is None else self.seed, device)
        return [c.to(device) for c in self.fixed]

    def contexts(self, codes: list, start: int, T: int, device) -> list:
        """Per layer, the context of its code for positions start..start+T."""
        ctxs = [m.context(c, start, T, device) for m, c in zip(self, codes)]
        return ctxs * self.n_layers if len(ctxs) == 1 else ctxs

    def streams(self, codes: list, start: int, device) -> list:
        return [m.stream_init(c, start, device) for m, c in zip(self, codes)]

    def codes_at(self, codes: list, streams: list, t: int) -> list:
        """Per module, [Q̄_t; K̄_t] (2, H, D, R); the streams move to t + 1."""
        return [m.code_at(c, st, t) for m, c, st in zip(self, codes, streams)]
