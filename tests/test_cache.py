"""The continuous cache (spemusic.generation.cache): generation and scoring compute the same mixture, it
copies what repeats, and it leaves the sampler's grammar and determinism intact."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from spemusic.generation.cache import CacheOptions, ContinuousCache, mixture_nll
from spemusic.generation.sampling import SamplingOptions, sample
from spemusic.nn.checkpoint import load_model
from spemusic.tokens.grammar import REMIGrammar


def _real_song(shared_data, tok, n: int) -> torch.Tensor:
    """The first n tokens of a POP909 song, barred by its beat annotation."""
    midi = sorted((shared_data / "pop909").glob("*.mid"))[0]
    ids = tok.encode(midi, beats=shared_data / "pop909" / "beats" / f"{midi.stem}.txt")
    return torch.from_numpy(np.asarray(ids[:n], dtype=np.int64))


@pytest.mark.parametrize("window,gap", [(40, 8), (2048, 64), (30, 0)])
def test_step_by_step_mixture_equals_the_scored_one(tiny_checkpoint, shared_data, window, gap):
    """The cache as the sampler runs it (a ring buffer, one step at a time, wrapping when the
    window is small) gives each real token the probability `mixture_nll` gives it in one pass."""
    model, tok = load_model(tiny_checkpoint)
    model.eval()
    model.resample(0)
    x = _real_song(shared_data, tok, 300)
    opts = CacheOptions(window=window, gap=gap, weight=0.7, at=0.5)
    groups = opts.groups(tok)
    with torch.no_grad():
        logits, hidden = model.logits_and_hidden(x[None, :-1])
        scored = mixture_nll(logits[0], hidden[0], x[1:], opts, groups, chunk=64)
        memory = ContinuousCache(opts, tok, 1, model.cfg.d_model, "cpu")
        step_logits, state, h = model.prime(x[None, :1], want_hidden=True)
        h = h[:, -1]
        stepped = []
        for t in range(1, len(x)):
            log_p = memory.mix(step_logits[:, -1] if step_logits.dim() == 3 else step_logits, h)
            stepped.append(-float(log_p[0, x[t]]))
            memory.add(h[:, None], x[None, t:t + 1])
            step_logits, state, h = model.step(state, x[t:t + 1], want_hidden=True)
    assert np.allclose(stepped, scored.numpy(), atol=1e-4)
    plain = torch.nn.functional.cross_entropy(logits[0], x[1:], reduction="none")
    assert not torch.allclose(scored, plain, atol=1e-3)  # the cache did take part


def _bar_played_again(shared_data, tok, times: int) -> tuple[torch.Tensor, int]:
    """A real song's first six bars, then its seventh bar `times` times; and that bar's length."""
    song = _real_song(shared_data, tok, 4000).numpy()
    bars = np.flatnonzero(song == tok.bar_id)
    head, bar = song[: bars[6]], song[bars[6]: bars[7]]
    return torch.from_numpy(np.concatenate([head] + [bar] * times)), len(bar)


def test_the_cache_copies_a_repeated_bar(shared_data):
    """A bar played twice: the second time, with the cache its notes are far likelier than
    pop-piano alone expects them (v8: 0.65 alone, 0.78 with the cache; later times through, the
    model's own echo head and copy marks copy the bar as well as the cache does)."""
    model, tok = load_model("pop-piano")
    model.eval()
    model.resample(0)
    x, n = _bar_played_again(shared_data, tok, 2)
    lo, hi = tok.range("Pitch")
    last = [i - 1 for i in range(len(x) - n, len(x)) if lo <= int(x[i]) < hi]
    with torch.no_grad():
        logits, hidden = model.logits_and_hidden(x[None, :-1])
    alone = torch.softmax(logits[0].float(), -1).gather(1, x[1:, None])[:, 0][last].mean()
    opts = SamplingOptions(repeat=0.9).cache()
    cached = torch.exp(-mixture_nll(logits[0], hidden[0], x[1:], opts, opts.groups(tok)))[last].mean()
    assert float(cached) > 0.75 and float(cached) > float(alone) + 0.1, (float(alone), float(cached))


def test_sampling_with_the_cache_is_valid_and_deterministic(tiny_checkpoint):
    from spemusic.tokens.grammar import REMIGrammar

    model, tok = load_model(tiny_checkpoint)
    opts = SamplingOptions(repeat=1.0)
    a = sample(model, tok, num=2, length=300, seed=3, options=opts).ids
    b = sample(model, tok, num=2, length=300, seed=3, options=opts).ids
    off = sample(model, tok, num=2, length=300, seed=3, options=SamplingOptions()).ids
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert any(not np.array_equal(x, y) for x, y in zip(a, off))
    grammar = REMIGrammar(tok)
    assert all(grammar.is_valid(s) for s in a)


def test_the_cache_memory_is_fixed_by_its_window(tiny_checkpoint):
    model, tok = load_model(tiny_checkpoint)
    memory = ContinuousCache(CacheOptions(window=16, gap=4), tok, 2, model.cfg.d_model, "cpu")
    before = memory.keys.nbytes + memory.tokens.nbytes
    for i in range(100):  # each entry's token is its index
        memory.add(torch.randn(2, 3, model.cfg.d_model), torch.arange(3 * i, 3 * i + 3).repeat(2, 1))
    assert memory.keys.nbytes + memory.tokens.nbytes == before and memory.filled == 300
    assert int(memory.tokens.min()) == 300 - 20  # the newest window + gap entries


def test_chords_in_force():
    from spemusic.generation.sampling import chords_in_force
    from spemusic.tokens.tokenizer import REMITokenizer, TokenizerConfig

    tok = REMITokenizer(TokenizerConfig(chords=True))
    names = ["BOS", "Bar", "TimeSig_4/4", "Position_0", "Chord_A:min", "Tempo_10", "Bar", "Position_0", "Chord_C:maj"]
    ids = torch.tensor([[tok.vocab.index(n) for n in names]])
    a, c = tok.vocab.index("Chord_A:min"), tok.vocab.index("Chord_C:maj")
    assert chords_in_force(ids, tok)[0].tolist() == [-1, -1, -1, -1, a, a, a, a, c]


def test_with_chords_the_cache_copies_only_under_the_same_chord(shared_data):
    """With --chords, a bar's notes are copied only from moments under its own chord: entries
    tagged with another chord are not searched (here: the mixture equals the model alone)."""
    model, tok = load_model("pop-piano")
    model.eval()
    song, _ = _bar_played_again(shared_data, tok, 2)  # (its last note: somewhere the piece has been)
    opts = SamplingOptions(repeat=0.9).cache()
    with torch.no_grad():
        logits, hidden = model.logits_and_hidden(song[None, :-1])
    memory = ContinuousCache(opts, tok, 1, model.cfg.d_model, "cpu")
    memory.add(hidden[:, :-1], song[None, 1:-1], torch.full((1, len(song) - 2), 7))
    last = logits[:, -1]
    other = memory.mix(last, hidden[:, -1], torch.tensor([8]))
    same = memory.mix(last, hidden[:, -1], torch.tensor([7]))
    assert torch.allclose(other, torch.log_softmax(last.float(), -1), atol=1e-6)
    assert not torch.allclose(same, other, atol=1e-3)
    ids = sample(model, tok, num=1, bars=4, seed=0, chords=["C:maj", "G:maj"], options=SamplingOptions(repeat=0.9)).ids[0]
    assert REMIGrammar(tok).is_valid(ids)


def test_endless_play_samples_with_the_cache(tiny_checkpoint):
    """`play`'s bar-by-bar sampler (stream_bars) with the cache: valid bars, deterministic, not
    the same music as without it."""
    from spemusic.generation.sampling import stream_bars

    model, tok = load_model(tiny_checkpoint)

    def bars(options, n=6):
        out = []
        for bar in stream_bars(model, tok, seed=4, options=options):
            out += bar
            if sum(t == tok.bar_id for t in out) == n:
                return out

    cached = bars(SamplingOptions(repeat=1.0, onset_top_p=0.9))
    assert cached == bars(SamplingOptions(repeat=1.0, onset_top_p=0.9))
    assert cached != bars(SamplingOptions())
    ids = [tok.bos_id, *cached, tok.bar_id]
    assert REMIGrammar(tok).first_violation(ids) is None
