"""The spemusic language model: a decoder-only Performer with Stochastic
Positional Encoding, a chunked parallel path (training, scoring, priming) and
an O(1)-per-token recurrent path (generation).

    cfg = ModelConfig.preset("tiny", vocab_size=V, pe="sinespe", gated=True)
    model = Performer(cfg)
    logits = model(ids)                      # (B, T) -> (B, T, V)
    model.eval(); model.resample(seed)       # fix the SPE realization
    logits, state = model.prime(ids)         # one parallel pass over a prompt
    logits, state = model.step(state, nxt)   # (B,) -> (B, V); state updated in place

Design notes (SPE: Liutkus et al., ICML 2021; FAVOR+: Choromanski et al., ICLR 2021):
* One SPE code per sequence batch (training: fresh each forward; eval: fixed by
  ``resample``), shared by all layers when ``share_pe``; every layer has its own
  gate. The code is applied to q, k after the projections (per head), giving
  R-dim q̂, k̂; FAVOR+ features are then taken of q̂, k̂.
* FAVOR+ ω are persistent buffers (saved in checkpoints); ``redraw_features``
  draws new ones (training), ``resample`` leaves them alone unless asked.
* Absolute PEs (ape, sinusoidal, axial) raise ``SpemusicError`` past max_len (axial-continuous does not);
  SPE has no limit.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from spemusic.errors import SpemusicError
from spemusic.nn.attention import (
    KVCache,
    favor_attention,
    favor_attention_training,
    favor_key,
    favor_key_constants,
    favor_query,
    orthogonal_features,
    recurrent_linear_attention,
)
from spemusic.nn.compiled import compiled
from spemusic.nn.fused import gelu_linear, norm_linear
from spemusic.nn.positional import AbsolutePE, build_absolute_pe
from spemusic.nn.recall import (
    add_echo_scores,
    bar_clock as clock_rows,
    chord_scores,
    echo_features,
    echo_places,
    interval_anchor,
    interval_scores,
    key_scores,
    melody_reads,
    pitch_memory as memory_rows,
    pitch_profile,
)
from spemusic.nn.recurrent import LayerPlan, State, build_plan
from spemusic.nn.spe import ConvSPE, SineSPE, SPECodes, SPEFilter, mix_seed
from spemusic.options import (  # noqa: F401  (re-exported: the configs' choices)
    ABSOLUTE_PE_OPTIONS,
    ATTENTION_OPTIONS,
    LENGTH_LIMITED_PE_OPTIONS,
    MODEL_PRESETS,
    PE_OPTIONS,
    PRESETS,
    SPE_OPTIONS,
)

__all__ = ["ModelConfig", "Performer", "State"]



# Upper bounds of the size fields: far above any model this program trains, low enough that the
# metadata of a checkpoint from elsewhere cannot make the constructor loop for hours (n_features
# orthogonal blocks) before the size estimate below refuses it.
SIZE_LIMITS = dict(vocab_size=1 << 20, n_layers=1024, d_model=1 << 16, n_heads=1024, d_ff=1 << 18,
                   n_features=1 << 14, n_realizations=1 << 12, n_sines=256, kernel_size=1 << 16,
                   max_len=1 << 24, chunk_size=1 << 16)


PRIME_CHUNK = 4096  # prompt tokens per parallel pass of Performer.prime


def _int_pairs(value, most: int, ok) -> bool:
    """Whether `value` is a list of at most `most` [a, b] pairs of integers, each with ok(a, b)."""
    return isinstance(value, list) and len(value) <= most and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(i, int) and not isinstance(i, bool) for i in p)
        and ok(*p) for p in value)


@dataclass
class ModelConfig:
    vocab_size: int
    n_layers: int = 6
    d_model: int = 256
    n_heads: int = 8
    d_ff: int = 1024
    dropout: float = 0.0
    attention: str = "favor"  # "favor" | "softmax"
    n_features: int = 128  # FAVOR+ random features M (per head)
    pe: str = "sinespe"  # "sinespe" | "convspe" | "ape" | "sinusoidal" | "axial" | "axial-continuous" | "none"
    gated: bool = True
    share_pe: bool = True  # one SPE code per sequence shared by all layers; each layer has its own gate
    n_realizations: int = 64  # R
    n_sines: int = 5
    kernel_size: int = 128
    max_len: int = 2048  # limits absolute PEs (ape, sinusoidal, axial); axial-continuous scales to it
    chunk_size: int = 128  # chunked linear attention
    # each block first adds a causal depthwise convolution over its inputs at the previous
    # `short_conv` tokens (0: none, as in models trained before it). Linear attention cannot look
    # back sharply at the last few tokens (which pitch came just before, which note field is
    # next); a short convolution can, at O(1) per generated token (Zoology, Based, H3, Mamba).
    short_conv: int = 0
    # what the model is told about its own stream (spemusic.nn.recall); empty: none, as in models
    # trained before them. Pitch memory: the Program ids whose last pitch every token sees, and
    # `pitch_range` the Pitch ids [lo, hi). Bar echo: [Bar id, first Position id, last + 1], and
    # `echo_bars` the bars it reads back (what most of them had at each place). Interval head: the
    # Program ids whose next Pitch is also scored as an interval from that Program's last pitch,
    # up to `interval_reach` semitones apart (one score for all farther ones), from one table per
    # part and whether a bar line came between; needs the Bar id (`bar_id`). Echo head (needs the
    # bar echo): the bar lags whose echoes are scored as the next token, by how many of the last
    # `echo_window` tokens each lag named right. Repeat marks (needs the bar echo): [id, lag] of
    # each mark token; where a mark names a lag, the echo is that lag's and the echo head scores
    # that lag from a table of its own (spemusic.tokens.repeats). Echo kinds: [lo, hi) id ranges
    # (Pitch, Duration, …) whose candidates the echo head scores from tables of their own (a pitch
    # repeats more surely than its velocity); every other candidate from the first. Melody head
    # (needs the bar echo and melody-first bars; recall.melody_reads): [melody Program id, the
    # Program ids of the parts that read it]; each such part's next Pitch is also scored as an
    # interval from the melody pitch sounding there (up to `interval_reach`), from one table per
    # part and whether that melody note begins there, and the melody's from its register (one
    # more table); `melody_durations` [first Duration id, the grid steps of each];
    # `melody_chords` [first Chord id, qualities]: the Chord ids, root by root, each scored by
    # the bar's melody pitch classes relative to its root (a table per quality). Bar clock: [BOS
    # id, Bar id, bars(, melody Program id(, rest bars))]: every token sees how many bars the piece
    # has had since BOS, up to `bars` (and, with the melody's id, since the melody entered; a
    # second table; with rest bars, since it last played, up to that many: a third)
    # (recall.bar_clock; the last rows also for a context that did not open on BOS). Key head:
    # the Program ids of the parts whose next Pitch is also scored by the pitch classes their
    # notes have sounded so far (recall.pitch_profile), a table of 12 per part; `key_chords`
    # [first Chord id, qualities]: each Chord id scored by the same profile read from its root (a
    # table per quality).
    pitch_memory: list = field(default_factory=list)
    pitch_range: list = field(default_factory=lambda: [0, 0])
    bar_echo: list = field(default_factory=list)
    echo_bars: int = 1
    interval_head: list = field(default_factory=list)
    interval_reach: int = 24
    bar_id: int = -1
    echo_head: list = field(default_factory=list)
    echo_window: int = 16
    repeat_marks: list = field(default_factory=list)
    echo_kinds: list = field(default_factory=list)
    melody_head: list = field(default_factory=list)
    melody_durations: list = field(default_factory=list)
    melody_chords: list = field(default_factory=list)
    bar_clock: list = field(default_factory=list)
    key_head: list = field(default_factory=list)
    key_chords: list = field(default_factory=list)

    def __post_init__(self):
        if self.attention not in ATTENTION_OPTIONS:
            raise SpemusicError(f"attention must be one of {', '.join(ATTENTION_OPTIONS)}, not {self.attention!r}")
        if self.pe not in PE_OPTIONS:
            raise SpemusicError(f"pe must be one of {', '.join(PE_OPTIONS)}, not {self.pe!r}")
        for name, limit in SIZE_LIMITS.items():
            val = getattr(self, name)
            if not isinstance(val, int) or isinstance(val, bool) or not 1 <= val <= limit:
                raise SpemusicError(f"model config: {name} must be an integer in 1 … {limit:,}, not {val!r}")
        if self.d_model % self.n_heads:
            raise SpemusicError(f"model config: d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise SpemusicError(f"model config: dropout must be in [0, 1), not {self.dropout!r}")
        if not isinstance(self.short_conv, int) or isinstance(self.short_conv, bool) or not 0 <= self.short_conv <= 64:
            raise SpemusicError(f"model config: short_conv must be an integer in 0 … 64, not {self.short_conv!r}")
        ids_ok = lambda v: isinstance(v, list) and all(isinstance(i, int) and 0 <= i < self.vocab_size for i in v)  # noqa: E731
        if not ids_ok(self.pitch_memory) or len(self.pitch_memory) > 8:
            raise SpemusicError(f"model config: pitch_memory must be at most 8 token ids, not {self.pitch_memory!r}")
        if not ids_ok(self.interval_head) or len(self.interval_head) > 8:
            raise SpemusicError(f"model config: interval_head must be at most 8 token ids, not {self.interval_head!r}")
        if not isinstance(self.interval_reach, int) or isinstance(self.interval_reach, bool) \
                or not 1 <= self.interval_reach <= 127:
            raise SpemusicError(f"model config: interval_reach must be an integer in 1 … 127, not {self.interval_reach!r}")
        if self.interval_head and not (isinstance(self.bar_id, int) and 0 <= self.bar_id < self.vocab_size):
            raise SpemusicError(f"model config: an interval head needs the Bar id (bar_id), not {self.bar_id!r}")
        if self.melody_head:
            if not (ids_ok(self.melody_head) and 2 <= len(self.melody_head) <= 8 and self.bar_echo):
                raise SpemusicError(f"model config: melody_head must be [melody Program id, part Program ids] on a "
                                    f"model with the bar echo, not {self.melody_head!r}")
            d = self.melody_durations
            if not (isinstance(d, list) and 2 <= len(d) <= 257 and all(isinstance(i, int) and i >= 0 for i in d)
                    and d[0] + len(d) - 1 <= self.vocab_size):
                raise SpemusicError(f"model config: melody_durations must be [first Duration id, steps of each], not {d!r}")
            c = self.melody_chords
            if c and not (isinstance(c, list) and len(c) == 2 and all(isinstance(i, int) for i in c) and 1 <= c[1] <= 16
                          and 0 <= c[0] and c[0] + 12 * c[1] <= self.vocab_size):
                raise SpemusicError(f"model config: melody_chords must be [first Chord id, qualities], not {c!r}")
        c = self.bar_clock
        counts = lambda v, top: all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= top for n in v)  # noqa: E731
        if c and not (isinstance(c, list) and len(c) in (3, 4, 5) and ids_ok(c[:2] + c[3:4]) and counts(c[2:3], 256)
                      and counts(c[4:], 64)):
            raise SpemusicError(f"model config: bar_clock must be [BOS id, Bar id, bars 1 … 256(, melody Program id(, "
                                f"rest bars 1 … 64))], not {c!r}")
        if not ids_ok(self.key_head) or len(self.key_head) > 8:
            raise SpemusicError(f"model config: key_head must be at most 8 Program ids, not {self.key_head!r}")
        c = self.key_chords
        if c and not (self.key_head and isinstance(c, list) and len(c) == 2 and all(isinstance(i, int) for i in c)
                      and 1 <= c[1] <= 16 and 0 <= c[0] and c[0] + 12 * c[1] <= self.vocab_size):
            raise SpemusicError(f"model config: key_chords must be [first Chord id, qualities] on a model with a key "
                                f"head, not {c!r}")
        lo_hi = self.pitch_range
        pitches_ok = ids_ok(lo_hi) and len(lo_hi) == 2 and lo_hi[1] - lo_hi[0] == 128
        if (self.pitch_memory or self.interval_head or self.melody_head or self.key_head) and not pitches_ok:
            raise SpemusicError(f"model config: pitch_range must be the 128 Pitch ids [lo, hi), not {lo_hi!r}")
        if self.bar_echo and not (ids_ok(self.bar_echo) and len(self.bar_echo) == 3
                                  and self.bar_echo[1] < self.bar_echo[2]):
            raise SpemusicError(f"model config: bar_echo must be [Bar id, first Position id, last + 1], "
                                f"not {self.bar_echo!r}")
        if not isinstance(self.echo_bars, int) or isinstance(self.echo_bars, bool) or not 1 <= self.echo_bars <= 8:
            raise SpemusicError(f"model config: echo_bars must be an integer in 1 … 8, not {self.echo_bars!r}")
        if not (isinstance(self.echo_head, list) and len(self.echo_head) <= 8
                and all(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 8 for k in self.echo_head)
                and self.echo_head == sorted(set(self.echo_head))):
            raise SpemusicError(f"model config: echo_head must be at most 8 increasing bar lags in 1 … 8, "
                                f"not {self.echo_head!r}")
        if self.echo_head and not self.bar_echo:
            raise SpemusicError("model config: an echo head needs the bar echo (bar_echo)")
        if not _int_pairs(self.repeat_marks, 16, lambda i, lag: 0 <= i < self.vocab_size and lag in (0, 1, 2, 4, 8)):
            raise SpemusicError(f"model config: repeat_marks must be [token id, bar lag 0/1/2/4/8] pairs, "
                                f"not {self.repeat_marks!r}")
        if self.repeat_marks and not self.bar_echo:
            raise SpemusicError("model config: repeat marks need the bar echo (bar_echo)")
        self.repeat_marks = [list(m) for m in self.repeat_marks]
        if not _int_pairs(self.echo_kinds, 8, lambda lo, hi: 0 <= lo < hi <= self.vocab_size):
            raise SpemusicError(f"model config: echo_kinds must be at most 8 [first id, last + 1] ranges, "
                                f"not {self.echo_kinds!r}")
        if self.echo_kinds and not self.echo_head:
            raise SpemusicError("model config: echo kinds need the echo head (echo_head)")
        self.echo_kinds = [list(r) for r in self.echo_kinds]
        if not isinstance(self.echo_window, int) or isinstance(self.echo_window, bool) or not 1 <= self.echo_window <= 64:
            raise SpemusicError(f"model config: echo_window must be an integer in 1 … 64, not {self.echo_window!r}")
        for name in ("gated", "share_pe"):
            if not isinstance(getattr(self, name), bool):
                raise SpemusicError(f"model config: {name} must be true or false, not {getattr(self, name)!r}")

    @property
    def clock_tables(self) -> list[int]:
        """The rows of each of the bar clock's tables, in recall.bar_clock's order: the bars since
        BOS, since the melody entered, since it last played (each with its last row)."""
        c = self.bar_clock
        return [n + 1 for n in (c[2], c[2], *c[4:5])][:len(c) - 2] if c else []

    def size_estimate(self) -> int:
        """Parameters and buffers the model holds (its dominant terms, without building it): what
        loading it costs, checked against the memory before anything is allocated."""
        d, L = self.d_model, self.n_layers
        dk = self.n_realizations if self.uses_spe else self.d_head
        per_block = 4 * d * d + 2 * d * self.d_ff + self.short_conv * d
        if self.attention == "favor":
            per_block += self.n_features * dk
        spe = 0
        if self.uses_spe:
            per_code = (2 * self.kernel_size if self.pe == "convspe" else 3 * self.n_sines) * d
            spe = per_code * (1 if self.share_pe else L)
        absolute = self.max_len * d if self.pe in ("ape", "sinusoidal") else 0
        recall = (129 * len(self.pitch_memory) + (self.vocab_size + 1 if self.bar_echo else 0)
                  + sum(self.clock_tables))
        heads = (2 * len(self.interval_head) * (2 * self.interval_reach + 2)
                 + len(self.echo_head) * (self.echo_window + 1) * self.echo_tables * (len(self.echo_kinds) + 1)
                 + ((2 * len(self.melody_head) - 1) * (2 * self.interval_reach + 2) if self.melody_head else 0)
                 + 12 * (self.melody_chords[1] if self.melody_chords else 0) + 12 * len(self.key_head)
                 + 12 * (self.key_chords[1] if self.key_chords else 0))
        return (self.vocab_size + recall) * d + heads + L * per_block + spe + absolute

    @property
    def echo_tables(self) -> int:
        """The echo head's tables: one, and one more for the lag a Repeat mark names."""
        return 2 if self.repeat_marks else 1

    def echo_kind_offsets(self) -> torch.Tensor:
        """(vocab_size + 1,) the column where each candidate's kind's tables begin in the echo head's
        rows (0: the first kind's, also for no candidate, id vocab_size)."""
        out = torch.zeros(self.vocab_size + 1, dtype=torch.long)
        for i, (lo, hi) in enumerate(self.echo_kinds, start=1):
            out[lo:hi] = i * (self.echo_window + 1) * self.echo_tables
        return out

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def uses_spe(self) -> bool:
        return self.pe in SPE_OPTIONS

    @property
    def has_absolute_pe(self) -> bool:
        return self.pe in ABSOLUTE_PE_OPTIONS

    @property
    def length_limited(self) -> bool:
        """Its positional encoding has no value past max_len."""
        return self.pe in LENGTH_LIMITED_PE_OPTIONS

    @classmethod
    def preset(cls, name: str, **overrides) -> ModelConfig:
        if name not in MODEL_PRESETS:
            raise SpemusicError(f"unknown model preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}")
        kw = dict(MODEL_PRESETS[name])
        kw.update(overrides)
        if "vocab_size" not in kw:
            raise SpemusicError("ModelConfig.preset needs vocab_size=...")
        return cls(**kw)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        if not isinstance(d, dict):
            raise SpemusicError("model config must be a mapping")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SpemusicError(f"unknown model config key(s): {', '.join(unknown)}")
        if "vocab_size" not in d:
            raise SpemusicError("model config lacks vocab_size")
        return cls(**d)


def _weights(linear: nn.Linear, dtype: torch.dtype) -> tuple:
    """A linear layer's (weight, bias) for the step's plan, in dtype (the same tensors when fp32)."""
    return linear.weight.detach().to(dtype), linear.bias.detach().to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        H, D = cfg.n_heads, cfg.d_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        self.filter = SPEFilter(H, D, cfg.gated) if cfg.uses_spe else None
        self.dk = cfg.n_realizations if cfg.uses_spe else D
        self.favor = cfg.attention == "favor"
        if self.favor:
            self.register_buffer("omega", orthogonal_features(cfg.n_features, self.dk))
        self.drop = nn.Dropout(cfg.dropout)

    def redraw(self, generator: torch.Generator | None = None) -> None:
        if self.favor:
            w = orthogonal_features(self.cfg.n_features, self.dk, generator)
            self.omega.copy_(w.to(self.omega.device))

    def scaled_omega(self):
        return self.omega * self.dk ** -0.25

    def _qkv(self, x: torch.Tensor, norm: nn.LayerNorm, ctx):
        """x (B, T, d) -> q, k (B, H, T, dk), v (B, H, T, D) of norm(x)."""
        B, T, _ = x.shape
        H, D = self.cfg.n_heads, self.cfg.d_head
        q, k, v = norm_linear(x, norm, self.qkv.weight, self.qkv.bias).view(B, T, 3, H, D).unbind(2)
        if self.filter is not None:
            q, k = self.filter(q, k, ctx)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor, norm: nn.LayerNorm, ctx, want_state: bool = False, state=None):
        """Attention over norm(x) (the block's pre-norm, applied with the projection); `state`: the
        running state (FAVOR+) or KV cache (softmax) of the positions before x, continued."""
        B, T, d = x.shape
        q, k, v = self._qkv(x, norm, ctx)
        st = None
        if self.favor:
            dev = x.device.type
            mm_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
            with torch.autocast(device_type=dev, enabled=False):
                kw = dict(omega=self.scaled_omega(), scale2=self.dk ** -0.5, chunk_size=self.cfg.chunk_size)
                if self.training and torch.is_grad_enabled() and not want_state and state is None:
                    # φ and the chunk products (compiled regions where inductor is available), with a
                    # backward pass that recomputes the chunk products instead of keeping them; under
                    # autocast the chunk products run in its dtype (the state sums stay fp32)
                    o, _ = favor_attention_training(q, k, v, **kw, mm_dtype=mm_dtype, out_dtype=v.dtype)
                else:
                    o, st = favor_attention(q, k, v, state, want_state, **kw)
            o = o.to(v.dtype)
        elif state is not None:  # continue a KV cache: every cached key, then causal within x
            st = state
            P = st.length
            k_all, v_all = st.append(k, v)
            mask = torch.ones(T, P + T, dtype=torch.bool, device=x.device).tril(P)
            o = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if want_state:
                st = KVCache(B, self.cfg.n_heads, self.dk, self.cfg.d_head, x.device, k.dtype,
                             capacity=max(256, 1 << (T - 1).bit_length() if T > 1 else 1))
                st.append(k, v)
        y = self.drop(self.out(o.transpose(1, 2).reshape(B, T, d)))
        return y, st

    def step(self, x: torch.Tensor, norm: nn.LayerNorm, lp: LayerPlan, S):
        """forward for one token, with the plan's weights: x (B, d) -> (output (B, d), the state S or
        KV cache after it). The SPE code at this position is already in the plan's buffer
        (Performer.step), gates folded in: q̂ = q · (√(1-g) ⊙ Q̄_t + √g ⊙ ε), one batched product
        for q̂ and k̂."""
        B = x.shape[0]
        H, D = self.cfg.n_heads, self.cfg.d_head
        d = H * D
        qkv = norm_linear(x, norm, *lp.qkv).float()
        qk = qkv[:, : 2 * d].view(B, 2 * H, D).transpose(0, 1)  # (2H, B, D): q heads, then k heads
        if lp.code is None:
            xh = qk
        else:
            if lp.gate is not None:
                qk = (qk[:, :, None] * lp.gate).view(2 * H, B, 2 * D)  # [q ⊙ √(1-g), q ⊙ √g]
            xh = torch.bmm(qk, lp.code)  # q̂, k̂: (2H, B, dk)
        v = qkv[:, 2 * d:].view(B, H, 1, D)
        if lp.omega is None:  # softmax with a KV cache
            q = xh[:H].transpose(0, 1)[:, :, None]
            kk, vv = S.append(xh[H:].transpose(0, 1)[:, :, None], v)
            o = F.scaled_dot_product_attention(q, kk.to(q.dtype), vv.to(q.dtype))
        else:
            # φ of q̂, k̂ as the product wrote them (H, B, dk), read as (B, H, 1, M). φ(k̂)'s offset
            # a‖k̂‖² + b as one batched product, as the step has always taken it: the parallel
            # pass's sum of squares rounds differently, and sampled pieces follow the logits' last bits
            xk = xh[H:].reshape(H * B, 1, -1)
            offset = torch.baddbmm(lp.key_offset, xk, xk.transpose(1, 2), alpha=lp.key_scale)
            p = torch.matmul(xh, lp.omega_t).transpose(0, 1).unsqueeze(2)  # ω·q̂, ω·k̂ in one product
            qf = favor_query(None, lp.omega, p[:, :H])
            kf = favor_key(xk, lp.omega, self.dk ** -0.5, offset.view(H, B, 1, 1).transpose(0, 1), p[:, H:])
            o, S = recurrent_linear_attention(qf, kf, v, S, True, in_place=True)
        w, b = lp.out
        return F.linear(o.reshape(B, d).to(w.dtype), w, b), S

    @torch.no_grad()
    def plan(self, weights_dtype: torch.dtype) -> dict:
        """What the step needs of this layer (LayerPlan's fields): the linear weights in
        weights_dtype, FAVOR+'s features with their data scaling (None: softmax), and the gate
        as [√(1-g), √g] per q and k head (None: no gated SPE)."""
        gate = None
        if self.filter is not None and self.filter.gated:
            g = self.filter.gate_values()  # (H, D)
            gate = torch.stack((torch.sqrt(1 - g), torch.sqrt(g)), 1).repeat(2, 1, 1)[:, None]
        omega = self.scaled_omega() if self.favor else None
        key = {}
        if self.favor:
            a, b = favor_key_constants(self.dk ** -0.5, self.cfg.n_features)
            key = dict(key_scale=a, key_offset=torch.full((1, 1, 1), b, device=self.omega.device))
        return dict(qkv=_weights(self.qkv, weights_dtype), out=_weights(self.out, weights_dtype),
                    omega=omega, omega_t=omega.T.contiguous() if self.favor else None, gate=gate, **key)

    def empty_state(self, batch: int, device):
        if self.favor:
            return torch.zeros(batch, self.cfg.n_heads, self.cfg.n_features, self.cfg.d_head + 1,
                               device=device, dtype=torch.float32)
        return KVCache(batch, self.cfg.n_heads, self.dk, self.cfg.d_head, device)


def short_conv(x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
    """Causal depthwise convolution over the previous tokens: y_t = Σ_j weight[j-1] ⊙ x_{t-j},
    j = 1 … K (x (B, T, d), weight (K, d)); the token itself is left to the residual path.
    `past`: the K inputs before x (B, K, d), oldest first (zeros: the start of a sequence).
    Shifted views of one padded copy, added out of place (faster than in-place slice adds, which
    autograd turns into copies, and as fast as a depthwise conv1d without its transposes;
    benchmarks/profile_step.py times it in the training step)."""
    K, T = weight.shape[0], x.shape[1]
    xp = F.pad(x, (0, 0, K, 0)) if past is None else torch.cat((past.to(x.dtype), x), 1)
    w = weight.to(x.dtype)
    y = w[0] * xp[:, K - 1:K - 1 + T]
    for j in range(2, K + 1):
        y = y + w[j - 1] * xp[:, K - j:K - j + T]
    return y


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # zero at the start: a model given a short convolution computes what it did before
        self.shift = nn.Parameter(torch.zeros(cfg.short_conv, cfg.d_model)) if cfg.short_conv else None
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ff1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.ff2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def ffn(self, x: torch.Tensor, weights=None) -> torch.Tensor:
        """The feed-forward sublayer before its dropout, linear(gelu(linear(ln2(x)))), with this
        layer's weights or `weights`, ((w1, b1), (w2, b2)) from the step's plan."""
        (w1, b1), (w2, b2) = weights or ((self.ff1.weight, self.ff1.bias), (self.ff2.weight, self.ff2.bias))
        return gelu_linear(norm_linear(x, self.ln2, w1, b1), w2, b2)

    def forward(self, x, ctx, want_state=False, state=None, past=None):
        """-> (output, attention state or None, the last K inputs newest first or None).
        `state`, `past`: this layer's attention state and last K inputs (newest first) after the
        tokens before x, to continue from them (Performer.prime in chunks)."""
        history = None
        if self.shift is not None:
            K = self.shift.shape[0]
            before = past.flip(1) if past is not None else None  # oldest first
            if want_state:
                seen = x if before is None else torch.cat((before.to(x.dtype), x), 1)
                history = seen[:, -K:].flip(1).float()
                if history.shape[1] < K:
                    history = F.pad(history, (0, 0, 0, K - history.shape[1]))
            if before is None and torch.is_grad_enabled() and x.requires_grad:  # training: fixed shapes
                x = x + compiled(short_conv)(x, self.shift)
            else:
                x = x + short_conv(x, self.shift, before)
        a, st = self.attn(x, self.ln1, ctx, want_state, state)
        x = x + a
        return x + self.drop(self.ffn(x)), st, history

    def step(self, x: torch.Tensor, lp: LayerPlan, state, past: torch.Tensor | None):
        """forward for one token, with the plan's weights: x (B, d) -> (output, attention state,
        the last K inputs newest first or None). `state`, `past`: as for forward (past: a short
        convolution's last K inputs, None without one). Dropout is not applied."""
        history = None
        if lp.shift_t is not None:  # the short convolution over the block's last K inputs
            # Σ_k past[b, k] ⊙ shift[k], as einsum computes it (one product per channel), without its dispatch
            shifted = x + torch.bmm(lp.shift_t, past.permute(2, 1, 0)).view(x.shape[1], -1).T
            history = torch.cat((x[:, None], past[:, :-1]), 1)
            x = shifted
        a, state = self.attn.step(x, self.ln1, lp, state)
        x = x + a
        return x + self.ffn(x, lp.ff), state, history

    @torch.no_grad()
    def plan(self, weights_dtype: torch.dtype) -> LayerPlan:
        """What the step needs of this layer (recurrent.build_plan: the linear weights in weights_dtype)."""
        return LayerPlan(**self.attn.plan(weights_dtype),
                         ff=(_weights(self.ff1, weights_dtype), _weights(self.ff2, weights_dtype)),
                         shift_t=self.shift.detach().float().T.contiguous()[:, None] if self.shift is not None else None)


class Performer(nn.Module):
    """Decoder-only Performer LM with SPE / absolute PE options (see module doc)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if isinstance(cfg, dict):
            cfg = ModelConfig.from_dict(cfg)
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        nn.init.normal_(self.tok.weight, std=0.02)
        self.abs_pe: AbsolutePE | None = None
        if cfg.has_absolute_pe:
            self.abs_pe = build_absolute_pe(cfg.pe, cfg.max_len, cfg.d_model)
        self.spe: SPECodes | None = None
        if cfg.uses_spe:
            n = 1 if cfg.share_pe else cfg.n_layers
            if cfg.pe == "sinespe":
                mods = [SineSPE(cfg.n_heads, cfg.d_head, cfg.n_sines, cfg.n_realizations) for _ in range(n)]
            else:
                mods = [ConvSPE(cfg.n_heads, cfg.d_head, cfg.kernel_size, cfg.n_realizations) for _ in range(n)]
            self.spe = SPECodes(mods, cfg.n_layers)
        self.pitch_memory: nn.Embedding | None = None
        if cfg.pitch_memory:  # row 129*s + 1 + p: slot s's last pitch p; row 129*s: none yet
            self.pitch_memory = nn.Embedding(129 * len(cfg.pitch_memory), cfg.d_model)
            nn.init.zeros_(self.pitch_memory.weight)  # added to a trained model, it changes nothing at first
            self.register_buffer("memory_programs", torch.tensor(cfg.pitch_memory), persistent=False)
        self.bar_echo: nn.Embedding | None = None
        if cfg.bar_echo:  # row V: no echo
            self.bar_echo = nn.Embedding(cfg.vocab_size + 1, cfg.d_model)
            nn.init.zeros_(self.bar_echo.weight)
        # the bar clock's tables (recall.bar_clock): row b of the first, bar b since BOS; of the
        # second, b bars since the melody entered (0: not yet); of the third, the melody last played
        # b bars back (0: in this bar); the last row of each also for a context without BOS or
        # past the table (the third's: no melody yet)
        clocks = [nn.Embedding(n, cfg.d_model) for n in cfg.clock_tables]
        for table in clocks:
            nn.init.zeros_(table.weight)
        self.bar_clock, self.melody_clock, self.rest_clock = (clocks + [None] * 3)[:3]
        self.interval_head: nn.Embedding | None = None
        if cfg.interval_head:  # row 2 * part + across a bar line; column j: j - reach semitones, the last farther
            self.interval_head = nn.Embedding(2 * len(cfg.interval_head), 2 * cfg.interval_reach + 2)
            nn.init.zeros_(self.interval_head.weight)  # added to a trained model, it changes nothing at first
            self.register_buffer("interval_programs", torch.tensor(cfg.interval_head), persistent=False)
        self.echo_head: nn.Embedding | None = None
        if cfg.echo_head:  # row k: lag echo_head[k]; column j: j of the last echo_window tokens it named right
            # (each kind's tables in turn: (window + 1) columns a table)
            self.echo_head = nn.Embedding(len(cfg.echo_head),
                                          (cfg.echo_window + 1) * cfg.echo_tables * (len(cfg.echo_kinds) + 1))
            nn.init.zeros_(self.echo_head.weight)  # added to a trained model, it changes nothing at first
            self.register_buffer("echo_kind_offsets", cfg.echo_kind_offsets(), persistent=False)
        self.melody_head: nn.Embedding | None = None
        self.chord_head: nn.Embedding | None = None
        if cfg.melody_head:  # row 2 * part + the melody note begins here, the last the melody's register;
            # columns as the interval head's
            self.melody_head = nn.Embedding(2 * len(cfg.melody_head[1:]) + 1, 2 * cfg.interval_reach + 2)
            nn.init.zeros_(self.melody_head.weight)  # added to a trained model, it changes nothing at first
            self.register_buffer("melody_parts", torch.tensor(cfg.melody_head[1:]), persistent=False)
            first, *steps = cfg.melody_durations
            durations = torch.zeros(cfg.vocab_size, dtype=torch.long)
            durations[first:first + len(steps)] = torch.tensor(steps)
            self.register_buffer("melody_durations", durations, persistent=False)
            if cfg.melody_chords:  # row q: quality q; column i: the pitch class i semitones above the root
                self.chord_head = nn.Embedding(cfg.melody_chords[1], 12)
                nn.init.zeros_(self.chord_head.weight)
                # roots[r, i]: the pitch class i semitones above root r
                self.register_buffer("roots", (torch.arange(12)[:, None] + torch.arange(12)) % 12, persistent=False)
        self.key_head: nn.Embedding | None = None
        if cfg.key_head:  # row s: part s; column i: the profile's share of the pitch class i semitones above
            self.key_head = nn.Embedding(len(cfg.key_head), 12)
            nn.init.zeros_(self.key_head.weight)  # added to a trained model, it changes nothing at first
            self.register_buffer("key_programs", torch.tensor(cfg.key_head), persistent=False)
            self.register_buffer("key_roots", (torch.arange(12)[:, None] + torch.arange(12)) % 12, persistent=False)
            self.register_buffer("pitch_classes", torch.arange(128) % 12, persistent=False)
        self.key_chords: nn.Embedding | None = None
        if cfg.key_chords:  # row q: quality q; column i: the profile's share of the pitch class i semitones above the root
            self.key_chords = nn.Embedding(cfg.key_chords[1], 12)
            nn.init.zeros_(self.key_chords.weight)
        if cfg.interval_head or cfg.melody_head:  # the Pitch ids' pitches, which both heads score intervals of
            self.register_buffer("pitches", torch.arange(128), persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        # output head tied to the token embedding
        # (V,) bool, the vocabulary seen in training (set by load_model from the checkpoint; None:
        # unknown): the sampler keeps to it
        self.trained_tokens = None
        # the name it was released under (set by load_model; None: not a release): the sampling
        # defaults spemusic.generation.pieces and the commands give it (SamplingOptions.for_model)
        self.release_name = None
        self.sampling_defaults = None  # the sampling defaults its checkpoint records (None: none)
        # the harmonizer's file beside the weights (set by load_model; None: none): accompany charts a
        # melody's chords with it (spemusic.music.harmony.chart_melody)
        self.harmony_file = None
        # training only: recompute each block's activations in the backward pass instead of
        # keeping them (less memory for long sequences, about one more forward of compute)
        self.checkpoint_activations = False

    # ------------------------------------------------------------------ utilities
    @property
    def device(self) -> torch.device:
        return self.tok.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def redraw_features(self, generator: torch.Generator | None = None) -> None:
        """Draw new orthogonal FAVOR+ features for every layer (training)."""
        with torch.no_grad():
            for b in self.blocks:
                b.attn.redraw(generator)

    def resample(self, seed: int, redraw_features: bool = False) -> None:
        """Fix the SPE realization used by every later eval-mode call (forward,
        prime, step) to the one drawn from ``seed``. FAVOR+ features are kept
        (they belong to the checkpoint) unless ``redraw_features``."""
        if self.spe is not None:
            self.spe.resample(seed, self.device)
        if redraw_features:
            g = torch.Generator()
            g.manual_seed(mix_seed(int(seed), 0xFEA7))
            self.redraw_features(g)

    def _codes(self):
        """The SPE codes of this pass: fresh in training, the fixed ones in eval (None: no SPE)."""
        return self.spe.codes(self.training, self.device) if self.spe is not None else None

    def _contexts(self, codes, start: int, T: int) -> list:
        if codes is None:
            return [None] * self.cfg.n_layers
        return self.spe.contexts(codes, start, T, self.device)

    def _streams(self, codes, start: int) -> list:
        return self.spe.streams(codes, start, self.device) if codes is not None else []

    @property
    def clocks(self) -> list[nn.Embedding]:
        """The bar clock's tables it has, in recall.bar_clock's order."""
        return [t for t in (self.bar_clock, self.melody_clock, self.rest_clock) if t is not None]

    @property
    def recalls(self) -> bool:
        """Whether the model reads features off its own stream (spemusic.nn.recall), carried in State.recall."""
        return (self.pitch_memory is not None or self.bar_echo is not None or self.interval_head is not None
                or self.melody_head is not None or self.bar_clock is not None or self.key_head is not None)

    def embed(self, ids: torch.Tensor, start: int, carry: dict | None = None) -> tuple:
        """Token ids (B, T) at positions start.. -> ((B, T, d) with the absolute PE, if any, and
        the stream features; what those carry after these tokens, None for a model without them;
        what the output heads read, None without them: {"interval": (anchors, tables) each (B, T),
        "echo": (candidates, agreements) each (B, T, K), "key": (slots (B, T), profiles (B, T, 12))}).
        `carry`: what the features carried before these tokens (State.recall)."""
        x = self.tok(ids)
        if self.abs_pe is not None:
            x = x + self.abs_pe(start, ids.shape[1], ids.device).to(x.dtype)
        if not self.recalls:
            return self.drop(x), None, None
        carry, after, reads = carry or {}, {}, {}
        if self.interval_head is not None:
            *anchor, after["interval"] = interval_anchor(ids, carry.get("interval"), self.interval_programs,
                                                         self.cfg.pitch_range, self.cfg.bar_id)
            reads["interval"] = tuple(anchor)
        if self.bar_clock is not None:
            *rows, after["clock"] = clock_rows(ids, carry.get("clock"), *self.cfg.bar_clock)
            for table, r in zip(self.clocks, rows):
                x = x + table(r).to(x.dtype)
        if self.key_head is not None:
            *reads["key"], after["key"] = pitch_profile(ids, carry.get("key"), self.key_programs, self.cfg.pitch_range)
        if self.pitch_memory is not None:
            rows, after["pitch"] = memory_rows(ids, carry.get("pitch"), self.memory_programs, self.cfg.pitch_range)
            x = x + self.pitch_memory(rows).sum(-2).to(x.dtype)
        if self.bar_echo is not None:
            bar_id, lo, hi = self.cfg.bar_echo
            tail = carry.get("echo")
            seq = ids if tail is None else torch.cat([tail, ids], 1)
            places = echo_places(seq, bar_id, (lo, hi))  # (the echo's, and the melody head's keys)
            echo, head, after["echo"] = echo_features(ids, tail, bar_id, (lo, hi), self.cfg.vocab_size,
                                                      self.cfg.echo_bars, tuple(self.cfg.echo_head), self.cfg.echo_window,
                                                      tuple(tuple(m) for m in self.cfg.repeat_marks), places)
            x = x + self.bar_echo(echo).to(x.dtype)
            if head is not None:
                reads["echo"] = head
            if self.melody_head is not None:
                reads["melody"] = melody_reads(seq, places["key"], ids.shape[1], self.cfg.melody_head[0],
                                               self.melody_parts, self.cfg.pitch_range, (lo, hi), self.melody_durations)
        return self.drop(x), after, reads or None

    def head(self, x: torch.Tensor, reads: dict | None = None) -> torch.Tensor:
        """(…, d) -> (…, V) logits (final norm, output tied to the embedding), with the output
        heads' scores added where `reads` (from `embed`) says (add_intervals, recall.add_echo_scores)."""
        return self._add_heads(norm_linear(x, self.ln_f, self.tok.weight, None), reads)

    def _add_heads(self, logits: torch.Tensor, reads: dict | None) -> torch.Tensor:
        if reads and "interval" in reads:
            logits = self.add_intervals(logits, reads["interval"])
        if reads and "echo" in reads:
            logits = add_echo_scores(logits, self.echo_head.weight, *reads["echo"], self.echo_kind_offsets)
        if reads and "melody" in reads:
            logits = self.add_melody(logits, reads["melody"])
        if reads and "key" in reads:
            slot, profile = reads["key"]
            lo = self.cfg.pitch_range[0]
            scores = key_scores(slot, profile, self.key_head.weight, self.key_roots, self.pitch_classes)
            logits = torch.cat([logits[..., :lo], logits[..., lo:lo + 128] + scores.to(logits.dtype),
                                logits[..., lo + 128:]], -1)
            if self.key_chords is not None:
                first, Q = self.cfg.key_chords
                scores = chord_scores(profile, self.key_roots, self.key_chords.weight)  # (…, 12 * Q)
                logits = torch.cat([logits[..., :first], logits[..., first:first + 12 * Q] + scores.to(logits.dtype),
                                    logits[..., first + 12 * Q:]], -1)
        return logits

    def add_melody(self, logits: torch.Tensor, melody) -> torch.Tensor:
        """logits (…, V) + the melody head's scores (recall.melody_reads' `melody` = (anchor, table,
        profile)): each Pitch p of a part at p - the melody pitch sounding there (the melody's at p
        - its register), and each Chord by the melody's pitch classes relative to its root, in its
        quality's table."""
        anchor, table, profile = melody
        lo = self.cfg.pitch_range[0]
        logits = torch.cat([logits[..., :lo], logits[..., lo:lo + 128] + interval_scores(
            self.melody_head.weight, self.pitches, anchor, table, self.cfg.interval_reach).to(logits.dtype),
            logits[..., lo + 128:]], -1)
        if self.chord_head is None:
            return logits
        first, Q = self.cfg.melody_chords
        scores = chord_scores(profile, self.roots, self.chord_head.weight)  # (…, 12 * Q)
        return torch.cat([logits[..., :first], logits[..., first:first + 12 * Q] + scores.to(logits.dtype),
                          logits[..., first + 12 * Q:]], -1)

    def add_intervals(self, logits: torch.Tensor, anchor) -> torch.Tensor:
        """logits (…, V) + the interval head's score of each Pitch p: that of p - pitch in the
        table `anchor` = (pitch, table) (each (…)) names, where pitch >= 0."""
        pitch, table = anchor
        lo = self.cfg.pitch_range[0]
        scores = interval_scores(self.interval_head.weight, self.pitches, pitch, table, self.cfg.interval_reach)
        return torch.cat([logits[..., :lo], logits[..., lo:lo + 128] + scores.to(logits.dtype),
                          logits[..., lo + 128:]], -1)

    def _read_out(self, x: torch.Tensor, want_hidden: bool, reads=None):
        """The logits of `head`, or (logits, the final-normed state (…, d) fp32 they are read
        from: what a continuous cache matches, spemusic.generation.cache), the norm taken once."""
        if not want_hidden:
            return self.head(x, reads)
        h = self.ln_f(x)
        logits = F.linear(h, self.tok.weight)  # head(x) outside training, to the bit
        return self._add_heads(logits, reads), h.float()

    @torch.no_grad()
    def logits_and_hidden(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) token ids -> next-token logits (B, T, V) and final-normed states (B, T, d): what
        teacher-forced scoring with a continuous cache needs (spemusic.generation.cache.mixture_nll)."""
        return self._parallel(ids, want_state=False, want_hidden=True)

    def _check_ids(self, ids: torch.Tensor, ndim: int, check_range: bool = True):
        if not isinstance(ids, torch.Tensor) or ids.dim() != ndim:
            raise SpemusicError(f"expected token ids as a {ndim}-D LongTensor")
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise SpemusicError(f"expected integer token ids, not {ids.dtype}")
        if check_range and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size):
            raise SpemusicError(f"token ids must be in 0 … {self.cfg.vocab_size - 1} (this model's vocabulary), "
                                f"got {int(ids.min())} … {int(ids.max())}")

    @staticmethod
    def _check_weights_dtype(dtype) -> None:
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise SpemusicError(f"weights_dtype must be torch.float32, torch.float16 or torch.bfloat16, not {dtype!r}")

    # ------------------------------------------------------------------ parallel
    def _parallel(self, ids: torch.Tensor, want_state: bool, weights_dtype: torch.dtype = torch.float32,
                  state: State | None = None, want_hidden: bool = False):
        """The chunked parallel pass; with `state` (eval mode), it continues the positions that state
        holds, and the returned state holds them all. `want_hidden`: the final-normed states too
        (`hidden`), last in the returned tuple."""
        self._check_ids(ids, 2)
        B, T = ids.shape
        if T == 0:
            raise SpemusicError("cannot run the model on an empty sequence")
        start = state.position if state is not None else 0
        if self.abs_pe is not None:
            self.abs_pe.check(start, T)
        codes = self._codes()
        ctxs = self._contexts(codes, start, T)
        x, recall, reads = self.embed(ids, start, state.recall if state is not None else None)
        states, histories = [], []
        recompute = self.checkpoint_activations and self.training and torch.is_grad_enabled()
        for i, (blk, ctx) in enumerate(zip(self.blocks, ctxs)):
            if recompute:
                x, st, hist = torch.utils.checkpoint.checkpoint(blk, x, ctx, want_state, use_reentrant=False)
            elif state is not None:
                x, st, hist = blk(x, ctx, want_state, state.layers[i], state.histories[i] if state.histories else None)
            else:
                x, st, hist = blk(x, ctx, want_state)
            states.append(st)
            histories.append(hist)
        out = self._read_out(x, want_hidden, reads)
        logits, extra = (out[0], out[1:]) if want_hidden else (out, ())
        if not want_state:
            return out
        plan = state.plan if state is not None else build_plan(self, codes, weights_dtype)
        return (logits, State(position=start + T, batch_size=B, layers=states, pe=self._streams(codes, start + T),
                              plan=plan, histories=histories if self.cfg.short_conv else [], recall=recall), *extra)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) next-token logits (chunked parallel path)."""
        return self._parallel(ids, want_state=False)

    @torch.no_grad()
    def prime(self, ids: torch.Tensor, weights_dtype: torch.dtype = torch.float32, all_logits: bool = True,
              chunk: int = PRIME_CHUNK, want_hidden: bool = False):
        """Parallel passes over a prompt, `chunk` tokens at a time, each continuing the state of the
        last: (logits (B, T, V), or (B, 1, V) for the last position only when not `all_logits`;
        State after the prompt). Memory stays that of one chunk however long the prompt (in one
        pass, a prompt of 300k tokens needed 16 GB).
        ``weights_dtype``: the state's step keeps its linear weights in this dtype (float16 or
        bfloat16 halve the bytes read per token, see recurrent.py; float32 is exact).
        ``want_hidden``: also the final-normed states of every position (B, T, d), last."""
        self._check_weights_dtype(weights_dtype)
        self._check_ids(ids, 2)
        if ids.shape[1] == 0:
            raise SpemusicError("cannot run the model on an empty sequence")
        state, kept, hiddens = None, [], []
        for c0 in range(0, ids.shape[1], chunk):
            logits, state, *hidden = self._parallel(ids[:, c0:c0 + chunk], True, weights_dtype, state, want_hidden)
            kept = kept + [logits] if all_logits else [logits[:, -1:]]
            hiddens += hidden
        logits = torch.cat(kept, 1) if len(kept) > 1 else kept[0]
        return (logits, state, torch.cat(hiddens, 1)) if want_hidden else (logits, state)

    # ------------------------------------------------------------------ recurrent
    @torch.no_grad()
    def init_state(self, batch_size: int, weights_dtype: torch.dtype = torch.float32) -> State:
        """Empty state at position 0: generation from scratch is step() from here
        (``weights_dtype`` as in ``prime``)."""
        self._check_weights_dtype(weights_dtype)
        codes = self._codes()
        layers = [b.attn.empty_state(batch_size, self.device) for b in self.blocks]
        histories = [torch.zeros(batch_size, self.cfg.short_conv, self.cfg.d_model, device=self.device)
                     for _ in self.blocks] if self.cfg.short_conv else []
        return State(position=0, batch_size=batch_size, layers=layers, pe=self._streams(codes, 0),
                     plan=build_plan(self, codes, weights_dtype), histories=histories)

    @torch.no_grad()
    def step(self, state: State, next_ids: torch.Tensor, want_hidden: bool = False):
        """Feed one token per sequence at ``state.position``: (B,) -> (logits (B, V), state).
        The state is updated in place (and returned). ``want_hidden``: also the final-normed
        state (B, d), last."""
        # the range check reads the ids on the host: per token, only where they already are (CPU)
        self._check_ids(next_ids, 1, check_range=next_ids.device.type == "cpu")
        if next_ids.shape[0] != state.batch_size:
            raise SpemusicError(f"step: {next_ids.shape[0]} token ids for a state of batch {state.batch_size}")
        if self.abs_pe is not None:
            self.abs_pe.check(state.position, 1)
        t, plan = state.position, state.plan
        # the step's precision is the plan's, whatever autocast is active (the state stays fp32)
        with torch.autocast(device_type=self.device.type, enabled=False):
            if plan.code_buf is not None:  # the SPE codes at t, for every layer's filter
                for i, qk in enumerate(self.spe.codes_at(plan.codes, state.pe, t)):
                    plan.code_buf[i, :, :, 0].copy_(qk)
            x, state.recall, reads = self.embed(next_ids[:, None], t, state.recall)
            x = x[:, 0].float()
            for i, (blk, lp) in enumerate(zip(self.blocks, plan.layers)):
                past = state.histories[i] if lp.shift_t is not None else None
                x, state.layers[i], history = blk.step(x, lp, state.layers[i], past)
                if history is not None:
                    state.histories[i] = history
            out = self._read_out(x, want_hidden, {k: tuple(a[:, 0] for a in v) for k, v in (reads or {}).items()})
        state.position = t + 1
        return (out[0], state, out[1]) if want_hidden else (out, state)
