"""A continuous cache (Grave, Joulin & Usunier, "Improving Neural Language Models with a
Continuous Cache", ICLR 2017): the copy memory a linear-attention model lacks.

Pop repeats itself, and a model that has heard a bar should expect it again. pop-piano does not
(`benchmarks/copying.py`: its 48 heads attend near uniformly, and a bar played eight times is no
more likely the eighth time). The cache copies outside the network: it keeps the last `window`
final-normed hidden states h_i with the token that followed each, and at step t mixes

    p(x) = (1 - λ_t) p_model(x) + λ_t Σ_i softmax_i(θ cos(h_t, h_i)) [x_{i+1} = x]

where λ_t = weight · sigmoid(slope · (max_i cos(h_t, h_i) - at)): the cache speaks when the
model is somewhere it has been before. Memory and time per token are fixed by the window (a
(window, d) ring buffer per piece), so generation stays O(1) per token. It has no weights: θ, the
weight and the gate were chosen by NLL on POP909 train songs (`spemusic eval --repeat W` gives
the NLL with it on any data).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ConfigError


@dataclass(frozen=True)
class CacheOptions:
    window: int = 2048      # hidden states searched (tokens)
    gap: int = 64           # the newest states are not searched: the cache copies from bars before,
                            # the model writes what comes next locally (without a gap, a copied note
                            # matches the state it was copied from and the sampler stacks it again)
    theta: float = 64.0     # sharpness of the match (cosine similarities times θ, softmaxed)
    weight: float = 0.5     # the cache's largest share of the mixture
    slope: float = 20.0     # gate: λ = weight · sigmoid(slope · (best cosine - at))
    at: float = 0.8
    # the token kinds the cache mixes within: the model keeps p(kind), the cache moves p(x | kind)
    kinds: tuple[str, ...] = ("Pitch", "Position", "Duration", "Velocity")

    def __post_init__(self):
        if self.window < 1 or self.gap < 0 or not (0.0 <= self.weight <= 1.0) or self.theta <= 0:
            raise ConfigError(f"cache options out of range: {self}")

    def groups(self, tokenizer) -> torch.Tensor:
        """(kinds, V) float: 1 where token x is of the kind."""
        g = torch.zeros(len(self.kinds), len(tokenizer))
        for i, kind in enumerate(self.kinds):
            lo, hi = tokenizer.range(kind)
            g[i, lo:hi] = 1.0
        return g


def _mix_within_kinds(log_p_model: torch.Tensor, p_cache: torch.Tensor, lam: torch.Tensor,
                      groups: torch.Tensor) -> torch.Tensor:
    """log p (…, V) where, within each kind g the cache has seen, p(x) = p_model(g) · ((1 - λ) p_model(x | g)
    + λ p_cache(x | g)); elsewhere the model's. The model decides what kind comes next (a note, a new
    onset, a bar line), the cache only which one: copied kinds cannot stack notes or skip bars.
    In log space: a token the model finds all but impossible keeps a finite log-probability."""
    mass_model = log_p_model.exp() @ groups.T  # (…, G)
    mass_cache = p_cache @ groups.T
    seen = mass_cache > 1e-6
    scale = torch.where(seen, mass_model / mass_cache.clamp_min(1e-12), torch.zeros_like(mass_model))
    lam_x = (lam[..., None] * seen) @ groups  # λ on the tokens of every seen kind, 0 elsewhere
    return torch.logaddexp(torch.log1p(-lam_x) + log_p_model, torch.log(lam_x * p_cache * (scale @ groups)))


def _mix_matches(log_p_model: torch.Tensor, cos: torch.Tensor, tokens: torch.Tensor, options: CacheOptions,
                 groups: torch.Tensor) -> torch.Tensor:
    """The mixture's log p (rows, V) from each row's cosine similarities to the entries it may
    search (rows, n; -inf: not searched) and the tokens that followed those entries (rows, n):
    the step of generation and the chunks of teacher-forced scoring alike. A row that searches
    nothing gets λ = 0: the model's own distribution."""
    weights = torch.softmax(options.theta * cos, dim=-1).nan_to_num(0.0)
    p_cache = torch.zeros_like(log_p_model).scatter_add_(1, tokens, weights)
    lam = options.weight * torch.sigmoid(options.slope * (cos.max(-1).values - options.at))
    return _mix_within_kinds(log_p_model, p_cache, lam, groups)


class ContinuousCache:
    """Per piece of a batch, a ring buffer of the last `window` + `gap` (hidden state, next token)
    pairs; entry i lives in slot i mod (window + gap)."""

    def __init__(self, options: CacheOptions, tokenizer, batch: int, dim: int, device):
        self.options = options
        self.groups = options.groups(tokenizer).to(device)
        self.size = options.window + options.gap
        self.keys = torch.zeros(batch, self.size, dim, device=device)
        self.tokens = torch.zeros(batch, self.size, dtype=torch.long, device=device)
        self.tags = torch.full((batch, self.size), -1, dtype=torch.long, device=device)
        self.slots = torch.arange(self.size, device=device)
        self.filled = 0  # entries written (all pieces advance together)

    def add(self, hidden: torch.Tensor, next_ids: torch.Tensor, tags: torch.Tensor | None = None) -> None:
        """Append (B, T, d) hidden states and the (B, T) tokens that followed each; `tags` (B, T):
        a label per entry that `mix` can require (the chord in force, with --chords)."""
        T = hidden.shape[1]
        keep = slice(max(0, T - self.size), T)
        slots = (self.filled + torch.arange(T, device=hidden.device)[keep]) % self.size
        self.keys[:, slots] = F.normalize(hidden[:, keep].float(), dim=-1)
        self.tokens[:, slots] = next_ids[:, keep]
        self.tags[:, slots] = -1 if tags is None else tags[:, keep]
        self.filled += T

    def mix(self, logits: torch.Tensor, hidden: torch.Tensor, tag: torch.Tensor | None = None) -> torch.Tensor:
        """(B, V) logits and the (B, d) hidden state they were read from -> (B, V) log-probabilities
        of the mixture (the model's own where the cache has nothing old enough). `tag` (B,): only
        entries of that tag are searched."""
        log_p = torch.log_softmax(logits.float(), dim=-1)
        age = (self.filled - 1 - self.slots) % self.size  # steps since each slot's entry was written
        searched = ((age >= self.options.gap) & (age < self.filled))[None]
        if tag is not None:
            searched = searched & (self.tags == tag[:, None])
        if not bool(searched.any()):
            return log_p
        cos = torch.einsum("bwd,bd->bw", self.keys, F.normalize(hidden.float(), dim=-1))
        return _mix_matches(log_p, cos.masked_fill(~searched, float("-inf")), self.tokens, self.options, self.groups)


def mixture_nll(logits: torch.Tensor, hidden: torch.Tensor, targets: torch.Tensor, options: CacheOptions,
                groups: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """Teacher-forced NLL per position (T,) of the model-and-cache mixture for one sequence:
    `logits` (T, V) and `hidden` (T, d) at positions 0..T-1, `targets` (T,) the tokens that follow
    them, `groups` from `options.groups`. Position t's cache holds the entries of positions before it, as in
    generation (those `gap` to `gap + window` - 1 steps old)."""
    T = targets.shape[0]
    keys = F.normalize(hidden.float(), dim=-1)
    out = torch.empty(T, device=logits.device)
    W, gap = options.window, options.gap
    for q0 in range(0, T, chunk):
        q1 = min(q0 + chunk, T)
        k0 = max(0, q0 - W - gap)
        qi = torch.arange(q0, q1, device=keys.device)[:, None]
        ki = torch.arange(k0, q1, device=keys.device)[None, :]
        seen = (ki < qi - gap) & (ki >= qi - gap - W)
        cos = (keys[q0:q1] @ keys[k0:q1].T).masked_fill(~seen, float("-inf"))
        log_p = _mix_matches(torch.log_softmax(logits[q0:q1].float(), -1), cos,
                             targets[k0:q1][None, :].expand(q1 - q0, -1), options, groups)
        out[q0:q1] = -log_p.gather(1, targets[q0:q1, None])[:, 0]
    return out
