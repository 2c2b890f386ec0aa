"""Sampling on the recurrent path: O(1) time and memory per token, grammar-masked, batched.

One SPE draw and one set of FAVOR+ features per piece (`model.resample(seed)`), a prompt primed
in one parallel pass, then `model.step` token by token.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import MidiError, OptionError
from ..nn.device import cpu_has_fast_bf16
from ..nn.model import Performer
from ..nn.step_graph import StepGraph
from ..tokens.grammar import BAR, CHORD, NOTE_END, POSITION, PROGRAM, REPEAT, TIMESIG, GrammarState, REMIGrammar
from ..tokens.tokenizer import TEMPO, REMITokenizer
from .cache import ContinuousCache
from .settings import GenerationConfig, SamplingOptions, check_length_bars

NEG_INF = np.float32(-np.inf)


def log_sum_exp(x: np.ndarray) -> np.ndarray:
    """log Σ exp over the last axis, kept as a column (-inf where a row is all -inf). (scipy's
    logsumexp, not a dependency, costs ten times this a call on a row of logits.)"""
    top = x.max(-1, keepdims=True)
    top = np.where(top > NEG_INF, top, 0)
    total = np.exp(x - top).sum(-1, keepdims=True)
    return top + np.log(total, out=np.full_like(total, -np.inf), where=total > 0)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of logits with -inf for the tokens masked out."""
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def filter_logits(logits: np.ndarray, opts: SamplingOptions, at_bar: np.ndarray | None = None,
                  changes: np.ndarray | None = None) -> np.ndarray:
    """Temperature, then top-k, then nucleus (top-p) on B×V float32 logits (masked tokens are
    -inf). Top-p keeps the smallest set of most likely tokens whose mass reaches p; the most likely
    token is always kept, and ties at the cut are broken by index (deterministic). Rows where
    `at_bar` (B bools) is true, the step right after a Bar token, also keep the meter and tempo
    (`keep_the_meter` with `bar_top_p`; `changes`: the V bools of the tokens that change them).
    The sampler's steps are numpy on a few hundred floats: a torch op costs several times more
    in dispatch than the arithmetic (benchmarks/step_profile.py)."""
    if opts.temperature != 1.0:
        logits = logits / np.float32(opts.temperature)
    if 0 < opts.top_k < logits.shape[-1]:
        kth = -np.partition(-logits, opts.top_k - 1, axis=-1)[..., opts.top_k - 1: opts.top_k]
        logits = np.where(logits < kth, NEG_INF, logits)
    if opts.top_p < 1.0:
        logits = np.where(outside_nucleus(logits, opts.top_p), NEG_INF, logits)
    if at_bar is not None and changes is not None and opts.bar_top_p < 1.0 and at_bar.any():
        logits = np.where(at_bar[:, None], keep_the_meter(logits, opts.bar_top_p, changes), logits)
    return logits


def keep_the_meter(logits: np.ndarray, p: float, changes: np.ndarray) -> np.ndarray:
    """At a bar line, a nucleus over what the bar does to the meter and the tempo: carrying on (all
    the tokens in `changes`' complement, their mass together) against each change (a TimeSig or
    Tempo token). A change the model is unsure of goes; where the bar's first note falls, and so
    whether the melody plays in it, stays the model's choice (a nucleus over every token there
    cut the melody's later entries and with them a fifth of its bars: docs/sampling.md)."""
    carry_on = log_sum_exp(np.where(changes, NEG_INF, logits))
    drop = outside_nucleus(np.concatenate([carry_on, logits[:, changes]], axis=-1), p)
    out = logits.copy()
    out[:, changes] = np.where(drop[:, 1:], NEG_INF, logits[:, changes])
    return np.where(drop[:, :1] & ~changes, NEG_INF, out)


def meter_changes(tokenizer: REMITokenizer) -> np.ndarray:
    """The V bools of the tokens that change the meter or the tempo at a bar line."""
    out = np.zeros(len(tokenizer), dtype=bool)
    for kind in ("TimeSig", "Tempo"):
        out[slice(*tokenizer.range(kind))] = True
    return out


def outside_nucleus(logits: np.ndarray, p: float) -> np.ndarray:
    """True for the tokens outside the smallest set of most likely ones whose mass reaches p (the
    most likely token always in; ties at the cut broken by index, deterministically)."""
    order = np.argsort(-logits, axis=-1, kind="stable")
    probs = softmax(np.take_along_axis(logits, order, axis=-1))
    drop_sorted = np.cumsum(probs, axis=-1) - probs >= p
    drop_sorted[..., 0] = False
    out = np.empty_like(drop_sorted)
    np.put_along_axis(out, order, drop_sorted, axis=-1)
    return out


def draw(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row of B×V logits, by inverse CDF of their softmax with one uniform per row
    (a masked token, of probability 0, is never drawn)."""
    cdf = np.exp(logits - logits.max(-1, keepdims=True)).cumsum(-1)
    u = rng.random(len(logits)) * cdf[:, -1]
    # (cdf.argmax: the last token of any probability, should u round up to the total)
    return np.minimum((cdf <= u[:, None]).sum(-1), cdf.argmax(-1))


@dataclass
class SampleResult:
    ids: list[np.ndarray]        # one valid sequence per piece, BOS ... EOS
    new_tokens: int              # tokens sampled per piece
    wall_seconds: float          # sampling time (model loading and priming excluded)
    interrupted: bool = False


def finish_sequence(ids: list[int], tokenizer: REMITokenizer, grammar: REMIGrammar, keep: int = 0,
                    last_bar_complete: bool = False) -> np.ndarray:
    """End a sampled sequence on a complete bar with EOS. The bar in progress is dropped unless it
    is known to be complete (or dropping it would leave no new note); trailing empty bars are
    dropped (they would not survive a MIDI round trip). The first `keep` tokens (a prompt) stay."""
    ids = list(ids)
    if ids and ids[-1] == tokenizer.eos_id:
        return np.asarray(ids, dtype=np.int64)

    def complete_prefix(seq: list[int]) -> list[int]:
        # cut back to the last complete note (a cut may fall inside a note)
        st, end = GrammarState(), keep
        for i, t in enumerate(seq):
            grammar.advance(st, t)
            if st.last == NOTE_END and i >= keep:
                end = i + 1
        return seq[:end]

    if not last_bar_complete:
        bar_positions = [i for i, t in enumerate(ids) if t == tokenizer.bar_id and i >= keep]
        if bar_positions and len(complete_prefix(ids[: bar_positions[-1]])) > keep:
            ids = ids[: bar_positions[-1]]
    ids = complete_prefix(ids)
    return np.asarray(ids + [tokenizer.eos_id], dtype=np.int64)


def within_training(mask: np.ndarray, trained: np.ndarray | None) -> np.ndarray:
    """A grammar mask kept to the tokens the model saw in training (`Performer.trained_tokens`),
    unless none of those is allowed here (a prompt's instrument the model never saw)."""
    if trained is None:
        return mask
    kept = mask & trained
    return kept if kept.any() else mask


# the most bars in a row a piece may leave without a note: POP909's train songs rest at most 5 bars
# once begun, and open on at most 8 in 99% of songs; a continuation of a silent intro had gone on
# writing bars of chords alone, each bar's rest making the next one likelier, to its end
MAX_QUIET_BARS = 8


def next_token_mask(grammar: REMIGrammar, st: GrammarState, trained: np.ndarray | None, *, from_scratch: bool,
                    closing: bool = False) -> np.ndarray:
    """The tokens that may come next in a piece, by the rules `sample` and `stream_bars` share:
    the grammar, within the model's trained vocabulary; no EOS; and no bar without a note to open a
    piece from scratch (POP909's songs often open on rests, and the models learned it: a piece
    would open on empty bars; docs/measurements.md), nor an empty bar to end a --bars piece
    (`closing`: its last bar line comes only where the piece could end, after a note), nor one more
    after `MAX_QUIET_BARS` without a note."""
    opening = from_scratch and st.bars == 1 and st.notes == 0
    too_quiet = st.quiet_bars >= MAX_QUIET_BARS and st.notes == st.notes_at_bar
    mask = grammar.allowed(st, allow_eos=closing, allow_bar=not (opening or too_quiet))
    if closing:
        mask[grammar.tok.bar_id] &= mask[grammar.tok.eos_id]
        mask[grammar.tok.eos_id] = False
    if trained is not None and grammar.melody >= 0 and not trained[grammar.melody]:
        grammar.without_melody(st, mask)
    return within_training(mask, trained)


def opens_on_meter(st: GrammarState, from_scratch: bool) -> bool:
    """A piece from scratch opens on a full bar of the model's most likely meter (taken by argmax),
    not on a sampled pickup bar (many POP909 songs open on a pickup of 1 to 3 beats, and the piece
    would then rest on a meter change the model has to remember to write)."""
    return from_scratch and st.last == BAR and st.bars == 1


def banned_parts(tokenizer: REMITokenizer, parts: tuple[str, ...] | None) -> np.ndarray | None:
    """(V,) bool: the Program tokens of the parts not in `parts` (None: every part may play)."""
    if parts is None:
        return None
    from ..tokens.tokenizer import PARTS, parse_parts

    keep = parse_parts(",".join(parts))
    banned = np.zeros(len(tokenizer), dtype=bool)
    for part in PARTS:
        if part not in keep:
            banned[tokenizer.part_id(part)] = True
    return banned


def chord_ids(tokenizer: REMITokenizer, names: list[str | None]) -> list[int | None]:
    """Token ids of chord names (vocabulary names such as ``"A:min"``, or ``"N"``; None, a bar
    whose chord the model names, stays None)."""
    if not tokenizer.config.chords:
        raise OptionError("this model has no chord tokens, so {chords} cannot steer it (the default pop-piano has "
                          "them)")
    return [None if n is None else tokenizer.token_to_id[f"Chord_{n}"] for n in names]


def opening_tokens(tokenizer: REMITokenizer, meter: str | None = None,
                   tempo: float | None = None) -> tuple[int | None, int | None]:
    """Token ids of an opening time signature ("3/4") and tempo (BPM) asked for a piece from
    scratch; a value the vocabulary lacks is an error that says what exists."""
    meter_id = tempo_id = None
    if meter is not None:
        grammar = REMIGrammar(tokenizer)
        fits = [f"{n}/{d}" for n, d in tokenizer.time_signatures
                if grammar.timesig_ok[tokenizer.token_to_id[f"TimeSig_{n}/{d}"]]]
        name = meter.strip().replace(" ", "")
        if name not in fits:
            raise OptionError("{meter} {value}: not in this model's vocabulary; it has {fits}", value=meter,
                              fits=", ".join(fits))
        meter_id = tokenizer.token_to_id[f"TimeSig_{name}"]
    if tempo is not None:
        lo, hi = tokenizer.config.tempo_min, tokenizer.config.tempo_max
        if not (np.isfinite(tempo) and lo <= tempo <= hi):
            raise OptionError("{tempo} {value:g}: this model's tempo tokens run from {lo:g} to {hi:g} BPM ({n} steps)",
                              value=tempo, lo=lo, hi=hi, n=tokenizer.config.num_tempo_bins)
        tempo_id = tokenizer.range("Tempo")[0] + int(tokenizer.tempo_bin([tempo])[0])
    return meter_id, tempo_id


def chord_tones(tokenizer: REMITokenizer, names: list[str | None]) -> np.ndarray:
    """(len(names), V) float32: 1 on the Pitch tokens whose pitch class is a tone of each chord
    (none for N, or None: the model's own chord)."""
    from ..tokens.chords import QUALITIES, ROOTS

    lo, hi = tokenizer.range("Pitch")
    pitch_class = np.array([int(tokenizer.vocab[i].split("_")[1]) % 12 for i in range(lo, hi)])
    tones = np.zeros((len(names), len(tokenizer)), dtype=np.float32)
    for row, name in enumerate(names):
        if name not in ("N", None):
            root, quality = name.split(":")
            pcs = [(ROOTS.index(root) + iv) % 12 for iv in QUALITIES[quality]]
            tones[row, lo:hi] = np.isin(pitch_class, pcs)
    return tones


def force_chord(mask: np.ndarray, st: GrammarState, chord: int, grammar: REMIGrammar) -> None:
    """Restrict a grammar mask so that the bar opens on Position_0 + `chord` and changes chord
    nowhere else (a chord already in force is not repeated: the grammar forbids it). With
    melody_first, the Position_0 that opens the bar's other parts (after its melody)."""
    chords = slice(grammar.chord_lo, grammar.chord_hi)
    if grammar.melody_first:
        _force_chord_after_melody(mask, st, chord, grammar)
        return
    if st.last in (BAR, TIMESIG):  # the bar's first onset is Position_0, and no bar stays empty
        mask[grammar.pos_lo + 1: grammar.pos_hi] = False
        mask[grammar.tok.bar_id] = False
    elif st.last == POSITION and st.pos == 0 and chord != st.chord:
        mask[:] = False
        mask[chord] = True
        return
    mask[chords] = False


def _force_chord_after_melody(mask: np.ndarray, st: GrammarState, chord: int, grammar: REMIGrammar) -> None:
    chords = slice(grammar.chord_lo, grammar.chord_hi)
    tok = grammar.tok
    melody_sweep = st.in_melody
    if not melody_sweep and st.pos < 0 and st.last in (BAR, TIMESIG, TEMPO, NOTE_END, REPEAT):  # (the melody's bar is done)
        mask[tok.bar_id] = mask[tok.eos_id] = False
        mask[grammar.pos_lo + 1: grammar.pos_hi] = False
    elif melody_sweep and st.last in (BAR, TIMESIG, TEMPO, NOTE_END, REPEAT):
        mask[tok.bar_id] = mask[tok.eos_id] = False  # the bar's other parts, on its chord, are still to come
        if st.last == NOTE_END:  # the other parts' sweep opens on Position_0, not later
            mask[grammar.pos_lo + 1: grammar.pos_lo + st.pos + 1] = False
    elif st.last == POSITION and st.pos == 0 and not (grammar.repeats and melody_sweep):  # (marks: no chord there)
        if chord != st.chord or grammar.chord_every_bar:  # the chord, or (in the melody's sweep) a melody note first
            mask[:] = False
            mask[chord] = True
            mask[grammar.melody] = melody_sweep
            return
    elif st.last == POSITION and melody_sweep:  # an onset after 0 in the melody's sweep: the melody's
        mask[grammar.prog_lo:grammar.prog_hi] = False
        mask[grammar.melody] = True
    mask[chords] = False


def canonical(ids: np.ndarray, tokenizer: REMITokenizer) -> np.ndarray:
    """The notes of every onset in the tokenizer's order: exactly what the written MIDI file
    re-tokenizes to (decode, then encode)."""
    try:
        return tokenizer.encode(tokenizer.decode_to_score(ids, overlaps="layers")).astype(np.int64)
    except MidiError:  # no note at all: nothing to reorder
        return ids


def auto_step_dtype(device, batch: int) -> torch.dtype:
    """The step's weights: fp16 at batch 1 (half the bytes a token reads); above it on a CPU, bf16
    from batch 8 where the CPU has native bf16, else fp32, whose matrix products run twice as fast
    as half precision's on a CPU without it (AVX2: 1,026 against 497 tokens/s at batch 8). What each
    changes in the NLL against fp32 on the shipped models: benchmarks/step_precision.py; the
    tokens/s at batch 1 and 8: benchmarks/generation.py."""
    if torch.device(device).type == "cpu" and batch >= 2:
        if cpu_has_fast_bf16():
            return torch.bfloat16 if batch >= 8 else torch.float16
        return torch.float32
    return torch.float16


@dataclass
class _Steering:
    """What the user asked of the pieces beyond the grammar, as masks and logit offsets: a chord
    progression (one chord per bar, repeating, None where the model names the bar's own; its tones
    favoured by `chord_strength` nats), the opening meter and tempo, and the number of bars."""
    grammar: REMIGrammar
    trained: np.ndarray | None            # the model's trained vocabulary (next_token_mask)
    forced: list[int] | None = None       # Chord token of each bar of the progression
    tones: np.ndarray | None = None       # (len(progression), V) logit offsets of its chord tones
    meter_id: int | None = None
    tempo_id: int | None = None
    bars: int | None = None
    tempo_range: tuple[int, int] = (0, 0)  # the Tempo token ids

    @classmethod
    def of(cls, tokenizer, grammar, trained, chords, chord_strength, meter, tempo, bars) -> _Steering:
        meter_id, tempo_id = opening_tokens(tokenizer, meter, tempo)
        tones = chord_tones(tokenizer, chords) * np.float32(chord_strength) if chords and chord_strength else None
        return cls(grammar, trained, chord_ids(tokenizer, chords) if chords else None, tones, meter_id, tempo_id, bars,
                   tokenizer.range("Tempo"))

    def mask(self, st: GrammarState, bars_started: int, from_scratch: bool) -> np.ndarray:
        """The tokens allowed next in a piece in grammar state `st`, `bars_started` bars in."""
        mask = next_token_mask(self.grammar, st, self.trained, from_scratch=from_scratch,
                               closing=self.bars is not None and bars_started >= self.bars)
        chord = None if self.forced is None else self.forced[(bars_started - 1) % len(self.forced)]
        if chord is not None:  # (None: a bar whose chord the model names)
            force_chord(mask, st, chord, self.grammar)
        if self.meter_id is not None and st.last == BAR:  # the asked meter, held for the whole piece
            if st.bars == 1:
                mask[:] = False
                mask[self.meter_id] = True
            else:
                mask[self.grammar.ts_lo:self.grammar.ts_hi] = False
        tempo_lo, tempo_hi = self.tempo_range
        if self.tempo_id is not None and st.tempo < 0 and mask[tempo_lo:tempo_hi].any():
            mask[tempo_lo:tempo_hi] = False  # the piece's first tempo
            mask[self.tempo_id] = True
        self.grammar.follow_copy(st, mask)  # a copy mark: the sweep it names, written again
        return mask

    def favour_chord_tones(self, logits: np.ndarray, st: GrammarState, bars_started: int) -> None:
        """Where a pitch comes next, add the bar's chord tones' offsets to `logits` (in place)."""
        if self.tones is not None and st.last == PROGRAM:
            logits += self.tones[(bars_started - 1) % len(self.forced)]


def trim_far_onsets(logits: np.ndarray, states: list[GrammarState], p: float, onsets: np.ndarray) -> np.ndarray:
    """Right after a note, the nucleus `p` among the tokens that place the next onset (`onsets`:
    the Position tokens and the bar line), their total probability kept: whether another note
    comes at this onset stays the model's choice; only the far onsets of the tail, each unlikely
    but many together, are cut (they left holes of a beat or more: benchmarks/silence_sources.py)."""
    if p >= 1.0:
        return logits
    rows, sub = _onset_rows(logits, [b for b, st in enumerate(states) if st.last == NOTE_END], onsets)
    if not len(rows):
        return logits
    drop = outside_nucleus(sub, p)
    kept_mass = np.where(drop, 0, softmax(sub)).sum(-1, keepdims=True)
    out = logits.copy()
    out[rows[:, None], onsets] = np.where(drop, NEG_INF, sub - np.log(kept_mass))
    return out


def _onset_rows(logits: np.ndarray, rows: list[int], onsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows (of those given) where some onset is allowed, and their onset logits: a row whose
    onsets are all masked has nothing for the onset corrections to move."""
    rows = np.array(rows, dtype=np.intp)
    sub = logits[rows][:, onsets]
    some = np.isfinite(sub).any(-1)
    return rows[some], sub[some]


# the silence an onset may leave unpenalised, in beats: real songs rest that briefly between notes
# for about half their silent time (docs/measurements.md)
HOLE_TOLERANCE = 0.25


def discourage_holes(logits: np.ndarray, states: list[GrammarState], penalty: float, onsets: np.ndarray,
                     beat: int) -> np.ndarray:
    """Where the next onset is chosen (after a note, a chord change or a bar line), take `penalty`
    nats off each onset token (`onsets`: the Positions, then the bar line) per beat of silence it
    would leave beyond `HOLE_TOLERANCE`, silence counted from where the last note to end ends
    (`GrammarState.sounding`). The onsets' total probability is kept: whether another note comes
    at this onset stays the model's choice; only where the next one falls is moved closer.

    Melody first, a bar's first onset is chosen before the model says whether the melody or
    another part plays there: the melody may enter late (the other parts fill the bar after it),
    so no penalty applies there, and a bar without melody may open on a late accompaniment onset."""
    if penalty <= 0:
        return logits
    rows, sub = _onset_rows(logits, [b for b, st in enumerate(states)  # (melody_first: in the bar's other
                                     if st.sounding is not None and not st.in_melody  # parts alone, after its melody)
                                     and st.last in (NOTE_END, CHORD, BAR, TIMESIG)], onsets)
    if not len(rows):
        return logits
    at = np.tile(np.arange(len(onsets), dtype=np.float32), (len(rows), 1))
    at[:, -1] = [states[b].bar_len for b in rows]  # the bar line: at the bar's end at best
    sounding = np.array([[states[b].sounding] for b in rows], dtype=np.float32)
    nats_off = np.float32(penalty) * np.maximum((at - sounding) / beat - HOLE_TOLERANCE, 0)
    # the onsets' total kept: each gets back log 1 / Σ p(onset) e^(-nats off) of the onsets' own odds
    kept = (softmax(sub) * np.exp(-nats_off)).sum(-1, keepdims=True)
    out = logits.copy()
    out[rows[:, None], onsets] = sub - nats_off - np.log(kept)
    return out


def temper_stacking(logits: np.ndarray, states: list[GrammarState], scale: float, programs: slice) -> np.ndarray:
    """After the second note of an onset and every later one, multiply the odds of one more note
    there (its Program tokens against the rest: the next onset, the bar line) by `scale`.
    Teacher-forced on real songs the model keeps count, but in its own pieces from scratch the
    texture drifts toward stacked onsets (benchmarks/silence_sources.py, music_metrics.py;
    docs/sampling.md)."""
    rows = [b for b, st in enumerate(states) if st.last == NOTE_END and st.notes_here >= 2]
    if scale == 1.0 or not rows:
        return logits
    out = logits.copy()
    out[rows, programs] += np.float32(math.log(scale))
    return out


def follow_like_bars(logits: np.ndarray, states: list[GrammarState], grammar: REMIGrammar, nats: float) -> np.ndarray:
    """Where a piece writes a sweep its Repeat mark says is like an earlier bar's (a lag, not a
    copy), add `nats` to the token that bar wrote at this place (REMIGrammar.like_bar): the
    model chose the repeat, and its notes, each drawn at its own odds, had kept a fifth of such
    sweeps alike (docs/design.md, "Like bars"). Its velocities, and anything that bar did not
    have, stay the model's."""
    if nats <= 0 or not grammar.repeats:
        return logits
    out = None
    for b, st in enumerate(states):
        want = grammar.like_bar(st)
        if want is not None:
            out = logits.copy() if out is None else out
            out[b, want] += np.float32(nats)  # (a token masked out stays at -inf)
    return logits if out is None else out


@dataclass
class OnsetTokens:
    """The token ids the onset corrections act on: `onsets`, every Position then the bar line (the
    places the next onset may take after a note), and `programs` (the start of one more note)."""
    onsets: np.ndarray
    programs: slice
    beat: int  # grid steps per beat

    @classmethod
    def of(cls, tokenizer: REMITokenizer) -> OnsetTokens:
        lo, hi = tokenizer.range("Position")
        return cls(np.array([*range(lo, hi), tokenizer.bar_id]), slice(*tokenizer.range("Program")),
                   tokenizer.config.beat_resolution)


def steer_onsets(logits: np.ndarray, states: list[GrammarState], options: SamplingOptions,
                 tokens: OnsetTokens) -> np.ndarray:
    """The sampler's corrections where a piece decides between one more note at this onset and
    where the next one falls (each a no-op at its neutral value): `hole_penalty`, `stacking`,
    `onset_top_p`. `states`: each piece's grammar state (a finished piece: a fresh one)."""
    logits = discourage_holes(logits, states, options.hole_penalty, tokens.onsets, tokens.beat)
    logits = temper_stacking(logits, states, options.stacking, tokens.programs)
    return trim_far_onsets(logits, states, options.onset_top_p, tokens.onsets)


class _Decoder:
    """The recurrent state of a batch of pieces after a prompt, with the continuous cache of
    `options.repeat` when it is on (the prompt's hidden states first): `next_log_probs` is what
    the sampler draws from, `feed` advances every piece by one token. `tags` (B,), with
    `by_chord`: the chord in force in each piece, the same for the draw and the feed of a step."""

    def __init__(self, model: Performer, tokenizer: REMITokenizer, prompt: torch.Tensor, options: SamplingOptions,
                 weights_dtype: torch.dtype, by_chord: bool = False):
        self.model, self.memory, self.hidden = model, None, None
        logits, self.state, *hidden = model.prime(prompt, weights_dtype=weights_dtype, all_logits=False,
                                                  want_hidden=options.repeat > 0)
        self.logits = logits[:, -1]
        # the compiled step where this machine and model allow it (same function, a few times faster)
        self.step = StepGraph.of(model, self.state) or model.step
        if options.repeat > 0:
            self.memory = ContinuousCache(options.cache(), tokenizer, prompt.shape[0], model.cfg.d_model,
                                          prompt.device)
            tags = chords_in_force(prompt, tokenizer)[:, :-1] if by_chord else None
            self.memory.add(hidden[0][:, :-1], prompt[:, 1:], tags)
            self.hidden = hidden[0][:, -1]

    def next_log_probs(self, tags: torch.Tensor | None = None) -> np.ndarray:
        """(B, V) float32, the sampler's own copy: the model's logits, or the log-probabilities of
        its mixture with the cache."""
        out = self.logits if self.memory is None else self.memory.mix(self.logits, self.hidden, tags)
        return out.float().cpu().numpy().copy()

    def feed(self, ids: torch.Tensor, tags: torch.Tensor | None = None) -> None:
        if self.memory is None:
            self.logits, self.state = self.step(self.state, ids)
            return
        self.memory.add(self.hidden[:, None], ids[:, None], None if tags is None else tags[:, None])
        self.logits, self.state, self.hidden = self.step(self.state, ids, want_hidden=True)


def chords_in_force(ids: torch.Tensor, tokenizer: REMITokenizer) -> torch.Tensor:
    """(B, T) ids -> (B, T): at each position, the last Chord token at or before it (-1: none)."""
    lo, hi = tokenizer.range("Chord")
    index = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    last = torch.where((ids >= lo) & (ids < hi), index, torch.full_like(ids, -1)).cummax(1).values
    return torch.where(last >= 0, ids.gather(1, last.clamp_min(0)), torch.full_like(ids, -1))


def _check_absolute_pe_reach(model: Performer, prompt_len: int, length: int | None) -> None:
    """A model with an absolute positional encoding cannot go past the length it has positions for."""
    total = prompt_len + (length if length is not None else 10**9)
    if model.cfg.length_limited and length is not None and total > model.cfg.max_len:
        need = ("the prompt's {prompt} tokens and {length} {n} need {total}" if prompt_len > 1
                else "{length} {n} needs {total} with the start token")
        raise OptionError("this model uses an absolute positional encoding limited to {limit} tokens; " + need,
                          limit=model.cfg.max_len, prompt=prompt_len, n=length, total=total)


class _Pieces:
    """The pieces `sample` writes at once: each one's tokens, grammar state, bars begun and
    whether it is done (a done piece is fed PAD while the others go on)."""

    def __init__(self, num: int, prompt: np.ndarray, grammar: REMIGrammar, steer: _Steering, bars: int | None,
                 max_new: int, held=None):
        self.grammar, self.steer, self.bars, self.max_new = grammar, steer, bars, max_new
        self.held = held  # a melody held fixed (accompany.hold_melody)
        self.keep = len(prompt)
        self.from_scratch = len(prompt) == 1 and held is None
        self.forced: list[int | None] = [None] * num  # with a held melody: the one token a piece must take next
        self.states = [GrammarState() for _ in range(num)]
        for st in self.states:
            for t in prompt:
                grammar.advance(st, int(t))
        self.seqs = [list(map(int, prompt)) for _ in range(num)]
        self.bars_started = [0] * num
        self.done = [False] * num
        self.force_bar = len(prompt) > 1  # continuing a prompt starts a new bar: the prompt stays as written

    def going(self) -> list[int]:
        return [b for b, d in enumerate(self.done) if not d]

    def masks(self) -> np.ndarray:
        """The tokens each piece may take next: PAD once done; a Bar first after a prompt."""
        masks = np.zeros((len(self.done), len(self.grammar.tok)), dtype=bool)
        for b, st in enumerate(self.states):
            if self.done[b]:
                masks[b, self.grammar.tok.pad_id] = True
            elif self.force_bar:
                masks[b, self.grammar.tok.bar_id] = True
            else:
                masks[b] = self.steer.mask(st, self.bars_started[b], self.from_scratch)
                if self.held is not None:
                    self.forced[b] = self.held.restrict(b, st, masks[b])
        self.force_bar = False
        return masks

    def steered_states(self) -> list[GrammarState]:
        """The states the onset corrections read (a done piece's: a fresh one, which none steers)."""
        return [GrammarState() if d else st for st, d in zip(self.states, self.done)]

    def take(self, nxt: list[int]) -> None:
        """Append each going piece's sampled token; a piece is done at its `bars`-th bar's end
        (the Bar that would open one more is not kept) or after `max_new` tokens."""
        for b in self.going():
            t = nxt[b]
            if t == self.grammar.tok.bar_id:
                if self.bars is not None and self.bars_started[b] >= self.bars:
                    self.done[b] = True
                    continue
                self.bars_started[b] += 1
            self.seqs[b].append(t)
            self.grammar.advance(self.states[b], t)
            if self.held is not None:
                self.held.advance(b, self.states[b], t)
            if len(self.seqs[b]) - self.keep >= self.max_new:
                self.done[b] = True


@torch.inference_mode()
def sample(model: Performer, tokenizer: REMITokenizer, config: GenerationConfig | None = None, *,
           prompt: np.ndarray | None = None, held=None, on_token=None, should_stop=None, **settings) -> SampleResult:
    """Sample `num` pieces of `length` new tokens (or `bars` new bars) after an optional prompt.

    `prompt` is a token sequence without EOS (it will be continued with a new bar). `on_token(n, bars)`
    is called after every sampling step; `should_stop()` returning True (or Ctrl-C) stops early and
    returns the valid part generated so far. The settings are `config`'s (GenerationConfig), with
    `settings` (its fields by name) in place of its values; `options` None: SamplingOptions().
    `weights_dtype`: the recurrent step's linear weights;
    None picks `auto_step_dtype`. `chords`: a progression of chord names (``"A:min"``, see
    spemusic.tokens.chords), one per new bar, repeating: every bar opens on ``Position_0 Chord_X`` and
    holds no other chord change (the model writes the notes); `chord_strength` adds that many nats
    to the logits of the bar's chord tones wherever a pitch is sampled. `meter` ("3/4") and `tempo` (BPM):
    the time signature of a piece from scratch (held for the whole piece) and its opening tempo
    (the model may change it later);
    without them, the piece opens on the model's most likely meter. With `options.repeat`, a
    continuous cache of the piece's own hidden states (the prompt's first) is mixed into the
    model's distribution (spemusic.generation.cache). `parts` (models with parts): the parts the pieces may
    play ("melody", "bridge", "piano"), the others never written. `held` (accompany.hold_melody): a
    melody the pieces keep as written, token by token, while the model writes the other parts."""
    config = GenerationConfig.of(config, **settings)
    config.check()
    check_length_bars(config.length, config.bars)
    num, length, bars, seed, weights_dtype = config.num, config.length, config.bars, config.seed, config.weights_dtype
    chords = list(config.chords) if config.chords is not None else None
    options = config.options or SamplingOptions()
    # the notes of an onset in the tokenizer's order (low to high) for models that can see the
    # note before (a short convolution); models without one do not know it, and the strict mask
    # would push them up the keyboard, so they get any order, put right by `canonical` after
    # (what the strict order does to the texture: docs/measurements.md).
    grammar = REMIGrammar(tokenizer, strict_order=model.cfg.short_conv > 0)
    model.eval()
    model.resample(seed)
    device = next(model.parameters()).device
    trained = model.trained_tokens
    banned = banned_parts(tokenizer, config.parts)
    if banned is not None:  # the parts not asked for leave the vocabulary the pieces keep to
        trained = ~banned if trained is None else trained & ~banned
    steer = _Steering.of(tokenizer, grammar, trained, chords, config.chord_strength, config.meter, config.tempo, bars)
    onset_ids = OnsetTokens.of(tokenizer)
    changes = meter_changes(tokenizer)
    rng = np.random.default_rng(seed)

    if prompt is None:
        prompt = np.array([tokenizer.bos_id], dtype=np.int64)
    prompt = np.asarray(prompt, dtype=np.int64)
    _check_absolute_pe_reach(model, len(prompt), length)
    # (with --bars, a piece that never closes its bars is stopped all the same)
    pieces = _Pieces(num, prompt, grammar, steer, bars, max_new=length if length is not None else bars * 4096,
                     held=held)
    batch_prompt = torch.from_numpy(np.tile(prompt, (num, 1))).to(device)
    # with --chords, a bar copies only from moments under its own chord: the harmony is the user's
    by_chord = chords is not None and options.repeat > 0
    decoder = _Decoder(model, tokenizer, batch_prompt, options, weights_dtype or auto_step_dtype(device, num), by_chord)

    interrupted = False
    n = 0
    t0 = time.perf_counter()
    try:
        while True:
            masks = pieces.masks()
            tags = torch.tensor([st.chord for st in pieces.states], device=device) if by_chord else None
            logits = decoder.next_log_probs(tags)
            for b in pieces.going():
                steer.favour_chord_tones(logits[b], pieces.states[b], pieces.bars_started[b])
            masked = np.where(masks, logits, NEG_INF)
            at_bar = np.array([not pieces.done[b] and st.last == BAR for b, st in enumerate(pieces.states)])
            steered = pieces.steered_states()
            masked = steer_onsets(follow_like_bars(masked, steered, grammar, options.follow_repeats), steered, options,
                                  onset_ids)
            nxt = draw(filter_logits(masked, options, at_bar, changes), rng).tolist()
            for b in pieces.going():
                if opens_on_meter(pieces.states[b], pieces.from_scratch):
                    nxt[b] = int(masked[b].argmax())
                if pieces.forced[b] is not None:  # whatever the onset corrections made of its odds
                    nxt[b] = pieces.forced[b]
            n += 1
            pieces.take(nxt)
            if on_token is not None:
                on_token(n, max(pieces.bars_started))
            if all(pieces.done):
                break
            if should_stop is not None and should_stop():
                interrupted = True
                break
            decoder.feed(torch.from_numpy(np.array(nxt, dtype=np.int64)).to(device), tags)
    except KeyboardInterrupt:
        interrupted = True
    wall = time.perf_counter() - t0
    complete = bars is not None and not interrupted
    out = [canonical(finish_sequence(s, tokenizer, grammar, keep=len(prompt), last_bar_complete=complete and d),
                     tokenizer) for s, d in zip(pieces.seqs, pieces.done)]
    return SampleResult(out, n, wall, interrupted)


@torch.inference_mode()
def stream_bars(model: Performer, tokenizer: REMITokenizer, *, prompt: np.ndarray | None = None,
                options: SamplingOptions | None = None, seed: int = 0, weights_dtype: torch.dtype | None = None,
                should_stop=None, on_token=None):
    """Sample one piece bar after bar, without end: yields each complete bar's tokens (from its
    Bar token on) as soon as the next Bar is sampled. Memory stays flat: only the recurrent state
    and the bar in progress are kept. `should_stop()` is asked after every token; when it answers
    True the bar in progress is dropped and the stream ends. `on_token()` is called after every
    token (the player sends its due events there). The rules of `sample` hold: strict note order
    with a short convolution, and from scratch the opening meter is the most likely one and the
    first bar holds a note."""
    options = options or SamplingOptions()
    options.check()
    grammar = REMIGrammar(tokenizer, strict_order=model.cfg.short_conv > 0)
    trained = model.trained_tokens
    model.eval()
    model.resample(seed)
    device = next(model.parameters()).device
    rng = np.random.default_rng(seed)
    prompt = np.asarray([tokenizer.bos_id] if prompt is None else prompt, dtype=np.int64)
    st = GrammarState()
    for t in prompt:
        grammar.advance(st, int(t))
    from_scratch = len(prompt) == 1
    onset_ids = OnsetTokens.of(tokenizer)
    changes = meter_changes(tokenizer)
    decoder = _Decoder(model, tokenizer, torch.from_numpy(prompt[None]).to(device), options,
                       weights_dtype or auto_step_dtype(device, 1))
    bar: list[int] = []
    while True:
        if not from_scratch and not bar:  # continuing a prompt starts a new bar
            mask = np.zeros(len(tokenizer), dtype=bool)
            mask[tokenizer.bar_id] = True
        else:
            mask = next_token_mask(grammar, st, trained, from_scratch=from_scratch)
            grammar.follow_copy(st, mask)
        masked = np.where(mask, decoder.next_log_probs(), NEG_INF)
        if opens_on_meter(st, from_scratch):
            nxt = int(masked[0].argmax())
        else:
            masked = follow_like_bars(masked, [st], grammar, options.follow_repeats)
            masked = steer_onsets(masked, [st], options, onset_ids)
            nxt = int(draw(filter_logits(masked, options, np.array([st.last == BAR]), changes), rng)[0])
        if nxt == tokenizer.bar_id and bar:
            yield bar
            bar = []
        bar.append(nxt)
        grammar.advance(st, nxt)
        if on_token is not None:
            on_token()
        if should_stop is not None and should_stop():
            return
        decoder.feed(torch.tensor([nxt], device=device))
