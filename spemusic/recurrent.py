"""The recurrent path of the Performer: one token per call, constant time and memory.

``State`` holds, per layer, the FAVOR+ running state S (B, H, M, D+1) in fp32 (last column:
the normaliser z) or a softmax KV cache; per convSPE module, its noise ring buffer; and a
``StepPlan``: the constants a step needs, derived once from the weights and the SPE draw
(a state belongs to the draw it was started with).

``step`` computes the same function as the parallel path (tests: ≤ 1e-4 in fp32) in few
operations: at batch 1 a step is ~150 small kernels, whose count costs as much as the weight
bytes each token reads. Per token, the SPE code at t is formed once for every layer (gates
folded in: q̂ = q · (√(1-g) ⊙ Q̄_t + √g ⊙ ε)); per layer, q̂ and k̂ come from one batched
product, φ(q̂), φ(k̂) from one more and one exp.

``weights_dtype=torch.float16`` (or bfloat16) keeps a half-precision copy of the linear layers'
weights for the step (activations, SPE, attention and its state stay fp32; products accumulate
in fp32): half the bytes read per token, which on a CPU is most of a batch-1 step. Logits then
differ from the fp32 step by ~4e-4 of their range with fp16, ~2e-3 with bf16
(tests/test_model.py); the shipped models' NLL on real pieces is unchanged to 1e-5 and 1e-4 nats
(benchmarks/step_precision.py).

The step is for inference: dropout is not applied.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from spemusic.attention import KVCache, favor_key_constants, linear_attention_step
from spemusic.spe import ConvSPE, SineSPE

__all__ = ["State", "StepPlan", "build_plan", "step", "new_stream_states"]

Linear = tuple  # (weight, bias) in the plan's weights dtype


@dataclass
class LayerPlan:
    qkv: Linear
    out: Linear
    ff1: Linear
    ff2: Linear
    omega_t: torch.Tensor | None  # (dk, M) FAVOR+ projection, data scaling folded in
    code: torch.Tensor | None = None  # (2H, D or 2D, R) view of StepPlan.code_buf (SPE)
    gate: torch.Tensor | None = None  # (2H, 1, 2, D): [√(1-g), √g] per q/k head (gated SPE)
    shift: torch.Tensor | None = None  # (K, d) fp32 short-convolution weights (short_conv)


@dataclass
class StepPlan:
    weights_dtype: torch.dtype
    layers: list  # LayerPlan per layer
    codes: list | None  # the SPE draw (per SPE module) the state belongs to
    sine: list | None  # per SPE module: SineStepTables, or None for convSPE
    # scratch rewritten by every step: (n SPE modules, 2, H, 2 or 1, D, R) = [Q̄_t, ε] / [K̄_t, ε]
    code_buf: torch.Tensor | None
    key_scale: float  # φ(k) = exp(ω·k̂ - key_scale ‖k̂‖² - key_offset) (attention.favor_key_constants)
    key_offset: torch.Tensor  # (1, 1, 1)


@dataclass
class State:
    """Recurrent generation state (batched). ``step`` updates it in place and
    returns it; use ``clone()`` to branch.

    position: index of the next token; layers: per layer, the FAVOR running
    state S (B, H, M, Dv+1) fp32 (last column = normaliser z) or a KVCache;
    pe: per SPE module, a ConvStream (convSPE ring buffer) or None.
    """

    position: int
    batch_size: int
    layers: list
    pe: list = field(default_factory=list)
    plan: StepPlan = field(default=None, repr=False)  # set by Performer.prime / init_state
    histories: list = field(default_factory=list)  # per layer, its last K inputs (B, K, d) newest first (short_conv)

    def clone(self) -> "State":
        return State(
            position=self.position,
            batch_size=self.batch_size,
            layers=[l.clone() for l in self.layers],
            pe=[p.clone() if p is not None else None for p in self.pe],
            plan=self.plan,
            histories=[h.clone() for h in self.histories],
        )

    def nbytes(self) -> int:
        n = 0
        for l in self.layers:
            n += l.nbytes() if isinstance(l, KVCache) else l.numel() * l.element_size()
        for p in self.pe:
            if p is not None:
                n += p.buf.numel() * p.buf.element_size()
        return n + sum(h.numel() * h.element_size() for h in self.histories)


def _linear(lin, dtype) -> Linear:
    return lin.weight.detach().to(dtype), lin.bias.detach().to(dtype)  # the same tensors when fp32


@torch.no_grad()
def build_plan(model, codes, weights_dtype: torch.dtype = torch.float32) -> StepPlan:
    cfg = model.cfg
    H, D, R = cfg.n_heads, cfg.d_head, cfg.n_realizations
    layers = [LayerPlan(_linear(b.attn.qkv, weights_dtype), _linear(b.attn.out, weights_dtype),
                        _linear(b.ff1, weights_dtype), _linear(b.ff2, weights_dtype),
                        b.attn._scaled_omega().T.contiguous() if b.attn.favor else None,
                        shift=b.shift.detach().float() if b.shift is not None else None) for b in model.blocks]
    sine, code_buf = None, None
    if codes is not None:
        sine = [m.step_tables(c) if isinstance(m, SineSPE) else None for m, c in zip(model.spe, codes)]
        # the step writes Q̄_t, K̄_t into code_buf; the gated filter of a layer is then one
        # product: [q ⊙ √(1-g), q ⊙ √g] · [Q̄_t; ε] (no per-layer gated code is formed)
        rows = 2 if cfg.gated else 1
        code_buf = torch.zeros(len(codes), 2, H, rows, D, R, device=model.device)
        if cfg.gated:
            code_buf[:, :, :, 1] = torch.stack([c.eps for c in codes])[:, None]
        for i, (lp, blk) in enumerate(zip(layers, model.blocks)):
            lp.code = code_buf[i if len(codes) > 1 else 0].view(2 * H, rows * D, R)
            if cfg.gated:
                g = torch.sigmoid(blk.attn.filter.gate)  # (H, D)
                lp.gate = torch.stack((torch.sqrt(1 - g), torch.sqrt(g)), 1).repeat(2, 1, 1)[:, None]
    key_scale, key_offset = favor_key_constants(model.blocks[0].attn.dk ** -0.5, cfg.n_features)
    offset = torch.full((1, 1, 1), key_offset, device=model.device)
    return StepPlan(weights_dtype, layers, codes, sine, code_buf, key_scale, offset)


def _write_codes(model, state: State, t: int) -> None:
    """Write the SPE codes at position t into the plan's code buffer."""
    plan = state.plan
    for i, (m, c, tables, stream) in enumerate(zip(model.spe, plan.codes, plan.sine, state.pe)):
        if tables is not None:
            qk = SineSPE.code_at(tables, t)
        else:
            qbar, kbar = m.stream_step(c, stream, t)
            qk = torch.cat((qbar, kbar))
        plan.code_buf[i, :, :, 0].copy_(qk)


def _attention(cfg, lp: LayerPlan, plan: StepPlan, h: torch.Tensor, S) -> torch.Tensor:
    """One layer's attention for one token: h (B, d) -> (B, d) before the output projection."""
    B = h.shape[0]
    H, D = cfg.n_heads, cfg.d_head
    d = H * D
    w, b = lp.qkv
    qkv = F.linear(h.to(w.dtype), w, b).float()
    qk = qkv[:, : 2 * d].view(B, 2 * H, D).transpose(0, 1)  # (2H, B, D): q heads, then k heads
    if lp.code is None:
        xh = qk
    else:
        if lp.gate is not None:
            qk = (qk[:, :, None] * lp.gate).view(2 * H, B, 2 * D)  # [q ⊙ √(1-g), q ⊙ √g]
        xh = torch.bmm(qk, lp.code)  # q̂, k̂: (2H, B, dk)
    v = qkv[:, 2 * d:].view(B, H, D)
    if lp.omega_t is None:  # softmax with a KV cache
        q = xh[:H].transpose(0, 1)[:, :, None]
        kk, vv = S.append(xh[H:].transpose(0, 1)[:, :, None], v[:, :, None])
        return F.scaled_dot_product_attention(q, kk.to(q.dtype), vv.to(q.dtype))[:, :, 0].reshape(B, d)
    p = torch.matmul(xh, lp.omega_t)  # (2H, B, M): ω·q̂, ω·k̂
    pq, pk = p[:H], p[H:]
    pq.sub_(pq.amax(-1, keepdim=True))  # query stabiliser (cancels in the output)
    dk = xh.shape[-1]
    xk = xh[H:].reshape(H * B, 1, dk)
    sq = torch.baddbmm(plan.key_offset, xk, xk.transpose(1, 2), alpha=plan.key_scale)  # (H·B, 1, 1)
    pk.sub_(sq.view(H, B, 1))
    p.exp_()  # φ(q̂), φ(k̂) (attention.favor_query / favor_key), in one pass
    return linear_attention_step(pq.transpose(0, 1), pk.transpose(0, 1), v, S).reshape(B, d)


@torch.no_grad()
def step(model, state: State, next_ids: torch.Tensor):
    """Feed one token per sequence at ``state.position``: (B,) -> (logits (B, V), state)."""
    t = state.position
    plan = state.plan
    # the step's precision is the plan's, whatever autocast is active (the state stays fp32)
    with torch.autocast(device_type=model.device.type, enabled=False):
        if plan.code_buf is not None:
            _write_codes(model, state, t)
        x = model._embed(next_ids[:, None], t)[:, 0].float()
        for i, (blk, lp, S) in enumerate(zip(model.blocks, plan.layers, state.layers)):
            if lp.shift is not None:  # the short convolution over the block's last K inputs
                hist = state.histories[i]
                shifted = x + torch.einsum("bkd,kd->bd", hist, lp.shift)
                state.histories[i] = torch.cat((x[:, None], hist[:, :-1]), 1)
                x = shifted
            o = _attention(model.cfg, lp, plan, blk.ln1(x), S)
            w, b = lp.out
            x = x + F.linear(o.to(w.dtype), w, b)
            w1, b1 = lp.ff1
            w2, b2 = lp.ff2
            u = F.gelu(F.linear(blk.ln2(x).to(w1.dtype), w1, b1))
            x = x + F.linear(u, w2, b2)
        logits = model._head(x)
    state.position = t + 1
    return logits, state


def new_stream_states(model, codes, start: int) -> list:
    """Per SPE module, its streaming state at ``start`` (convSPE ring buffer) or None."""
    if model.spe is None:
        return []
    return [m.stream_init(c, start, model.device) if isinstance(m, ConvSPE) else None
            for m, c in zip(model.spe, codes)]

