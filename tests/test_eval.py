"""spemusic eval: NLL by position (table, JSON, plot) and music metrics with known answers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from spemusic.music.metrics import continuation_similarity, note_grid, summary
from spemusic.tokens.tokenizer import REMITokenizer


def test_eval_nll_table_json_plot(run_cli, tiny_checkpoint, examples, tmp_path):
    folder = tmp_path / "midis"
    folder.mkdir()
    for name, path in examples.items():
        (folder / f"{name}.mid").write_bytes(path.read_bytes())
    out_json, out_png = tmp_path / "nll.json", tmp_path / "nll.png"
    code, out, err = run_cli("eval", tiny_checkpoint, folder, "--split", "all", "--max-len", 256, "--bucket", 64,
                             "--json", out_json, "--plot", out_png)
    assert code == 0, err
    assert "trained length" in out and "mean" in out
    report = json.loads(out_json.read_text())
    assert set(report) >= {"mean_nll", "trained_len", "buckets"}
    assert report["trained_len"] == 256
    assert [b["start"] for b in report["buckets"]] == [0, 64, 128, 192]
    assert all(set(b) == {"start", "end", "nll", "tokens"} for b in report["buckets"])
    scored = [b for b in report["buckets"] if b["tokens"]]
    total = sum(b["tokens"] for b in scored)
    assert report["mean_nll"] == pytest.approx(sum(b["nll"] * b["tokens"] for b in scored) / total)
    # by part: every scored token counted once, every note in its program's part
    parts = report["parts"]
    assert "shared" in parts and len(parts) >= 2
    assert sum(p["nll"] for p in parts.values()) == pytest.approx(report["mean_nll"] * total)
    assert sum(p["notes"] for n, p in parts.items() if n != "shared") == report["notes"]
    # a random tiny model is close to uniform over the 480 tokens
    assert 4.0 < report["mean_nll"] < 8.0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out_png.stat().st_size > 5000


def test_eval_bad_input(run_cli, tiny_checkpoint, tmp_path):
    code, _, err = run_cli("eval", tiny_checkpoint)
    assert code == 1 and "MODEL" in err
    code, _, err = run_cli("eval", tiny_checkpoint, tmp_path / "nothing")
    assert code == 1 and "no such file or folder" in err


def _ids(tok, notes, bars=1, timesig="4/4"):
    """Tokens of notes given as (bar, position, pitch, drum)."""
    toks = ["BOS"]
    for bar in range(bars):
        toks.append("Bar")
        if bar == 0:
            toks.append(f"TimeSig_{timesig}")
        first = bar == 0
        for pos in sorted({n[1] for n in notes if n[0] == bar}):
            toks.append(f"Position_{pos}")
            if first:
                toks.append("Tempo_10")
                first = False
            for _, _, pitch, drum in sorted(n for n in notes if n[0] == bar and n[1] == pos):
                toks += ["Program_drums" if drum else "Program_0", f"Pitch_{pitch}", "Velocity_20"]
                if not drum:
                    toks.append("Duration_11")
    toks.append("EOS")
    return tok.tokens_to_ids(toks)


def test_metrics_known_answers():
    tok = REMITokenizer()
    same_class = _ids(tok, [(0, 0, 60, False), (0, 12, 72, False), (0, 24, 48, False)])
    assert summary(same_class, tok)["H1"] == pytest.approx(0.0)
    chromatic = _ids(tok, [(0, 3 * i, 60 + i, False) for i in range(12)])
    assert summary(chromatic, tok)["H1"] == pytest.approx(math.log2(12))
    assert summary(chromatic, tok)["pitch_range"] == 11
    # two identical bars: grooving similarity 1; an onset moved: lower
    groove = [(b, p, 36, True) for b in range(2) for p in (0, 12, 24, 36)]
    assert summary(_ids(tok, groove, bars=2), tok)["GS"] == pytest.approx(1.0)
    moved = groove[:-1] + [(1, 30, 36, True)]
    assert summary(_ids(tok, moved, bars=2), tok)["GS"] == pytest.approx(1 - 2 / 48)
    chord = _ids(tok, [(0, 0, 60, False), (0, 0, 64, False), (0, 0, 67, False), (0, 24, 60, False)])
    assert summary(chord, tok)["polyphony"] == pytest.approx(2.0)
    assert summary(chord, tok)["notes_per_bar"] == pytest.approx(4.0)


def test_continuation_similarity_per_quarter():
    tok = REMITokenizer()
    beat = [(b, p, pitch, True) for b in range(8) for p, pitch in ((0, 36), (12, 38), (24, 36), (36, 38))]
    source = _ids(tok, beat, bars=8)
    # a continuation that repeats the source's groove is maximally similar in every quarter
    sims = continuation_similarity(source, source, tok, prompt_bars=0)
    assert sims == pytest.approx([1.0] * 4)
    # one that switches to other drums in its second half drops there
    other = beat[:16] + [(b, p, 42, True) for b in range(4, 8) for p in (0, 6, 12, 18)]
    changed = _ids(tok, other, bars=8)
    sims = continuation_similarity(source, changed, tok, prompt_bars=0)
    assert sims[0] == pytest.approx(1.0) and sims[3] < 0.2
    # against its first bars only (the prompt), a source that changes later does not count its change
    assert continuation_similarity(changed, source, tok, prompt_bars=2, reference_bars=2) == pytest.approx([1.0] * 4)
    assert continuation_similarity(changed, source, tok, prompt_bars=2)[0] < 0.95
    g = note_grid(source, tok)
    assert g.n_bars == 8 and len(g.pitch) == 32 and g.drum.all()
    assert np.array_equal(g.onset[:4], [0, 12, 24, 36])


def test_backbeat_bars():
    """A bar keeps the backbeat with a snare on beats 2 and 4; one on beat 2 alone does not."""
    from spemusic.music.metrics import backbeat_bars, backbeat_share

    tok = REMITokenizer()
    kick = [(b, p, 36, True) for b in range(3) for p in (0, 24)]
    snares = [(0, 12, 38, True), (0, 36, 38, True), (1, 12, 38, True), (2, 12, 40, True), (2, 36, 40, True)]
    g = note_grid(_ids(tok, kick + snares, bars=3), tok)
    assert backbeat_bars(g) == {0: True, 1: False, 2: True}
    assert backbeat_share(g) == pytest.approx(2 / 3)


def test_metrics_command(run_cli, examples, tmp_path):
    code, out, err = run_cli("eval", "--metrics", examples["piano"], "--reference", examples["groove"].parent,
                             "--json", tmp_path / "m.json")
    assert code == 0, err
    assert "H1" in out and "GS" in out and "reference" in out
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["generated"]["files"] == 1 and data["reference"]["files"] == 2


def test_metrics_of_an_unreadable_folder_names_the_folder(run_cli, tmp_path):
    bad = tmp_path / "mine"
    bad.mkdir()
    (bad / "junk.mid").write_bytes(b"not midi")
    code, _, err = run_cli("eval", "--metrics", bad)
    assert code == 1 and f"{bad}: no readable MIDI file (1 skipped" in " ".join(err.split()), err
    assert "generated:" not in err
