"""Autograd functions that save memory in training, each equal to a plain expression.

Autograd would keep every intermediate of these expressions for the backward pass; each function
here keeps only what its backward needs (tensors held anyway, or cheap to recompute) and computes
the same values and gradients (tests/test_model.py compares each with its plain expression):

    norm_linear(x, norm, W, b)    = F.linear(norm(x), W, b)
    gelu_linear(u, W, b)          = F.linear(F.gelu(u), W, b)
    sine_filter(x, trig, …)       = the sineSPE filter (SineFilter: its formula)

Outside training (no gradient) the plain expressions run.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spemusic.nn.compiled import compiled

__all__ = ["GeluLinear", "NormLinear", "SineFilter", "gelu_linear", "norm_linear", "sine_filter"]


class NormLinear(torch.autograd.Function):
    """linear(layer_norm(x), weight, bias) keeping x and its statistics for the backward pass (the
    norm's own backward needs them anyway): the normalised x is recomputed there (elementwise,
    cheap) instead of being held, for the three norms of every layer and the head."""

    @staticmethod
    def forward(ctx, x, ln_weight, ln_bias, eps, weight, bias):
        xn, mean, rstd = torch.native_layer_norm(x, x.shape[-1:], ln_weight, ln_bias, eps)
        ctx.save_for_backward(x, mean, rstd, ln_weight, ln_bias, weight)
        ctx.eps, ctx.has_bias = eps, bias is not None
        return F.linear(xn, weight, bias)  # under autocast: in its dtype, like nn.Linear

    @staticmethod
    def backward(ctx, grad):
        x, mean, rstd, ln_weight, ln_bias, weight = ctx.saved_tensors
        dt = grad.dtype
        xn = torch.native_layer_norm(x, x.shape[-1:], ln_weight, ln_bias, ctx.eps)[0]
        g = grad.reshape(-1, grad.shape[-1])
        grad_xn = (grad @ weight.to(dt)).to(x.dtype)
        grad_x, grad_lw, grad_lb = torch.ops.aten.native_layer_norm_backward(
            grad_xn, x, x.shape[-1:], mean, rstd, ln_weight, ln_bias, [True, True, True])
        grad_w = g.T @ xn.reshape(-1, xn.shape[-1]).to(dt)
        return grad_x, grad_lw, grad_lb, None, grad_w, g.sum(0) if ctx.has_bias else None


def norm_linear(x: torch.Tensor, norm: nn.LayerNorm, weight: torch.Tensor, bias: torch.Tensor | None):
    """linear(norm(x)); in training, through NormLinear (less memory, same gradients). Outside
    training norm(x) goes in the weight's dtype (the step's plan may hold half-precision weights)."""
    if norm.training and torch.is_grad_enabled():
        return NormLinear.apply(x, norm.weight, norm.bias, norm.eps, weight, bias)
    return F.linear(norm(x).to(weight.dtype), weight, bias)


class GeluLinear(torch.autograd.Function):
    """linear(gelu(u), weight, bias) keeping only u for the backward pass: gelu(u) is recomputed
    there (elementwise, a small share of a step) instead of being held, d_ff wide, for every layer."""

    @staticmethod
    def forward(ctx, u, weight, bias):
        ctx.save_for_backward(u, weight)
        return F.linear(F.gelu(u), weight, bias)  # under autocast: in its dtype, like nn.Linear

    @staticmethod
    def backward(ctx, grad):
        u, weight = ctx.saved_tensors
        dt = grad.dtype
        a = F.gelu(u).to(dt).reshape(-1, u.shape[-1])
        g = grad.reshape(-1, grad.shape[-1])
        grad_u = torch.ops.aten.gelu_backward((grad @ weight.to(dt)).to(u.dtype), u)
        # autograd casts the weight and bias gradients to the parameters' dtype
        return grad_u, g.T @ a, g.sum(0)


def gelu_linear(u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """linear(gelu(u), weight, bias); where a gradient is wanted, through GeluLinear (less memory,
    same gradients)."""
    if torch.is_grad_enabled() and (u.requires_grad or weight.requires_grad):
        return GeluLinear.apply(u, weight, bias)
    return F.linear(F.gelu(u), weight, bias)



SINE_TILE_ROWS = 1024  # (batch × positions) rows per tile of the sineSPE filter


class SineFilter(torch.autograd.Function):
    """x̂[b, t, h] = Σ_{d, j} x[b, t, h, d] · trig[t, h, d, j] · scale[h, d, j] · zz[h, (j, d)]
    (+ Σ_d x[b, t, h, d] · extra[h, d] · zz[h, (J, d)] when gated: the ε rows), where
    trig[t, h, d, 2k:2k+2] = [cos, sin](ω[h, d, k] · pos[t] + θ[h, d, k]).

    Written out by hand so that autograd keeps only x (the projection's output, held anyway), the
    trig features (shared by every layer) and the small scales, not a gated copy of x per layer.
    trig comes computed (from float64 phases: SineSPE.features) and its gradient is not formed:
    the backward pass returns ∂L/∂ω = Σ_t pos[t] ∂L/∂φ[t] and ∂L/∂θ = Σ_t ∂L/∂φ[t] (φ the phase),
    summed tile by tile, instead of a (T, H, D, J) gradient per layer and call for autograd to add
    up and carry back through cos and sin. ω and θ are only that: where the gradients go (θ is
    None for keys, whose phases have no offset).

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
    def forward(ctx, x, trig, scale, extra, zz, omega, theta, pos, mm_dtype):
        ctx.save_for_backward(x, trig, scale, extra, zz, pos)
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
        x, trig, scale, extra, zz, pos = ctx.saved_tensors
        B, T, H, D = x.shape
        zzt = zz.to(ctx.mm_dtype).transpose(1, 2)
        want_phase = ctx.needs_input_grad[5] or ctx.needs_input_grad[6]
        grad_x = torch.empty_like(x)
        grad_scale = torch.zeros_like(scale)
        grad_extra = torch.zeros_like(extra) if extra is not None else None
        grad_omega = grad_theta = scale.new_zeros(H, D, scale.shape[-1] // 2) if want_phase else None
        for t0, t1 in _tiles(B, T):
            t = t1 - t0
            g = grad[:, t0:t1].permute(2, 0, 1, 3).to(ctx.mm_dtype).reshape(H, B * t, -1)
            gp = torch.bmm(g, zzt).view(H, B, t, -1, D)  # ∂L/∂(GEMM input), in mm_dtype
            gx, gs, ge, go, gt = compiled(_tile_grads)(gp, _tile_x(x, t0, t1), trig[t0:t1], scale, extra,
                                                      pos[t0:t1], want_phase)
            grad_x[:, t0:t1] = gx
            grad_scale += gs
            if extra is not None:
                grad_extra += ge
            if want_phase:
                grad_omega, grad_theta = grad_omega + go, grad_theta + gt
        if not ctx.needs_input_grad[6]:
            grad_theta = None
        return grad_x, None, grad_scale, grad_extra, None, grad_omega, grad_theta, None, None


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
    """The GEMM input of one tile, in dtype: x (H, B, t, 1, D) times its features (H, t, J', D),
    contiguous (H, B, t, J', D). (The product would follow x's (B, t, H) layout, and bmm would copy
    it into this one: that copy took longer than the product and the bmm together.)"""
    return (x.to(dtype) * _tile_features(trig, scale, extra).to(dtype)[:, None]).contiguous()


def _tile_grads(gp, x, trig, scale, extra, pos, want_phase: bool):
    """One tile's gradients from gp = ∂L/∂(x·features) (H, B, t, J', D), summed in fp32:
    ∂L/∂x (B, t, H, D) in x's dtype, and this tile's shares of ∂L/∂scale (H, D, J),
    ∂L/∂extra (H, D, 1) (None without extra), ∂L/∂ω and ∂L/∂θ (H, D, J/2) (None unless
    want_phase), the phases at positions pos (t,)."""
    J = trig.shape[-1]
    f = _tile_features(trig, scale, extra)
    gx = (gp.float() * f[:, None]).sum(3).to(x.dtype).permute(1, 2, 0, 3)
    gf = (gp.float() * x.float()).sum(1)  # (H, t, J', D)
    gs = gf[:, :, :J]
    trig_h = trig.permute(1, 0, 3, 2)  # (H, t, J, D)
    g_scale = (gs * trig_h).sum(1).transpose(1, 2)
    g_extra = gf[:, :, J:].sum(1).transpose(1, 2) if extra is not None else None
    if not want_phase:
        return gx, g_scale, g_extra, None, None
    # ∂L/∂φ = ∂L/∂cos · (-sin φ) + ∂L/∂sin · cos φ, features ordered [cos, sin] per sine
    g_trig = (gs * scale.transpose(1, 2)[:, None]).unflatten(2, (-1, 2))  # (H, t, K, 2, D)
    cs = trig_h.unflatten(2, (-1, 2))
    g_phase = g_trig[:, :, :, 1] * cs[:, :, :, 0] - g_trig[:, :, :, 0] * cs[:, :, :, 1]  # (H, t, K, D)
    g_omega = (g_phase * pos[None, :, None, None]).sum(1).transpose(1, 2)
    return gx, g_scale, g_extra, g_omega, g_phase.sum(1).transpose(1, 2)


def _tiles(B: int, T: int):
    step = max(1, SINE_TILE_ROWS // B)
    return [(t0, min(T, t0 + step)) for t0 in range(0, T, step)]


def sine_filter(x, trig, scale, extra, zz, omega, theta, pos) -> torch.Tensor:
    """x (B, T, H, D), trig (T, H, D, J), scale (H, D, J), extra (H, D, 1) or None, zz (H, J[+1]·D, R),
    omega and theta (H, D, J/2) (theta None: no offset), pos (T,) -> (B, T, H, R); see SineFilter."""
    dev = x.device.type
    mm_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else torch.float32
    with torch.autocast(dev, enabled=False):
        return SineFilter.apply(x, trig, scale, extra, zz, omega, theta, pos, mm_dtype)
