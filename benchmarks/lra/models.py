"""The LRA classifiers: one small encoder, its attention and positional encoding chosen by name.

Every model has the same size (embedding, LAYERS pre-norm blocks of attention and feed-forward,
masked mean pooling, a linear head) and differs only in its attention and positional encoding:

    softmax          exact softmax attention, learned absolute PE (the Transformer reference)
    favor            Performer (FAVOR+ positive random features), no PE
    favor-ape        Performer, learned absolute PE
    favor-sinespe    Performer, SPE (spemusic.nn.spe): sineSPE, ungated / gated
    favor-convspe    Performer, SPE: convSPE, ungated / gated

Attention is bidirectional, as in LRA's encoders. With SPE the queries and keys go through the
SPE filter first (q̂, k̂ of R features, spemusic.nn.spe's public API), then through FAVOR+: that is
the paper's construction. A fresh SPE draw per training step, a fixed one in evaluation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spemusic.nn.attention import favor_key, favor_query, orthogonal_features
from spemusic.nn.spe import ConvSPE, SineSPE, SPEFilter

MODELS = ("softmax", "favor", "favor-ape", "favor-sinespe", "favor-sinespe-gated", "favor-convspe",
          "favor-convspe-gated")
D_MODEL, LAYERS, HEADS, D_FF = 64, 2, 4, 128
FEATURES, REALIZATIONS, SINES, CONV_KERNEL = 64, 32, 10, 128


class Attention(nn.Module):
    def __init__(self, kind: str, spe: nn.Module | None):
        super().__init__()
        self.kind, self.spe = kind, spe
        self.d_head = D_MODEL // HEADS
        self.qkv, self.out = nn.Linear(D_MODEL, 3 * D_MODEL), nn.Linear(D_MODEL, D_MODEL)
        self.filter = SPEFilter(HEADS, self.d_head, gated=kind.endswith("-gated")) if spe is not None else None
        dk = REALIZATIONS if spe is not None else self.d_head
        # one fixed feature draw per layer (seeded by the model's seed through torch's generator)
        self.register_buffer("omega", orthogonal_features(FEATURES, dk) * dk ** -0.25)
        self.dk = dk

    def forward(self, x: torch.Tensor, mask: torch.Tensor, spe_ctx) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, HEADS, self.d_head).unbind(2)  # (B, T, H, d)
        if self.kind == "softmax":
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               attn_mask=mask[:, None, None, :]).transpose(1, 2)
        else:
            if self.filter is not None:
                q, k = self.filter(q, k, spe_ctx)  # (B, T, H, R)
            qf = favor_query(q.float(), self.omega)
            kf = favor_key(k.float(), self.omega, self.dk ** -0.5) * mask[:, :, None, None]
            kv = torch.einsum("bthm,bthd->bhmd", kf, v.float())
            num = torch.einsum("bthm,bhmd->bthd", qf, kv)
            den = torch.einsum("bthm,bhm->bth", qf, kf.sum(1))[..., None]
            o = num / (den + 1e-6)
        return self.out(o.reshape(B, T, D_MODEL).to(x.dtype))


class Block(nn.Module):
    def __init__(self, kind: str, spe):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.attn = Attention(kind, spe)
        self.ff = nn.Sequential(nn.Linear(D_MODEL, D_FF), nn.GELU(), nn.Linear(D_FF, D_MODEL))

    def forward(self, x, mask, spe_ctx):
        x = x + self.attn(self.n1(x), mask, spe_ctx)
        return x + self.ff(self.n2(x))


class Classifier(nn.Module):
    def __init__(self, kind: str, vocab_size: int, classes: int, max_len: int, pool: str = "mean"):
        super().__init__()
        if kind not in MODELS:
            raise ValueError(f"unknown model {kind!r}: one of {', '.join(MODELS)}")
        self.kind, self.pool = kind, pool
        self.embed = nn.Embedding(vocab_size, D_MODEL)
        # "cls": a learned token before the input, whose output the head reads (LRA's ListOps);
        # "mean": the mean of the outputs over the input (LRA's Pathfinder)
        self.cls = nn.Parameter(torch.randn(D_MODEL) * 0.02) if pool == "cls" else None
        max_len += pool == "cls"
        self.ape = nn.Parameter(torch.randn(max_len, D_MODEL) * 0.02) if kind in ("softmax", "favor-ape") else None
        d_head = D_MODEL // HEADS
        self.spe = (SineSPE(HEADS, d_head, n_sines=SINES, n_realizations=REALIZATIONS) if "sinespe" in kind
                    else ConvSPE(HEADS, d_head, kernel_size=CONV_KERNEL, n_realizations=REALIZATIONS)
                    if "convspe" in kind else None)  # one code generator shared by the layers
        self.blocks = nn.ModuleList(Block(kind, self.spe) for _ in range(LAYERS))
        self.norm, self.head = nn.LayerNorm(D_MODEL), nn.Linear(D_MODEL, classes)
        self.eval_code = None

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(len(x), 1, -1), x], dim=1)
            mask = torch.cat([mask.new_ones(len(x), 1), mask], dim=1)
        T = x.shape[1]
        if self.ape is not None:
            x = x + self.ape[:T]
        spe_ctx = None
        if self.spe is not None:
            if self.training:
                code = self.spe.draw(None)
            else:
                self.eval_code = self.eval_code or self.spe.draw((0,))
                code = self.eval_code
            spe_ctx = self.spe.context(code, 0, T)
        for blk in self.blocks:
            x = blk(x, mask, spe_ctx)
        x = self.norm(x)
        if self.cls is not None:
            return self.head(x[:, 0])
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return self.head(pooled)


def loss_and_hits(model: Classifier, ids, mask, labels) -> tuple[torch.Tensor, int]:
    logits = model(ids, mask)
    return F.cross_entropy(logits, labels), int((logits.argmax(-1) == labels).sum())
