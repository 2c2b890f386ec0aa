"""The state of the recurrent path: one token per call, constant time and memory.

``State`` holds, per layer, the FAVOR+ running state S (B, H, M, D+1) in fp32 (last column:
the normaliser z) or a softmax KV cache; per SPE module, its stream (convSPE: a noise ring
buffer); and a ``StepPlan``: the constants a step needs, derived once from the weights and the
SPE draw (a state belongs to the draw it was started with). The step itself sits beside each
layer's parallel form: ``Attention.step``, ``Block.step`` and ``Performer.step`` in model.py.

The step computes the same function as the parallel path (tests: ≤ 1e-4 in fp32) in few
operations: at batch 1 a step is ~150 small kernels, whose count costs as much as the weight
bytes each token reads. Per token, the SPE code at t is formed once for every layer (gates
folded in: q̂ = q · (√(1-g) ⊙ Q̄_t + √g ⊙ ε)); per layer, q̂ and k̂ come from one batched
product. φ, the FFN and the linear attention are the parallel pass's own code (favor_query,
favor_key, Block.ffn; recurrent_linear_attention is chunked_linear_attention's recurrent form).

``weights_dtype=torch.float16`` (or bfloat16) keeps a half-precision copy of the linear layers'
weights for the step (activations, SPE, attention and its state stay fp32; products accumulate
in fp32): half the bytes read per token, which on a CPU is most of a batch-1 step. How far the
logits and the NLL move: tests/test_model.py and benchmarks/step_precision.py.

The step is for inference: dropout is not applied.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spemusic.nn.attention import KVCache

__all__ = ["LayerPlan", "State", "StepPlan", "build_plan"]

Linear = tuple  # (weight, bias) in the plan's weights dtype


@dataclass
class LayerPlan:
    """What the step needs of one layer (Block.plan)."""

    qkv: Linear
    out: Linear
    omega: torch.Tensor | None  # (M, dk) FAVOR+ features, data scaling folded in; None: softmax
    omega_t: torch.Tensor | None  # omega.T, contiguous: the step's product
    gate: torch.Tensor | None  # (2H, 1, 2, D): [√(1-g), √g] per q/k head (gated SPE)
    ff: tuple  # the feed-forward's two Linears, ((w1, b1), (w2, b2))
    shift_t: torch.Tensor | None  # (d, 1, K) fp32 short-convolution weights (short_conv), a channel's taps per row
    code: torch.Tensor | None = None  # (2H, D or 2D, R) view of StepPlan.code_buf (SPE), set by build_plan
    # φ(k) = exp(ω·k - key_scale ‖k‖² - key_offset) (attention.favor_key_constants); key_offset (1, 1, 1)
    key_scale: float = 0.0
    key_offset: torch.Tensor | None = None


@dataclass
class StepPlan:
    weights_dtype: torch.dtype
    layers: list  # LayerPlan per layer
    codes: list | None  # the SPE draw (per SPE module) the state belongs to
    # scratch rewritten by every step: (n SPE modules, 2, H, 2 or 1, D, R) = [Q̄_t, ε] / [K̄_t, ε]
    code_buf: torch.Tensor | None


@dataclass
class State:
    """Recurrent generation state (batched). ``step`` updates it in place and
    returns it; use ``clone()`` to branch.

    position: index of the next token; layers: per layer, the FAVOR running
    state S (B, H, M, Dv+1) fp32 (last column = normaliser z) or a KVCache;
    pe: per SPE module, its code's stream (spe.SPE.stream_init).
    """

    position: int
    batch_size: int
    layers: list
    pe: list = field(default_factory=list)
    plan: StepPlan = field(default=None, repr=False)  # set by Performer.prime / init_state
    histories: list = field(default_factory=list)  # per layer, its last K inputs (B, K, d) newest first (short_conv)
    # what spemusic.nn.recall carries from token to token ("pitch", "echo", "interval": tensors), or None
    recall: dict | None = None

    def clone(self) -> State:
        return State(
            position=self.position,
            batch_size=self.batch_size,
            layers=[layer.clone() for layer in self.layers],
            pe=[p.clone() for p in self.pe],
            plan=self.plan,
            histories=[h.clone() for h in self.histories],
            recall=None if self.recall is None else {k: v.clone() for k, v in self.recall.items()},
        )

    def nbytes(self) -> int:
        n = 0
        for layer in self.layers:
            n += layer.nbytes() if isinstance(layer, KVCache) else layer.numel() * layer.element_size()
        n += sum(p.nbytes() for p in self.pe)
        n += sum(v.numel() * v.element_size() for v in (self.recall or {}).values())
        return n + sum(h.numel() * h.element_size() for h in self.histories)


@torch.no_grad()
def build_plan(model, codes, weights_dtype: torch.dtype = torch.float32) -> StepPlan:
    cfg = model.cfg
    H, D, R = cfg.n_heads, cfg.d_head, cfg.n_realizations
    layers = [b.plan(weights_dtype) for b in model.blocks]
    code_buf = None
    if codes is not None:
        # the step writes Q̄_t, K̄_t into code_buf; the gated filter of a layer is then one
        # product: [q ⊙ √(1-g), q ⊙ √g] · [Q̄_t; ε] (no per-layer gated code is formed)
        rows = 2 if cfg.gated else 1
        code_buf = torch.zeros(len(codes), 2, H, rows, D, R, device=model.device)
        if cfg.gated:
            code_buf[:, :, :, 1] = torch.stack([c.eps for c in codes])[:, None]
        for i, lp in enumerate(layers):
            lp.code = code_buf[i if len(codes) > 1 else 0].view(2 * H, rows * D, R)
    return StepPlan(weights_dtype, layers, codes, code_buf)
