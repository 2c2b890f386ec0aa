"""Attention kernels: FAVOR+ features, causal linear attention in its chunked, recurrent and
naive forms, and softmax attention with a KV cache.

Every form of linear attention has one signature, as in flash-linear-attention:

    o, final_state = form(q, k, v, initial_state=None, output_final_state=False, *, eps=…, …)

q, k (B, H, T, M) are feature maps (φ(q̂), φ(k̂)), v (B, H, T, Dv); a state is S = Σ φ(k) [v, 1]ᵀ
(B, H, M, Dv+1) fp32, the normaliser z in its last column; final_state is None unless asked for.
initial_state is never modified. favor_attention and favor_attention_training take the
unmapped q̂, k̂ (φ is taken inside) with the same signature.

FAVOR+ (Choromanski et al. 2021) approximates exp(q·k) by φ(q)·φ(k) with
positive random features φ(x) = exp(ωᵀx - |x|²/2) / √M and orthogonal ω.

Stabiliser. Subtracting a max over the whole sequence is
non-causal and cannot be reproduced step by step, so:

* queries: subtract the per-position max over features of ωᵀx (and drop the
  per-position |x|²/2 and 1/√M). A per-position factor cancels between the
  numerator Σ φ(q)·φ(k) v and the denominator Σ φ(q)·φ(k): exact, and
  causal.
* keys: no stabiliser. ωᵀx - |x|²/2 = |ω|²/2 - |x - ω|²/2 ≤ |ω|²/2, bounded
  above by a constant of the (fixed) features (≈ dk/2 + a few √dk), so
  exp() and the running sums cannot overflow in fp32.

The chunked, recurrent and naive forms compute exactly this function
(up to float summation order); the running state S = Σ φ(k) [v, 1]ᵀ (the
normaliser z is the last column) is always kept in fp32, also under bf16
autocast.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from spemusic.nn.compiled import compiled

__all__ = [
    "orthogonal_features",
    "favor_query",
    "favor_key",
    "favor_key_constants",
    "chunked_linear_attention",
    "recurrent_linear_attention",
    "naive_linear_attention",
    "favor_attention",
    "favor_attention_training",
    "KVCache",
    "EPS",
]

EPS = 1e-6


def orthogonal_features(n_features: int, dim: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Gaussian orthogonal random matrix (n_features, dim) as in Performer:
    stacked blocks of orthonormal rows (QR of Gaussian matrices), each row then
    rescaled by an independent chi(dim)-distributed norm."""
    blocks = []
    n_full = n_features // dim
    for _ in range(n_full + (1 if n_features % dim else 0)):
        g = torch.randn(dim, dim, generator=generator)
        q, _ = torch.linalg.qr(g)
        blocks.append(q.T)
    w = torch.cat(blocks)[:n_features]
    norms = torch.randn(n_features, dim, generator=generator).norm(dim=1)
    return norms[:, None] * w


def favor_query(x: torch.Tensor | None, omega: torch.Tensor, projection: torch.Tensor | None = None) -> torch.Tensor:
    """φ for queries, stabilised per position. x (..., dk) fp32, omega (M, dk)
    already multiplied by the dk^(-1/4) data scaling. projection: x @ omega.T where the caller
    has it already (the recurrent step projects q̂ and k̂ in one product; x is then unused)."""
    p = x @ omega.T if projection is None else projection
    top = p.amax(-1, keepdim=True)
    # the per-position max cancels in the attention output, so no gradient flows through it:
    # detaching it is exact and spares autograd a (.., M) tensor per layer
    return (p - (top.detach() if top.requires_grad else top)).exp_()


def favor_key(x: torch.Tensor, omega: torch.Tensor, scale2: float, offset: torch.Tensor | None = None,
              projection: torch.Tensor | None = None) -> torch.Tensor:
    """φ for keys, unstabilised (bounded above, see module doc). scale2 = dk^(-1/2)
    (the square of the data scaling folded in omega). offset: a‖x‖² + b (..., 1)
    (favor_key_constants) where the caller has it (the recurrent step: see Attention.step);
    None: from the sum of squares. projection: as for favor_query."""
    p = x @ omega.T if projection is None else projection
    if offset is None:
        a, b = favor_key_constants(scale2, omega.shape[0])
        offset = (x * x).sum(-1, keepdim=True) * a + b
    return (p - offset).exp_()


def favor_key_constants(scale2: float, n_features: int) -> tuple[float, float]:
    """φ(k) = exp(ω·k - a‖k‖² - b): a = scale2 / 2, b = log √M. The 1/√M factor goes inside the
    exponent: exp's output is then φ(k) itself, the one (.., M) tensor autograd keeps (a scaled
    copy would keep a second one)."""
    return 0.5 * scale2, math.log(math.sqrt(n_features))


def _ones_col(v: torch.Tensor) -> torch.Tensor:
    """[v, 1]: the extra column accumulates the normaliser z next to S."""
    return F.pad(v, (0, 1), value=1.0)


def _chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """(B, H, T, m) -> (B, H, N, C, m), zero-padded to N·C positions."""
    B, H, T, m = x.shape
    N = -(-T // C)
    return F.pad(x, (0, 0, 0, N * C - T)).view(B, H, N, C, m)


def _causal_mask(C: int, device) -> torch.Tensor:
    return torch.ones(C, C, dtype=torch.bool, device=device).tril()


def _before_each_chunk(cum: torch.Tensor) -> torch.Tensor:
    """Running sums over chunks (dim 2) -> the sums of the chunks before each one (exclusive)."""
    return torch.cat((torch.zeros_like(cum[:, :, :1]), cum[:, :, :-1]), 2)


def _chunk_prefix_states(kf, vv):
    """The state of the chunks before each chunk, Σ_{c' < c} kf_c'ᵀ vv_c' (B, H, N, M, Dv+1), in fp32."""
    return _before_each_chunk((kf.transpose(-1, -2) @ vv).float().cumsum(2))


def _chunk_outputs(q, k, vv, prev):
    """Every position's [numerator, denominator] (B, H, N·C, Dv+1) in fp32: the masked product inside
    its chunk plus the chunks before it (prev, in the products' dtype)."""
    a = (q @ k.transpose(-1, -2)).masked_fill(~_causal_mask(q.shape[3], q.device), 0.0)
    return ((a @ vv).float() + (q @ prev).float()).flatten(2, 3)


def chunked_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    chunk_size: int = 128,
    eps: float = EPS,
    mm_dtype: torch.dtype | None = None,
):
    """Causal linear attention o_t = Σ_{s≤t} (q_t·k_s) v_s / Σ_{s≤t} q_t·k_s, a chunk at a time.

    q, k: (B, H, T, M) feature maps; v: (B, H, T, Dv). Inside each chunk of C
    positions: the masked C×C product; across chunks: one state per chunk
    S_c = Σ_{s∈c} k_s [v_s, 1]ᵀ (M × (Dv+1)) and its exclusive cumsum. Memory
    O(T·(M + Dv + C) + T/C·M·Dv): never the per-position outer products.

    initial_state: the running state (B, H, M, Dv+1) of earlier positions, continued.
    mm_dtype: the products' input dtype (bf16 in training under autocast: each product's sums
    still accumulate in fp32 and the running state is summed in fp32); None: fp32 throughout.
    Returns (o (B, H, T, Dv) fp32, the final state (B, H, M, Dv+1) fp32 or None).
    """
    mm = mm_dtype or torch.float32
    with torch.autocast(device_type=q.device.type, enabled=False):
        T, Dv = q.shape[2], v.shape[-1]
        C = max(1, min(chunk_size, T))
        # padded keys are zero features: no contribution anywhere (incl. final state)
        qc, kc, vv = _chunks(q.to(mm), C), _chunks(k.to(mm), C), _chunks(_ones_col(v.to(mm)), C)
        cum = (kc.transpose(-1, -2) @ vv).float().cumsum(2)  # the chunk states' running sums
        prev = _before_each_chunk(cum)
        if initial_state is not None:
            prev = prev + initial_state[:, :, None].float()
        out = _chunk_outputs(qc, kc, vv, prev.to(mm))[:, :, :T]
        o = out[..., :Dv] / (out[..., Dv:] + eps)
        if not output_final_state:
            return o, None
        final = cum[:, :, -1]
        if initial_state is not None:
            final = final + initial_state.float()
        return o, final


def recurrent_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    eps: float = EPS,
    in_place: bool = False,
):
    """The same function a position at a time, S ← S + k_t [v_t, 1]ᵀ, o_t = q_t·S / (q_t·z + eps):
    generation's form, one token per call (or a few). Shapes as chunked_linear_attention; the
    products in fp32. Returns (o (B, H, T, Dv) fp32, the final state or None).
    in_place: the final state is written over initial_state (fp32, contiguous), as a decoder that
    owns its state wants: a token's step then allocates no state."""
    B, H, T, M = q.shape
    Dv = v.shape[-1]
    if initial_state is None:
        s = q.new_zeros(B * H, M, Dv + 1, dtype=torch.float32)
    elif in_place:
        s = initial_state.view(B * H, M, Dv + 1)
    else:
        s = initial_state.float().reshape(B * H, M, Dv + 1).clone()
    # (B·H, ·, ·) for the batched products: q and [v, 1] by rows, k by columns
    q, k = q.float().reshape(B * H, T, M), k.float().reshape(B * H, T, M).transpose(1, 2)
    v1 = _ones_col(v.float()).view(B * H, T, Dv + 1)
    outs = [torch.bmm(q[:, t:t + 1], s.baddbmm_(k[:, :, t:t + 1], v1[:, t:t + 1])) for t in range(T)]
    out = (outs[0] if T == 1 else torch.cat(outs, 1)).view(B, H, T, Dv + 1)
    return out[..., :Dv] / (out[..., Dv:] + eps), s.view(B, H, M, Dv + 1) if output_final_state else None


def naive_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    eps: float = EPS,
):
    """The same function as an O(T²) masked product, in float64: the others' reference, for tests.
    Returns (o (B, H, T, Dv), the final state or None), float64."""
    q, k, v1 = q.double(), k.double(), _ones_col(v.double())
    T = q.shape[-2]
    a = (q @ k.transpose(-1, -2)) * torch.ones(T, T, dtype=torch.float64, device=q.device).tril()
    out = a @ v1  # every position's [numerator, denominator]
    final = k.transpose(-1, -2) @ v1
    if initial_state is not None:
        out = out + q @ initial_state.double()
        final = final + initial_state.double()
    o = out[..., :-1] / (out[..., -1:] + eps)
    return o, final if output_final_state else None


def favor_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor | None = None,
                    output_final_state: bool = False, *, omega: torch.Tensor, scale2: float, chunk_size: int = 128,
                    mm_dtype: torch.dtype | None = None):
    """FAVOR+ causal attention of q̂, k̂ (B, H, T, dk) and v: φ(q̂), φ(k̂) in fp32, then
    chunked_linear_attention (omega and scale2 as for favor_query / favor_key). The training
    step computes the same with favor_attention_training (its own backward pass); this is its
    reference, and the parallel pass's form outside training."""
    return chunked_linear_attention(favor_query(q.float(), omega), favor_key(k.float(), omega, scale2), v,
                                    initial_state, output_final_state, chunk_size=chunk_size, mm_dtype=mm_dtype)


class _FavorAttention(torch.autograd.Function):
    """favor_attention with a hand-written backward pass that keeps less for it: φ(q̂) and φ(k̂) in
    the products' dtype, k̂ (for its norm's gradient), the denominators, v and the output. With an
    SPE filter v costs nothing (a view of the qkv projection, which the filter keeps), and o is
    written in the layout the output projection reads and keeps (in out_dtype: under bf16 the
    denominators' gradient uses the bf16 o, as the products use bf16 inputs). The masked chunk
    products and the chunks' prefix states are recomputed (two batched products per layer).
    Autograd's own backward kept those and more, at the same speed (docs/measurements.md, "Figures
    behind the code"; benchmarks/step_memory.py --saved, train_throughput.py). Each pass is one compiled
    region (spemusic.nn.compiled) where inductor is available, and runs with autocast off (the
    trainer's backward pass runs under it): the products' dtype is mm_dtype, everything else fp32."""

    @staticmethod
    def forward(ctx, q, k, v, omega, scale2, chunk_size, mm_dtype, out_dtype):
        mm = mm_dtype or torch.float32
        with torch.autocast(q.device.type, enabled=False):
            o, qf, kf, den = compiled(_favor_forward)(q, k, v, omega, scale2, chunk_size, mm, out_dtype)
        ctx.save_for_backward(k, v, omega, qf, kf, den, o)
        ctx.scale2, ctx.chunk_size, ctx.mm, ctx.q_dtype = scale2, chunk_size, mm, q.dtype
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable  # (the saved φ carry no graph back to q and k)
    def backward(ctx, grad):
        k, v, omega, qf, kf, den, o = ctx.saved_tensors
        with torch.autocast(k.device.type, enabled=False):
            gq, gk, gv = compiled(_favor_backward)(grad.transpose(1, 2), k, v, omega, qf, kf, den, o, ctx.scale2,
                                                   ctx.chunk_size, ctx.mm)
        return gq.to(ctx.q_dtype), gk.to(k.dtype), gv.to(v.dtype), None, None, None, None, None


def favor_attention_training(q, k, v, initial_state=None, output_final_state: bool = False, *, omega,
                             scale2: float, chunk_size: int = 128, mm_dtype=None, out_dtype=torch.float32):
    """favor_attention for the training step: the same function and gradients, in less memory
    (_FavorAttention); o (B, H, T, Dv) in out_dtype, a view of a (B, T, H, Dv) tensor, so the
    heads' concatenation before the output projection copies nothing. A training sequence starts
    from no state and keeps none: initial_state must be None and output_final_state False (the
    final state returned is None). omega gets no gradient (FAVOR+'s features are fixed)."""
    if initial_state is not None or output_final_state:
        raise ValueError("favor_attention_training neither continues nor returns a state: use favor_attention")
    return _FavorAttention.apply(q, k, v, omega, scale2, chunk_size, mm_dtype, out_dtype).transpose(1, 2), None


def _favor_forward(q, k, v, omega, scale2, chunk_size, mm, out_dtype):
    """chunked_linear_attention(φ(q), φ(k), v) (as favor_attention), returning what the backward
    pass needs: o (B, T, H, Dv), φ(q̂), φ(k̂) chunked in mm, o's denominators."""
    T, Dv = q.shape[2], v.shape[-1]
    C = max(1, min(chunk_size, T))
    qf = _chunks(favor_query(q.float(), omega), C).to(mm)
    kf = _chunks(favor_key(k.float(), omega, scale2), C).to(mm)
    vv = _chunks(_ones_col(v.to(mm)), C)
    out = _chunk_outputs(qf, kf, vv, _chunk_prefix_states(kf, vv).to(mm))[:, :, :T]
    den = out[..., Dv:] + EPS
    o = (out[..., :Dv] / den).transpose(1, 2).contiguous().to(out_dtype)
    return o, qf, kf, den


def _favor_backward(grad, k, v, omega, qf, kf, den, o, scale2, chunk_size, mm):
    """Gradients of _favor_forward's o with respect to q, k, v, given grad (B, H, T, Dv)."""
    T, Dv = k.shape[2], v.shape[-1]
    C = qf.shape[3]
    g = grad.float()
    o = o.transpose(1, 2).float()
    # o = num / den: d num = g / den; d den = -Σ g·o / den (den is num's last column + EPS)
    gnum = _chunks(torch.cat((g, -(g * o).sum(-1, keepdim=True)), -1) / den, C).to(mm)
    vv = _chunks(_ones_col(v.to(mm)), C)
    mask = _causal_mask(C, k.device)
    a = (qf @ kf.transpose(-1, -2)).masked_fill(~mask, 0.0)  # recomputed, not kept
    prev = _chunk_prefix_states(kf, vv).to(mm)  # likewise
    ga = (gnum @ vv.transpose(-1, -2)).masked_fill(~mask, 0.0)
    gprev = (qf.transpose(-1, -2) @ gnum).float()
    # prev_c = Σ_{c' < c} S_c', so dS_c = Σ_{c' > c} dprev_c'
    rev = gprev.flip(2).cumsum(2).flip(2)
    gstate = torch.cat((rev[:, :, 1:], torch.zeros_like(rev[:, :, :1])), 2).to(mm)
    gqf = (ga @ kf).float() + (gnum @ prev.transpose(-1, -2)).float()
    gkf = (ga.transpose(-1, -2) @ qf).float() + (vv @ gstate.transpose(-1, -2)).float()
    gvv = (a.transpose(-1, -2) @ gnum).float() + (kf @ gstate).float()
    B, H, N, _, M = qf.shape
    # through φ: d exp(p) = exp(p) dφ, then p = x ωᵀ (minus, for keys, scale2/2 |k|², whose gradient is -scale2 k)
    gpq = (gqf * qf.float()).view(B, H, N * C, M)[:, :, :T]
    gpk = (gkf * kf.float()).view(B, H, N * C, M)[:, :, :T]
    gq = gpq @ omega
    gk = gpk @ omega - scale2 * k.float() * gpk.sum(-1, keepdim=True)
    gv = gvv.flatten(2, 3)[:, :, :T, :Dv]
    return gq, gk, gv


class KVCache:
    """Per-layer key/value cache for softmax attention, grown geometrically."""

    def __init__(self, batch: int, heads: int, dk: int, dv: int, device, dtype=torch.float32, capacity: int = 256):
        self.k = torch.empty(batch, heads, capacity, dk, device=device, dtype=dtype)
        self.v = torch.empty(batch, heads, capacity, dv, device=device, dtype=dtype)
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k: (B, H, t, dk), v: (B, H, t, dv); returns views of all cached keys/values."""
        t = k.shape[2]
        need = self.length + t
        cap = self.k.shape[2]
        if need > cap:
            new_cap = max(need, 2 * cap)
            nk = self.k.new_empty(*self.k.shape[:2], new_cap, self.k.shape[3])
            nv = self.v.new_empty(*self.v.shape[:2], new_cap, self.v.shape[3])
            nk[:, :, :self.length] = self.k[:, :, :self.length]
            nv[:, :, :self.length] = self.v[:, :, :self.length]
            self.k, self.v = nk, nv
        self.k[:, :, self.length:need] = k
        self.v[:, :, self.length:need] = v
        self.length = need
        return self.k[:, :, :need], self.v[:, :, :need]

    def clone(self) -> KVCache:
        c = KVCache.__new__(KVCache)
        c.k, c.v, c.length = self.k.clone(), self.v.clone(), self.length
        return c

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()
