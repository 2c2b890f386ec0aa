"""Fidelity report of the REMI tokenizer on the real data sets.

    python benchmarks/tokenizer_fidelity.py [DATA_DIR]   (default ../shared/data)

Per data set (pop909, groove): files, notes, tokens, tokens per bar, notes
moved by quantisation (count, max onset error in the file's ticks and in grid
steps), notes kept as doublings, dropped notes, clipped durations, off-bar
time-signature changes, tempos outside the tempo range, idempotence of the
round trip, and failures (files that raised MidiError, with the reason).

Then POP909 on its own beat annotations (bars from the downbeats, onsets between the annotated
beats) and chord annotations: notes kept, the largest onset error against the original file (in
beats and in seconds), the share of bars in 4/4 (and the bar lengths), chord tokens, an
idempotent round trip (decode writes chords as markers, which encode reads back), and how many
notes the MIDI-player rule (an overlapping same-pitch note ends the earlier one) merges.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spemusic.errors import MidiError
from spemusic.music.metrics import note_grid
from spemusic.tokens.grammar import REMIGrammar
from spemusic.tokens.tokenizer import REMITokenizer, TokenizerConfig

DATASETS = {"pop909": "*.mid", "groove": "**/*.mid"}


def print_rows(title: str, rows: list[tuple[str, str]], failures: list[str]) -> None:
    print(f"\n== {title} ==")
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")
    for msg in failures[:20]:
        print(f"    {msg}")


def report(tok: REMITokenizer, name: str, files: list[Path]) -> None:
    t0 = time.perf_counter()
    agg = dict(files=0, notes=0, tokens=0, bars=0, moved=0, dup=0, dropped=0, clipped=0, ts_moved=0, tempo_clip=0, not_idem=0)
    max_err_ticks = 0.0
    max_err_steps = 0.0
    failures: list[str] = []
    for f in files:
        try:
            ids, st = tok.encode_with_stats(f)
        except MidiError as e:
            failures.append(str(e))
            continue
        agg["files"] += 1
        agg["notes"] += st["notes"]
        agg["tokens"] += st["tokens"]
        agg["bars"] += st["bars"]
        agg["moved"] += st["moved_onsets"]
        agg["dup"] += st["duplicate_notes"]
        agg["dropped"] += st["notes"] - st["notes_encoded"]
        agg["clipped"] += st["clipped_durations"]
        agg["ts_moved"] += st["ts_changes_moved"]
        agg["tempo_clip"] += st["tempos_clipped"]
        max_err_ticks = max(max_err_ticks, st["max_onset_error_ticks"])
        max_err_steps = max(max_err_steps, st["max_onset_error_ticks"] * tok.config.beat_resolution / st["ticks_per_beat"])
        if not np.array_equal(tok.encode(tok.decode_to_score(ids, "layers").dumps_midi()), ids):
            agg["not_idem"] += 1
    dt = time.perf_counter() - t0
    n = max(agg["notes"], 1)
    rows = [
        ("files", f"{agg['files']} ok of {len(files)}"),
        ("notes", f"{agg['notes']:,}"),
        ("tokens", f"{agg['tokens']:,}  ({agg['tokens'] / max(agg['files'], 1):,.0f} per file)"),
        ("tokens per bar", f"{agg['tokens'] / max(agg['bars'], 1):.1f}  ({agg['bars']:,} bars)"),
        ("notes moved by quantisation",
         f"{agg['moved']:,} ({100 * agg['moved'] / n:.1f}%), max error {max_err_ticks:g} ticks = {max_err_steps:.3f} grid steps"),
        ("doublings kept (same onset/program/pitch)", f"{agg['dup']:,} ({100 * agg['dup'] / n:.2f}%)"),
        ("dropped notes", f"{agg['dropped']:,}"),
        ("clipped durations", f"{agg['clipped']:,} ({100 * agg['clipped'] / n:.3f}%) > {tok.config.max_duration_beats} beats"),
        ("time-signature changes moved to a bar line", f"{agg['ts_moved']}"),
        ("tempo events outside the tempo range", f"{agg['tempo_clip']}"),
        ("round trip not idempotent", f"{agg['not_idem']}"),
        ("failures", f"{len(failures)}"),
        ("time (encode + decode + re-encode)", f"{dt:.1f} s"),
    ]
    print_rows(name, rows, failures)


def beats_report(tok: REMITokenizer, pop: Path) -> None:
    t0 = time.perf_counter()
    files = sorted(pop.glob("*.mid"))
    agg = dict(files=0, notes=0, kept=0, bars=0, not_idem=0, chords=0, trimmed=0, tokens=0)
    bar_beats: dict[int, int] = {}
    err_beats = err_sec = 0.0
    failures = []
    grammar = REMIGrammar(tok)
    for f in files:
        try:
            ids, st = tok.encode_with_stats(f, beats=pop / "beats" / f"{f.stem}.txt", chords=pop / "chords" / f"{f.stem}.txt")
        except MidiError as e:
            failures.append(str(e))
            continue
        agg["files"] += 1
        agg["notes"] += st["notes"]
        agg["kept"] += st["notes_encoded"]
        agg["tokens"] += st["tokens"]
        agg["chords"] += st["chord_changes"]
        err_beats = max(err_beats, st["max_onset_error_beats"])
        err_sec = max(err_sec, st["max_onset_error_seconds"])
        for steps in note_grid(ids, tok).bar_len.tolist():
            bar_beats[steps / tok.config.beat_resolution] = bar_beats.get(steps / tok.config.beat_resolution, 0) + 1
        if not np.array_equal(tok.encode(tok.decode_to_score(ids, "layers").dumps_midi()), ids) or not grammar.is_valid(ids):
            agg["not_idem"] += 1
        agg["trimmed"] += st["notes_encoded"] - sum(len(t.notes) for t in tok.decode_to_score(ids, "trim").tracks)
    nbars = sum(bar_beats.values())
    lengths = ", ".join(f"{k:g} beats {100 * v / nbars:.1f}%" for k, v in sorted(bar_beats.items(), key=lambda kv: -kv[1])[:6])
    rows = [
        ("files", f"{agg['files']} ok of {len(files)} (each with its beats/NNN.txt and chords/NNN.txt)"),
        ("notes kept", f"{agg['kept']:,} of {agg['notes']:,}"),
        ("largest onset error against the original", f"{err_beats:.4f} beats, {1000 * err_sec:.1f} ms"),
        ("bars in 4/4", f"{100 * bar_beats.get(4, 0) / nbars:.1f}% of {nbars:,} bars ({lengths})"),
        ("tokens", f"{agg['tokens']:,}  ({agg['tokens'] / max(agg['files'], 1):,.0f} per file)"),
        ("chord tokens", f"{agg['chords']:,}"),
        ("round trip not idempotent (or not in the grammar)", f"{agg['not_idem']}"),
        ("notes merged at decode by the MIDI-player rule",
         f"{agg['trimmed']:,} ({100 * agg['trimmed'] / max(agg['kept'], 1):.2f}%; kept with overlaps='layers')"),
        ("failures", f"{len(failures)}"),
        ("time", f"{time.perf_counter() - t0:.1f} s"),
    ]
    print_rows("pop909 with its beat and chord annotations", rows, failures)


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
    if not root.is_dir():
        print(f"data not found: {root}", file=sys.stderr)
        return 1
    tok = REMITokenizer()
    print(f"REMITokenizer vocab={len(tok)} fingerprint={tok.config.fingerprint()} grid={tok.config.beat_resolution}/beat")
    for name, pattern in DATASETS.items():
        files = sorted((root / name).glob(pattern))
        if files:
            report(tok, name, files)
        else:
            print(f"\n== {name} ==\n  no files under {root / name}")
    if (root / "pop909" / "beats").is_dir():
        beats_report(REMITokenizer(TokenizerConfig(chords=True)), root / "pop909")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
