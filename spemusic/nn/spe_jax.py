"""Stochastic Positional Encoding in JAX/Flax (``pip install 'spemusic[jax]'``).

The same three pieces as :mod:`spemusic.nn.spe`, with the same parameters and the same formulas:

* ``SineSPE``: sinusoidal codes, closed-form in the position;
* ``ConvSPE``: causal convolutional codes over white noise (the noise at each position derives
  from the code's key and the position, so the parallel and the streaming forms see one draw);
* ``SPEFilter``: q, k (B, T, H, D) -> q̂, k̂ (B, T, H, R), gated or not, and its one-position
  ``step`` for recurrent decoding.

Flax linen modules, usable under ``jax.jit``. A code is one realization, drawn from a PRNG key
(``draw``); the same key gives the same draws. ``params_from_torch`` turns a PyTorch module's
parameters into this module's, and ``SineCode`` / ``ConvCode`` can hold PyTorch's draws, so both
implementations compute the same q̂, k̂ (tests/test_spe_jax.py: within 1e-5 in fp32).

Precision: like the PyTorch version, the sine phases 2πf·t are formed in float64 and reduced
modulo 2π before the fp32 cos and sin, so positions in the hundred thousands stay exact. JAX has
float64 only with ``jax_enable_x64`` (``jax.enable_x64(True)``); without it the phases are fp32
and the codes drift from PyTorch's as the position grows (docs/measurements.md).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

__all__ = ["SineSPE", "ConvSPE", "SPEFilter", "SineCode", "ConvCode", "params_from_torch"]

_KEY_OFFSET = 1 << 30  # positions may be negative (a convolution's history); fold_in takes unsigned


def _wide() -> jnp.dtype:
    """float64 where JAX has it (jax_enable_x64), else float32."""
    return jax.dtypes.canonicalize_dtype(jnp.float64)


# --------------------------------------------------------------------------- sineSPE


@struct.dataclass
class SineCode:
    """One sineSPE realization: Z (H, D, 2K, R) and the gate's noise ε (H, D, R), both N(0, 1/R)."""

    z: jax.Array
    eps: jax.Array


class SineSPE(nn.Module):
    """P_d(τ) = Σ_k λ_k² cos(2π f_k τ + θ_k), with f = sigmoid(freqs) / 2 (see spemusic.nn.spe)."""

    n_heads: int
    d_head: int
    n_sines: int = 5
    n_realizations: int = 64

    def setup(self):
        shape = (self.n_heads, self.d_head, self.n_sines)
        # the PyTorch initialisation: low frequencies (periods of tens of tokens), Σ λ² ≈ 1
        self.freqs = self.param("freqs", lambda key, s: jax.random.normal(key, s) - 4.0, shape)
        self.phases = self.param("phases", nn.initializers.normal(1.0), shape)
        self.gains = self.param("gains", nn.initializers.normal(1 / math.sqrt(self.n_sines)), shape)

    @nn.nowrap  # shapes only: callable on the module unbound, `SineSPE(...).draw(key)`
    def draw(self, key: jax.Array) -> SineCode:
        H, D, K, R = self.n_heads, self.d_head, self.n_sines, self.n_realizations
        kz, ke = jax.random.split(key)
        s = 1 / math.sqrt(R)
        return SineCode(jax.random.normal(kz, (H, D, 2 * K, R)) * s, jax.random.normal(ke, (H, D, R)) * s)

    def _features(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """[cos, sin] per sine at `positions` (T,), times the gains: (T, H, D, 2K) for the
        queries (phases θ added) and the keys."""
        wide = _wide()
        f = (jax.nn.sigmoid(self.freqs) / 2).astype(wide)  # fp32, then wide: as PyTorch forms it
        base = jnp.fmod(2 * math.pi * f * positions.astype(wide)[:, None, None, None], 2 * math.pi)
        gains = jnp.repeat(self.gains, 2, axis=-1)

        def trig(ph):
            ph = ph.astype(jnp.float32)
            return jnp.stack((jnp.cos(ph), jnp.sin(ph)), -1).reshape(*ph.shape[:-1], -1) * gains

        return trig(base + self.phases.astype(wide)), trig(base)

    def __call__(self, code: SineCode, start: int | jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
        """The codes Q̄, K̄ at positions start … start + length - 1: two (T, H, D, R)."""
        fq, fk = self._features(start + jnp.arange(length))
        return jnp.einsum("thdj,hdjr->thdr", fq, code.z), jnp.einsum("thdj,hdjr->thdr", fk, code.z)

    def code_at(self, code: SineCode, t: int | jax.Array) -> jax.Array:
        """[Q̄_t; K̄_t] at position t alone: (2, H, D, R) (closed form: no state to carry)."""
        return jnp.concatenate(self(code, t, 1))


# --------------------------------------------------------------------------- convSPE


@struct.dataclass
class ConvCode:
    """One convSPE realization: the gate's noise ε (H, D, R), and the white noise Z_p (H, D, R) at
    every position p, from `key` (normal(fold_in(key, p)) / √R), or read from `noise`, a table of
    positions noise_start … (PyTorch's draws, say)."""

    eps: jax.Array
    key: jax.Array | None = None
    noise: jax.Array | None = None
    noise_start: int = struct.field(pytree_node=False, default=0)


class ConvSPE(nn.Module):
    """Q̄ = Z ∗ φ_Q, K̄ = Z ∗ φ_K, causal filters of `kernel_size` taps (see spemusic.nn.spe)."""

    n_heads: int
    d_head: int
    kernel_size: int = 128
    n_realizations: int = 64

    def setup(self):
        H, D, L = self.n_heads, self.d_head, self.kernel_size

        def init(key, shape):  # both filters start equal: P starts symmetric, with P(0) ≈ 1
            phi = jax.random.normal(key, (H, D, L)) / math.sqrt(L)
            return jnp.stack((phi, phi))

        self.filters = self.param("filters", init, (2, H, D, L))

    @nn.nowrap  # shapes only: callable on the module unbound
    def draw(self, key: jax.Array) -> ConvCode:
        key, ke = jax.random.split(key)
        return ConvCode(jax.random.normal(ke, (self.n_heads, self.d_head, self.n_realizations))
                        / math.sqrt(self.n_realizations), key=key)

    def noise(self, code: ConvCode, start: int | jax.Array, length: int) -> jax.Array:
        """Z at positions start … start + length - 1: (length, H, D, R)."""
        if code.noise is not None:
            return jax.lax.dynamic_slice_in_dim(code.noise, start - code.noise_start, length)
        shape = (self.n_heads, self.d_head, self.n_realizations)
        one = lambda p: jax.random.normal(jax.random.fold_in(code.key, p + _KEY_OFFSET), shape)  # noqa: E731
        return jax.vmap(one)(start + jnp.arange(length)) / math.sqrt(self.n_realizations)

    def __call__(self, code: ConvCode, start: int, length: int) -> tuple[jax.Array, jax.Array]:
        """The codes Q̄, K̄ at positions start … start + length - 1: two (T, H, D, R)."""
        L = self.kernel_size
        return self.codes_from_noise(self.noise(code, start - L + 1, length + L - 1), length)

    def codes_from_noise(self, z: jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
        """Causal convolution of z (T + L - 1, H, D, R) -> Q̄, K̄ (T, H, D, R), by FFT."""
        L = self.kernel_size
        n = length + L - 1
        nfft = 1 << (n - 1).bit_length()
        zf = jnp.fft.rfft(z.astype(jnp.float32), n=nfft, axis=0)  # (F, H, D, R)
        ff = jnp.fft.rfft(self.filters.astype(jnp.float32), n=nfft, axis=-1)  # (2, H, D, F)
        out = jnp.fft.irfft(zf[None] * jnp.moveaxis(ff, -1, 1)[..., None], n=nfft, axis=1)
        out = out[:, L - 1: L - 1 + length]  # position p is index p + L - 1 of z
        return out[0], out[1]

    def stream_init(self, code: ConvCode, start: int) -> jax.Array:
        """The stream's state at `start`: a ring buffer of Z at start - L … start - 1 (slot p mod L)."""
        L = self.kernel_size
        z = self.noise(code, start - L, L)
        return z[jnp.argsort((jnp.arange(start - L, start)) % L)]

    def code_at(self, code: ConvCode, stream: jax.Array, t: int | jax.Array) -> tuple[jax.Array, jax.Array]:
        """(the stream moved to t + 1, [Q̄_t; K̄_t] (2, H, D, R))."""
        L = self.kernel_size
        stream = stream.at[t % L].set(self.noise(code, t, 1)[0])
        lags = (t - jnp.arange(L)) % L  # slot s holds Z at t - lags[s]
        return stream, jnp.einsum("chds,shdr->chdr", self.filters[..., lags], stream)


# --------------------------------------------------------------------------- filter


class SPEFilter(nn.Module):
    """q̂ = Σ_d q[d] Q̄'[d, :] with the gated code Q̄' = √(1-g) Q̄ + √g ε, g = sigmoid(gate) per head
    and feature (ungated: Q̄' = Q̄); the same for the keys."""

    n_heads: int
    d_head: int
    gated: bool = True

    def setup(self):
        if self.gated:
            self.gate = self.param("gate", nn.initializers.zeros, (self.n_heads, self.d_head))

    def _gated(self, qbar: jax.Array, kbar: jax.Array, eps: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        if not self.gated:
            return qbar, kbar
        if eps is None:
            raise ValueError("a gated SPEFilter needs the code's eps")
        g = jax.nn.sigmoid(self.gate)[..., None]
        return jnp.sqrt(1 - g) * qbar + jnp.sqrt(g) * eps, jnp.sqrt(1 - g) * kbar + jnp.sqrt(g) * eps

    def __call__(self, q: jax.Array, k: jax.Array, codes: tuple[jax.Array, jax.Array],
                 eps: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """q, k (B, T, H, D), codes (Q̄, K̄) (T, H, D, R) -> q̂, k̂ (B, T, H, R)."""
        qbar, kbar = self._gated(*codes, eps)
        return jnp.einsum("bthd,thdr->bthr", q, qbar), jnp.einsum("bthd,thdr->bthr", k, kbar)

    def step(self, q: jax.Array, k: jax.Array, code_t: jax.Array,
             eps: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """One position: q, k (B, H, D), code_t = [Q̄_t; K̄_t] (2, H, D, R) -> q̂_t, k̂_t (B, H, R)."""
        qbar, kbar = self._gated(code_t[0], code_t[1], eps)
        return jnp.einsum("bhd,hdr->bhr", q, qbar), jnp.einsum("bhd,hdr->bhr", k, kbar)


def params_from_torch(module) -> dict:
    """The Flax variables ({"params": …}) of a spemusic.nn.spe SineSPE, ConvSPE or SPEFilter."""
    return {"params": {name: jnp.asarray(p.detach().cpu().numpy()) for name, p in module.named_parameters()}}
