"""The compiled step (spemusic.nn.step_graph): the same function as Performer.step on a real
song, a State either can step, the cache, and the fall-back to the eager step."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from spemusic.nn.model import ModelConfig, Performer
from spemusic.nn.step_graph import StepGraph


@pytest.fixture
def step_cache(compiling, tmp_path_factory, monkeypatch):
    """Compiling on, with one program cache for the session's tests (each program compiles once)."""
    monkeypatch.setenv("SPEMUSIC_CACHE", str(tmp_path_factory.getbasetemp() / "spemusic-cache"))
    monkeypatch.delenv("SPEMUSIC_COMPILE", raising=False)
    monkeypatch.setattr(StepGraph, "_failure", None)
    # (a command run earlier in this process may have left the command line's hooks)
    monkeypatch.setattr("spemusic.nn.step_graph.on_compile", None)
    monkeypatch.setattr("spemusic.nn.step_graph.on_failure", None)


@pytest.fixture(scope="module")
def song(shared_data):
    """A POP909 song in pop-piano's tokens (melody first, a chord each bar): 4,000 tokens."""
    from spemusic.nn.checkpoint import load_model

    _, tok = load_model("pop-piano")
    d = shared_data / "pop909"
    ids = tok.encode(d / "003.mid", beats=d / "beats" / "003.txt", chords=d / "chords" / "003.txt")
    assert len(ids) > 4000
    return tok, torch.from_numpy(ids[:4000]).long()


def _model(tok, **changes) -> Performer:
    """A small random model in pop-piano's vocabulary, with its bar echo over 4 bars, its short
    convolution, its interval head, an echo head and gated sineSPE; its echo rows, both heads'
    scores and the convolution drawn large enough to matter."""
    from spemusic.training.train import echo_head_config, interval_head_config

    lo, hi = tok.range("Position")
    cfg = ModelConfig.preset("tiny", vocab_size=len(tok), pe="sinespe", gated=True, short_conv=8,
                             bar_echo=[tok.bar_id, lo, hi], echo_bars=4, **echo_head_config(True, tok),
                             **interval_head_config(tok))
    torch.manual_seed(0)
    m = Performer(replace(cfg, **changes)).eval()
    with torch.no_grad():
        if m.bar_echo is not None:
            m.bar_echo.weight.normal_(0.0, 1.0)
        if m.interval_head is not None:
            m.interval_head.weight.normal_(0.0, 1.0)
        if m.echo_head is not None:
            m.echo_head.weight.normal_(0.0, 1.0)
        for blk in m.blocks:
            if blk.shift is not None:
                blk.shift.normal_(0.0, 0.3)
    m.resample(5)
    return m


def _stepped(step, state, ids: torch.Tensor) -> torch.Tensor:
    out = []
    for t in range(ids.shape[1]):
        logits, state = step(state, ids[:, t])
        out.append(logits[:, None])
    return torch.cat(out, 1)


def _compiled_and_eager(m, ids: torch.Tensor, prompt: int) -> tuple:
    """The logits of the tokens after `prompt` one at a time, the compiled step's and the eager
    step's, each from its own primed State (returned too)."""
    _, eager_state = m.prime(ids[:, :prompt])
    _, state = m.prime(ids[:, :prompt])
    graph = StepGraph.of(m, state)
    assert graph is not None, StepGraph.unavailable()
    return _stepped(graph, state, ids[:, prompt:]), _stepped(m.step, eager_state, ids[:, prompt:]), state, eager_state


def _assert_every_path_agrees(m, ids: torch.Tensor, full: torch.Tensor) -> None:
    """The compiled and the eager step after a 2,100-token prompt, and the compiled step from
    scratch (its first token opens every carry, as the parallel pass's does), give the parallel
    pass's logits `full` within 1e-4."""
    compiled, eager, _, _ = _compiled_and_eager(m, ids, 2100)
    assert (compiled - full[:, 2100:]).abs().max().item() <= 1e-4
    assert (eager - full[:, 2100:]).abs().max().item() <= 1e-4
    state = m.init_state(1)
    graph = StepGraph.of(m, state)
    assert (_stepped(graph, state, ids[:, :300]) - full[:, :300]).abs().max().item() <= 1e-4


def test_the_compiled_step_is_the_eager_step_on_a_real_song(song, step_cache):
    """Past a prompt longer than the bar echo's context (so bars leave it as the song goes on),
    300 tokens one at a time give the eager step's logits and the parallel pass's, in fp32."""
    tok, ids = song
    m = _model(tok)
    ids = ids[None, :2400]
    with torch.no_grad():
        full = m(ids)[:, 2100:]
    compiled, eager, state, eager_state = _compiled_and_eager(m, ids, 2100)
    assert (compiled - eager).abs().max().item() <= 1e-4
    assert (compiled - full).abs().max().item() <= 1e-4
    assert torch.equal(state.recall["echo"], eager_state.recall["echo"])
    assert torch.equal(state.recall["interval"], eager_state.recall["interval"])
    for a, b in zip(state.layers, eager_state.layers):
        assert ((a - b).abs().max() / b.abs().max()).item() <= 1e-5


def test_a_state_the_compiled_step_moved_is_a_state_like_any_other(song, step_cache):
    """From scratch, in half precision and at batch 2, with groove's kind of model (no short
    convolution): the compiled step's State, cloned, goes on with the eager step as the compiled
    one goes on with the original; a second StepGraph loads the programs the first compiled,
    without compiling again."""
    from spemusic.nn import step_graph

    tok, ids = song
    m = _model(tok, short_conv=0)
    ids = torch.stack([ids[:400], ids[1000:1400]])
    state = m.init_state(2, weights_dtype=torch.float16)
    graph = StepGraph.of(m, state)
    _stepped(graph, state, ids[:, :200])
    branch = state.clone()
    ahead = _stepped(graph, state, ids[:, 200:])
    behind = _stepped(m.step, branch, ids[:, 200:])
    assert (ahead - behind).abs().max().item() <= 2e-2  # the eager step rounds its inputs to fp16
    reference = _stepped(m.step, m.init_state(2, weights_dtype=torch.float16), ids)[:, 200:]
    assert (ahead - reference).abs().max().item() <= 2e-2
    calls = []
    step_graph.on_compile = lambda: calls.append(1)
    try:
        again = m.init_state(2, weights_dtype=torch.float16)
        assert StepGraph.of(m, again) is not None and calls == []
    finally:
        step_graph.on_compile = None
    with pytest.raises(ValueError, match="State it was made for"):
        graph(branch, ids[:, 0])


def test_the_step_runs_uncompiled_where_compiling_is_off_or_fails(song, step_cache, monkeypatch, tmp_path):
    tok, _ = song
    m = _model(tok, short_conv=0)
    monkeypatch.setenv("SPEMUSIC_COMPILE", "0")
    assert StepGraph.of(m, m.init_state(1)) is None and StepGraph.unavailable() == "SPEMUSIC_COMPILE=0"
    monkeypatch.delenv("SPEMUSIC_COMPILE")
    assert StepGraph.of(_model(tok, pe="ape"), m.init_state(1)) is None  # not served: the eager step

    def fails(*args):
        raise RuntimeError("no compiler here\nmore")

    monkeypatch.setattr("spemusic.nn.step_graph._Program._compile", staticmethod(fails))
    monkeypatch.setenv("SPEMUSIC_CACHE", str(tmp_path))  # nothing cached: it must compile
    with pytest.warns(UserWarning, match=r"compiling the step failed \(RuntimeError: no compiler here\)"):
        assert StepGraph.of(m, m.init_state(1)) is None
    assert "no compiler here" in StepGraph.unavailable()


def test_repeat_marks_read_the_same_in_the_compiled_step_the_eager_step_and_the_parallel_pass(shared_data, step_cache):
    """A real song with Repeat marks (spemusic.tokens.repeats): the echo of a marked sweep is its
    lag's and the echo head scores that lag from its second table, on every path alike; at zero
    the second table was a copy of the first, so `widened` adds the marks without a change."""
    from spemusic.nn.recall import ECHO_CONTEXT, echo_features, echo_places, mark_in_force
    from spemusic.tokens.tokenizer import REMITokenizer, TokenizerConfig
    from spemusic.training.train import repeat_marks_config, widened

    tok = REMITokenizer(TokenizerConfig(chords=True, parts=True, melody_first=True, chord_every_bar=True,
                                        repeats=True))
    d = shared_data / "pop909"
    ids = torch.from_numpy(tok.encode(d / "003.mid", beats=d / "beats" / "003.txt",
                                      chords=d / "chords" / "003.txt")[:2400]).long()[None]
    base = _model(tok)
    m = widened(base, replace(base.cfg, repeat_marks=repeat_marks_config(tok))).eval()
    base.resample(5), m.resample(5)
    marks = tuple(tuple(x) for x in m.cfg.repeat_marks)
    lag = mark_in_force(ids, echo_places(ids, tok.bar_id, tok.range("Position"))["last_bar"], marks)
    assert set(lag.unique().tolist()) >= {0, 4}  # the song repeats itself, and the marks say so
    lo, hi = tok.range("Position")
    echo, _, _ = echo_features(ids, None, tok.bar_id, (lo, hi), len(tok), 4, (1, 2, 4, 8), 16, marks)
    unmarked, _, _ = echo_features(ids, None, tok.bar_id, (lo, hi), len(tok), 4, (1, 2, 4, 8), 16)
    assert torch.equal(echo[lag == 0], unmarked[lag == 0]) and not torch.equal(echo, unmarked)
    with torch.no_grad():
        full = m(ids)
        m.echo_head.weight[:, 17:].normal_(0.0, 1.0)  # the marked lag's own table
        marked = m(ids)
    assert ids.shape[1] > ECHO_CONTEXT and not torch.allclose(full, marked)
    compiled, eager, _, _ = _compiled_and_eager(m, ids, 2100)
    assert (compiled - marked[:, 2100:]).abs().max().item() <= 1e-4
    assert (eager - marked[:, 2100:]).abs().max().item() <= 1e-4


def test_the_melody_head_and_the_bar_clock_read_the_same_in_the_compiled_step_the_eager_step_and_the_parallel_pass(
        song, step_cache):
    """A real song past the echo's context: the melody head's scores (the accompaniment by the melody
    sounding, the chords by the melody's pitch classes) and the bar clock's rows on every path
    alike; at zero, nothing."""
    from spemusic.training.train import bar_clock_config, melody_head_config, widened

    tok, ids = song
    ids = ids[None, :2400]
    base = _model(tok)
    m = widened(base, replace(base.cfg, **melody_head_config(True, tok), **bar_clock_config(tok))).eval()
    base.resample(5), m.resample(5)
    with torch.no_grad():
        assert torch.equal(m(ids), base(ids))
        m.melody_head.weight.normal_(0.0, 1.0)
        m.chord_head.weight.normal_(0.0, 1.0)
        m.bar_clock.weight.normal_(0.0, 0.5)
        m.melody_clock.weight.normal_(0.0, 0.5)
        m.rest_clock.weight.normal_(0.0, 0.5)
        full = m(ids)
    assert ((full - base(ids)).abs().amax(-1) > 0.1).sum() > 500  # the accompaniment's notes and chords
    _assert_every_path_agrees(m, ids, full)


def test_the_key_head_reads_the_same_in_the_compiled_step_the_eager_step_and_the_parallel_pass(song, step_cache):
    """The key head's scores (each part's pitch, and each chord, by the pitch classes counted so
    far) on every path alike, carried across the prompt's chunks; at zero, nothing; the counts only
    of the parts' notes."""
    from spemusic.nn.recall import pitch_profile
    from spemusic.training.train import key_head_config, widened

    tok, ids = song
    ids = ids[None, :2400]
    base = _model(tok)
    m = widened(base, replace(base.cfg, **key_head_config(tok))).eval()
    base.resample(5), m.resample(5)
    with torch.no_grad():
        assert torch.equal(m(ids), base(ids))
        m.key_head.weight.normal_(0.0, 1.0)
        m.key_chords.weight.normal_(0.0, 1.0)
        full = m(ids)
    lo, hi = tok.range("Pitch")
    first, Q = m.cfg.key_chords
    moved = (full - base(ids)).abs()
    is_part = torch.isin(ids, m.key_programs)
    pitches = moved[..., lo:hi].amax(-1) > 0.1
    assert pitches[is_part].float().mean() > 0.9 and not pitches[~is_part].any()  # where a pitch comes next
    assert (moved[..., first:first + 12 * Q].amax(-1) > 0.1)[0, 100:].all()  # the chords, once notes are counted
    _assert_every_path_agrees(m, ids, full)
    # the counts: every note of the parts, by pitch class, as the song's own pitches give them
    _, profile, carry = pitch_profile(ids, None, m.key_programs, m.cfg.pitch_range)
    notes = ids[0, 1:][is_part[0, :-1]] - lo
    assert torch.equal(carry[0, 1:], torch.bincount(notes % 12, minlength=12))
    share = (carry[0, 1:] + 1).float() / (len(notes) + 12)
    assert torch.allclose(profile[0, -1].exp(), share)
