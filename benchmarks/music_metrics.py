"""Music metrics of the shipped models against real held-out data (valid splits), side by side.

1. pop-piano: N generated pieces of L tokens from scratch, and N continuations of 4-bar prompts
   (the POP909 valid songs' first bars) up to L tokens, vs the POP909 valid songs (re-barred by
   their beat annotations when the model was trained so; each cut to L tokens): the share of
   4/4 bars, silence, beats with an onset, notes per bar and per onset, H1, H4, GS, key
   clarity, repetition, with the ratio and the goal of each; how the silence and 4/4 means arise
   from the pieces (lowest, median, highest; every piece's figures in --out's JSON, "per_piece");
   tracks per file; and with
   chord tokens, how often a bar forced to a chord (--chords) has it as its best template match,
   next to the same figure for the real songs against their annotations.
2. groove: continuations (4 per prompt) of 2-bar prompts taken from every Groove valid piece of at
   least 4 bars; cosine similarity of
   the onset-position × drum-pitch histogram of each quarter of the continuation to the prompt's
   (the SPE paper's groove experiment): the last quarter should stay close to the first. Beside
   it, the same against the whole source piece, which holds the real next bars themselves.

   Real reference: the same quarters of the pieces' own next bars (where a piece is long enough).
   The last/first ratio comes with a bootstrap 90% interval over prompts.

    python benchmarks/music_metrics.py [--pieces 32] [--length 2048] [--prompts 64] [--bars 16] [--per-prompt 4]
                                       [--only pop-piano|groove] [--groove-model NAME_OR_PATH]
                                       [--pop-model NAME_OR_PATH] [--top-p P] [--bar-top-p P] [--temperature T]
                                       [--chords "C G Am F"] [--onset-top-p P] [--repeat W] [--hole-penalty N]
                                       [--stacking S] [--follow-repeats N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from spemusic.generation.sampling import SamplingOptions, sample
from spemusic.music.metrics import continuation_similarity, summary
from spemusic.nn.checkpoint import load_model, read_metadata, resolve
from spemusic.options import CHORD_STRENGTH
from spemusic.training.data import open_dataset

from _errors import run_script  # (benchmarks/, the script's own folder)

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
KEYS = ("H1", "H4", "GS", "notes_per_bar", "polyphony", "pitch_range")


def cut_to_bars(ids: np.ndarray, tok, max_tokens: int) -> np.ndarray:
    """The first complete bars of a piece within max_tokens (+ EOS)."""
    ids = np.asarray(ids[:max_tokens])
    bars = np.flatnonzero(ids == tok.bar_id)
    if len(bars) > 1:
        ids = ids[: bars[-1]]
    return np.concatenate([ids, [tok.eos_id]])


def piece_metrics(seqs, tok) -> list[dict]:
    """spemusic.music.metrics.summary of each piece, as plain floats (for the JSON)."""
    return [{k: float(v) for k, v in summary(s, tok).items()} for s in seqs]


def mean_metrics(seqs, tok) -> dict:
    return mean_of(piece_metrics(seqs, tok))


def mean_of(rows: list[dict]) -> dict:
    return {k: float(np.nanmean([r[k] for r in rows])) for k in rows[0]}


def print_spread(title: str, rows: list[dict]) -> None:
    """How a mean of few pieces arises: the pieces' silence and 4/4 share, lowest, median, highest,
    and the three pieces farthest on the side of the goal (most silence, fewest 4/4 bars)."""
    for k, worst in (("silence", "largest"), ("bars_4_4", "smallest")):
        v = np.sort([r[k] for r in rows])
        three = v[-3:][::-1] if worst == "largest" else v[:3]
        print(f"  {title} {k} per piece: min {v[0]:.3f}, median {np.median(v):.3f}, max {v[-1]:.3f}; "
              f"{worst} three {', '.join(f'{x:.3f}' for x in three)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pieces", type=int, default=32)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--bars", type=int, default=16)
    ap.add_argument("--per-prompt", type=int, default=4, help="continuations per groove prompt (one batch)")
    ap.add_argument("--scratch", type=int, default=192, help="groove pieces of 8 bars from scratch (fewer swing by "
                    "the draw: docs/groove-history.md, v5)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--only", choices=("pop-piano", "groove"))
    ap.add_argument("--pop-model", default="pop-piano")
    ap.add_argument("--groove-model", default="groove")
    ap.add_argument("--chords", default="C G Am F", help="progression for the --chords check (one per bar)")
    ap.add_argument("--top-p", type=float, default=None, help="default: the model's, as generate has it")
    ap.add_argument("--bar-top-p", type=float, default=None, help="default: the model's, as generate has it")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--onset-top-p", type=float, default=None, help="default: the model's, as generate has it")
    ap.add_argument("--repeat", type=float, default=None, help="default: the model's, as generate has it")
    ap.add_argument("--hole-penalty", type=float, default=None, help="default: the model's, as generate has it")
    ap.add_argument("--stacking", type=float, default=None, help="default: the model's, as generate has it")
    ap.add_argument("--follow-repeats", type=float, default=None, help="default: the model's, as generate has it")
    ap.add_argument("--seed", type=int, default=0, help="added to every piece's seed: another draw of the same benchmark")
    ap.add_argument("--out", default="benchmarks/results/music_metrics.json")
    args = ap.parse_args()
    def options(model_name: str) -> SamplingOptions:
        # the defaults of `generate` for that model: by the name it was released under, so that a
        # candidate in another folder is measured as it would ship
        info = read_metadata(resolve(model_name))["info"]
        return SamplingOptions.for_model(info.get("name"), args.temperature, 0, top_p=args.top_p,
                                 bar_top_p=args.bar_top_p, onset_top_p=args.onset_top_p, repeat=args.repeat,
                                 hole_penalty=args.hole_penalty, stacking=args.stacking,
                                 follow_repeats=args.follow_repeats)

    results = {}
    if args.only != "groove":
        results["pop-piano"] = pop_piano(args, options(args.pop_model))
    if args.only != "pop-piano":
        results["groove"] = groove(args, options(args.groove_model))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


def drop_bars(ids: np.ndarray, tok, n: int) -> np.ndarray | None:
    """The bars of a sequence after its first n (a continuation's new bars), as a piece of their
    own: BOS, the first new Bar with the time signature in force, the rest (None: no new bar)."""
    ids = np.asarray(ids)
    bars = np.flatnonzero(ids == tok.bar_id)
    if len(bars) <= n:
        return None
    ts_lo, ts_hi = tok.range("TimeSig")
    ts = [t for t in ids[: bars[n] + 2] if ts_lo <= t < ts_hi][-1]
    rest = ids[bars[n] + 1:]
    if len(rest) and ts_lo <= rest[0] < ts_hi:
        rest = rest[1:]
    return np.concatenate([[tok.bos_id, tok.bar_id, ts], rest])


POP_KEYS = ("bars_4_4", "silence", "beats_with_onset", "notes_per_bar", "polyphony", "H1", "H4", "GS",
            "key_clarity", "repetition", "pitch_range")
# goal per metric: (kind, bound) -- "min": gen >= bound (absolute), "ratio_max": gen/real <= bound,
# "ratio_min": gen/real >= bound, "within": |gen/real - 1| <= bound
POP_GOALS = {"bars_4_4": ("min", 0.9), "silence": ("ratio_max", 1.5), "beats_with_onset": ("ratio_min", 0.95),
             "notes_per_bar": ("within", 0.10), "polyphony": ("within", 0.15), "H1": ("within", 0.10),
             "H4": ("within", 0.10), "GS": ("within", 0.10), "key_clarity": ("within", 0.10),
             "repetition": ("within", 0.20)}


# the parts (models with parts): spemusic.music.metrics.part_summary; the melody against the real MELODY tracks
PART_KEYS = ("melody_bars", "melody_mono", "melody_range", "melody_notes_per_bar", "melody_unison", "melody_steps",
             "melody_thirds", "melody_fourths_fifths", "melody_leaps", "bass_fourth_fifth", "velocity_spread",
             "melody_on_top", "melody_clashes", "melody_out_of_key", "accompaniment_out_of_key", "melody_entry",
             "melody_kept", "opening_notes_per_bar")
PART_GOALS = {"melody_bars": ("within", 0.10), "melody_mono": ("min", 0.95),
              **{k: ("within", 0.15) for k in PART_KEYS[2:10]}, "velocity_spread": ("within", 0.20)}
ACCOMPANY_BARS = 16


def goal_text(key: str, gen: float, real: float) -> str:
    if key not in POP_GOALS and key not in PART_GOALS:
        return ""
    kind, bound = POP_GOALS.get(key) or PART_GOALS[key]
    r = gen / real if real else float("nan")
    ok = {"min": gen >= bound, "ratio_max": r <= bound, "ratio_min": r >= bound, "within": abs(r - 1) <= bound}[kind]
    text = {"min": f">= {bound}", "ratio_max": f"ratio <= {bound}", "ratio_min": f"ratio >= {bound}",
            "within": f"ratio 1 ± {bound:.2f}"}[kind]
    return f"{text:<16}{'met' if ok else 'MISSED'}"


def print_table(title: str, columns: dict[str, dict], keys=POP_KEYS) -> None:
    (gname, gen), (rname, real) = list(columns.items())
    print(title)
    print(f"{'metric':<24}{gname:>10}{rname:>10}{'ratio':>8}   goal")
    for k in keys:
        g, r = gen[k], real[k]
        print(f"{k:<24}{g:>10.3f}{r:>10.3f}{g / r if r else float('nan'):>8.2f}   {goal_text(k, g, r)}")
    if keys is POP_KEYS:
        print(f"{'  silence in empty bars':<24}{gen['silence_in_empty_bars']:>10.3f}{real['silence_in_empty_bars']:>10.3f}")


def parts(generated, continued, real, tok) -> dict:
    """The parts table: from scratch and continued against the real songs (part_summary)."""
    from spemusic.music.metrics import part_summary

    means = {name: mean_of([part_summary(s, tok) for s in seqs])
             for name, seqs in (("generated", generated), ("continued", continued), ("real", real))}
    print_table("\nparts, from scratch", {"generated": means["generated"], "real": means["real"]}, PART_KEYS)
    print_table("\nparts, continuations (new bars only)", {"continued": means["continued"], "real": means["real"]},
                PART_KEYS)
    return means


def accompany_check(model, tok, valid_paths, opts, seed: int, chart=None, named=None) -> dict:
    """Accompany the real melody of each valid song (its first ACCOMPANY_BARS bars from its first
    bar with melody, and the bars before it, on its beats), as `spemusic accompany` does: on the
    chart `chart(melody_ids)` draws (the model's harmonizer), on the song's own chords (those in
    force at each bar line, as `--chords` gives them), and with --no-harmonize (the model names
    each bar's chord as it writes from the melody's first bar on, `named(melody_ids)` the chords
    before it; without a harmonizer, every one). For each: how often the accompaniment alone (bridge
    and piano, duration-weighted) has the song's annotated chord as its best template match,
    next to the song's own PIANO track by the same matcher; its pitch-class profile against that
    track's; the share of the melody's time a semitone off the accompaniment, next to the song's;
    whether the melody came back token for token."""
    from spemusic.generation.accompany import hold_melody, load_melody
    from spemusic.music.metrics import (
        bar_chords,
        chord_match,
        chords_at_bar_lines,
        cosine,
        melody_clashes,
        note_grid,
        pitch_class_histogram,
    )
    from spemusic.options import CHORD_STRENGTH

    pop = DATA / "pop909"
    melody_id = tok.part_id("melody")
    modes = ("charted", "song", "named") if chart is not None else ("song", "named")
    tally = {k: [0, 0] for k in (*modes, "real")}  # [hits, bars counted]
    profiles = {k: [] for k in modes}
    clashes = {k: [] for k in (*modes, "real")}  # share of the melody's time a semitone off the rest
    exact = {k: 0 for k in modes}

    def melody_notes(seq) -> list[tuple]:
        """The melody's notes, token for token (Program_melody and the three tokens after it)."""
        seq = np.asarray(seq)
        return [tuple(seq[j:j + 4]) for j in np.flatnonzero(seq == melody_id)]

    for i, path in enumerate(valid_paths):
        melody = load_melody(path, tok, beats=pop / "beats" / f"{path.stem}.txt")
        song = tok.encode(path, beats=pop / "beats" / f"{path.stem}.txt", chords=pop / "chords" / f"{path.stem}.txt")
        # up to ACCOMPANY_BARS bars after the melody's first bar (a song may open on bars without it)
        bar_at = np.flatnonzero(melody.ids == tok.bar_id)
        first = int(np.searchsorted(bar_at, np.flatnonzero(melody.ids == melody_id)[0], side="right")) - 1
        end = first + ACCOMPANY_BARS
        cut = melody.ids[: bar_at[end]] if len(bar_at) > end else melody.ids
        bars = int(np.count_nonzero(cut == tok.bar_id))
        # bar b of the melody alone is bar b + shift of the song: the song may open with a pickup
        # bar (its piano before the first downbeat) that its melody alone does not have
        song_bar_at = np.flatnonzero(song == tok.bar_id)
        shift = int(np.searchsorted(song_bar_at, np.flatnonzero(song == melody_id)[0], side="right")) - 1 - first
        g_real = note_grid(song, tok)
        real_chords = bar_chords(g_real)
        asked = ([None] * max(-shift, 0) + real_chords[max(shift, 0):])[:bars]
        lo, hi = max(shift, 0), shift + bars  # the same bars of the song
        in_bars = (g_real.bar >= lo) & (g_real.bar < hi)
        real_piano = (g_real.prog == tok.part_id("piano")) & in_bars
        h, c = chord_match(g_real, [None] * lo + real_chords[lo:hi], notes=real_piano)
        tally["real"][0] += h
        tally["real"][1] += c
        clashes["real"].append(melody_clashes(g_real, (g_real.prog == melody_id) & in_bars,
                                              (g_real.prog != melody_id) & in_bars))
        # the song's own chords as `--chords` takes them: the one in force at each bar line (N where none)
        at_bar_lines = chords_at_bar_lines(g_real)
        given = {"song": [(at_bar_lines[b] if 0 <= b < len(at_bar_lines) else None) or "N"
                          for b in range(shift, shift + bars)]}
        if chart is not None:
            given["charted"] = chart(cut)
            given["named"] = named(cut)
        for mode in modes:
            chords = given.get(mode)  # (None: the model names them all)
            ids = sample(model, tok, num=1, bars=bars, seed=seed + 4000 + i, options=opts,
                         parts=("melody", "bridge", "piano"), held=hold_melody(cut, tok), chords=chords,
                         chord_strength=CHORD_STRENGTH if chords else 0.0).ids[0]  # (named: the chart's bars only)
            g = note_grid(ids, tok)
            h, c = chord_match(g, asked, notes=g.prog != melody_id)
            tally[mode][0] += h
            tally[mode][1] += c
            profiles[mode].append(cosine(pitch_class_histogram(g, g.prog != melody_id),
                                         pitch_class_histogram(g_real, real_piano)))
            clashes[mode].append(melody_clashes(g, g.prog == melody_id))
            exact[mode] += melody_notes(ids) == melody_notes(cut)

    rate = {k: h / max(c, 1) for k, (h, c) in tally.items()}
    real = rate["real"]
    print(f"\naccompany: {len(valid_paths)} valid songs' melodies, up to {ACCOMPANY_BARS} bars from their first "
          f"and the bars before it; the song's annotated chord as the best template match of the accompaniment "
          f"alone (goal >= 0.85x the song's own PIANO track's), the pitch-class profile against that track's "
          f"(cosine), the melody's time a semitone off the accompaniment:")
    print(f"  {'song (MELODY, PIANO)':<40} chord match {real:.3f} of {tally['real'][1]:<4} "
          f"{'':>17} clashes {np.nanmean(clashes['real']):.3f}")
    labels = {"charted": "on the harmonizer's chart (default)", "song": "on the song's own chords (--chords)",
              "named": "chords named as it writes (--no-harmonize)"}
    result = {"songs": len(valid_paths), "piano_track_match": real,
              "melody_clashes_real": float(np.nanmean(clashes["real"]))}
    for mode in modes:
        gen = rate[mode]
        ok = "met" if gen >= 0.85 * real else "MISSED"
        print(f"  {labels[mode]:<40} chord match {gen:.3f} of {tally[mode][1]:<4} ({gen / real:.2f}x, {ok}) "
              f"cosine {np.nanmean(profiles[mode]):.3f} clashes {np.nanmean(clashes[mode]):.3f}; "
              f"melody as given in {exact[mode]} of {len(valid_paths)}")
        result[mode] = {"accompaniment_match": gen, "bars": tally[mode][1], "melody_exact": exact[mode],
                        "pitch_class_cosine": float(np.nanmean(profiles[mode])),
                        "melody_clashes": float(np.nanmean(clashes[mode]))}
    return result


def pop_piano(args, opts) -> dict:
    from spemusic.music.metrics import chord_match, note_grid
    from spemusic.tokens.chords import parse_chords

    model, tok = load_model(args.pop_model)
    pop = DATA / "pop909"
    annotated = tok.config.chords  # pop-piano v2: bars from the beat annotations, chord tokens
    cache = open_dataset(pop, tok.config, beats_dir=pop / "beats" if annotated else None,
                         chords_dir=pop / "chords" if annotated else None)
    valid = [np.asarray(s) for s in cache.sequences("valid")]
    real = [cut_to_bars(s, tok, args.length) for s in valid]
    t0 = time.perf_counter()
    generated = []
    for b in range(0, args.pieces, args.batch):
        generated += sample(model, tok, num=min(args.batch, args.pieces - b), length=args.length, seed=args.seed + 1000 + b,
                            options=opts).ids
    # continuations of 4-bar prompts (the valid songs' first four bars), each by one piece
    prompts = [s[: np.flatnonzero(s == tok.bar_id)[4]] for s in valid if np.count_nonzero(s == tok.bar_id) > 5]
    prompts = (prompts * 2)[: args.pieces]
    continued = []
    for i, p in enumerate(prompts):
        out = sample(model, tok, num=1, length=max(args.length - len(p), 128), prompt=p, seed=args.seed + 2000 + i,
                     options=opts).ids[0]
        continued.append(drop_bars(out, tok, 4))
    empty = sum(c is None for c in continued)
    if empty:
        print(f"{empty} of {len(continued)} continuations wrote no new bar (left out below)")
        continued = [c for c in continued if c is not None]
    wall = time.perf_counter() - t0
    gen_rows, cont_rows = piece_metrics(generated, tok), piece_metrics(continued, tok)
    gen_m, cont_m, real_m = mean_of(gen_rows), mean_of(cont_rows), mean_metrics(real, tok)
    print(f"pop-piano ({args.pop_model}): {len(generated)} pieces of {args.length} tokens from scratch and "
          f"{len(continued)} continuations of 4-bar prompts (POP909 valid) up to {args.length} tokens "
          f"({wall:.0f} s), top-p {opts.top_p}, bar top-p {opts.bar_top_p}, onset top-p {opts.onset_top_p}, "
          f"hole penalty {opts.hole_penalty}, stacking {opts.stacking}, follow repeats {opts.follow_repeats}, "
          f"temperature {opts.temperature}, repeat {opts.repeat}; "
          f"real: {len(real)} POP909 valid "
          f"songs{' re-barred by their beat annotations' if annotated else ''}, first {args.length} tokens")
    print_table("\nfrom scratch", {"generated": gen_m, "real": real_m})
    print_table("\ncontinuations (new bars only)", {"continued": cont_m, "real": real_m})
    print()
    print_spread("from scratch,", gen_rows)
    print_spread("continued,", cont_rows)
    # tracks: what a DAW shows (overlapping same-pitch notes end the earlier one)
    tracks = [len(tok.decode(s).instruments) for s in generated + continued]
    print(f"\ntracks per generated file: {np.mean(tracks):.2f} (max {max(tracks)})")
    if tok.config.parts:
        part_means = parts(generated, continued, real, tok)
        files = sorted(pop / e["path"] for e in cache.files("valid"))
        from spemusic.music.harmony import chart_melody, melody_chords

        chart = (lambda ids: chart_melody(model, ids, tok)) if model.harmony_file else None
        named = (lambda ids: melody_chords(model, ids, tok, harmonize=False)) if model.harmony_file else None
        accompanied = accompany_check(model, tok, files[: args.pieces], opts, args.seed, chart=chart, named=named)
    result = {"model": str(args.pop_model), "generated": gen_m, "continued": cont_m, "real": real_m,
              "tracks_max": int(max(tracks)), "top_p": opts.top_p, "bar_top_p": opts.bar_top_p, "temperature": opts.temperature,
              "onset_top_p": opts.onset_top_p, "repeat": opts.repeat, "hole_penalty": opts.hole_penalty,
              "stacking": opts.stacking, "follow_repeats": opts.follow_repeats,
              "per_piece": {"generated": gen_rows, "continued": cont_rows}}
    if tok.config.parts:
        result["parts"], result["accompany"] = part_means, accompanied
    if annotated:
        hits = counted = 0
        for s in real:
            h, c = chord_match(note_grid(s, tok))
            hits, counted = hits + h, counted + c
        progression = parse_chords(args.chords)
        print(f"chords: real songs against their annotations (bars with one chord): the annotated chord is the "
              f"best template match of the bar in {hits / counted:.3f} of {counted} bars")
        result["chords"] = {"progression": args.chords, "real_match": hits / counted, "real_bars": counted}
        for strength in (0.0, CHORD_STRENGTH):
            forced = []
            for b in range(0, args.pieces, args.batch):
                forced += sample(model, tok, num=min(args.batch, args.pieces - b), length=args.length, seed=args.seed + 3000 + b,
                                 options=opts, chords=progression, chord_strength=strength).ids
            fh = fc = 0
            for s in forced:
                g = note_grid(s, tok)
                h, c = chord_match(g, [progression[b % len(progression)] for b in range(g.n_bars)])
                fh, fc = fh + h, fc + c
            fm = mean_metrics(forced, tok)
            met = "met" if fh / fc >= 0.8 else "MISSED"
            print(f"  --chords '{args.chords}' --chord-strength {strength:g}: the asked chord is the best match in "
                  f"{fh / fc:.3f} of {fc} bars (goal >= 0.8, {met}); notes/bar {fm['notes_per_bar']:.2f}, notes/onset "
                  f"{fm['polyphony']:.2f}, silence {fm['silence']:.3f}, H1 {fm['H1']:.2f}, repetition {fm['repetition']:.3f}")
            result["chords"][f"strength_{strength:g}"] = {"forced_match": fh / fc, "forced_bars": fc, "metrics": fm}
    return result


def groove(args, opts) -> dict:
    from spemusic.music.metrics import backbeat_bars, backbeat_share, backbone_similarity, drum_onsets_per_bar, note_grid

    def backbeat_kept(ids) -> float:
        """The share of the bars after the 2-bar prompt with a snare on beats 2 and 4 (nan: none in 4/4)."""
        after = [v for b, v in backbeat_bars(note_grid(ids, tok)).items() if b >= 2]
        return float(np.mean(after)) if after else float("nan")

    model, tok = load_model(args.groove_model)
    cache = open_dataset(DATA / "groove", tok.config)
    sources = [np.asarray(s) for s in cache.sequences("valid") if np.count_nonzero(np.asarray(s) == tok.bar_id) >= 4]
    sources = sources[:: max(1, len(sources) // args.prompts)][: args.prompts]
    sims, real, backbone = [], [], []
    kept, kept_real = [], []  # prompts on a backbeat in both bars: the share of later bars that keep it
    whole, whole_real = [], []  # the same against the whole source piece
    empty = new_bars = 0  # the continuations' new bars without a note
    t0 = time.perf_counter()
    for i, src in enumerate(sources):
        bars = np.flatnonzero(src == tok.bar_id)
        prompt = src[: bars[2]]  # the first two bars
        outs = sample(model, tok, num=args.per_prompt, bars=args.bars, prompt=prompt, seed=i, options=opts).ids
        for out in outs:
            g = note_grid(out, tok)
            notes = np.bincount(g.bar, minlength=g.n_bars)[2:]  # per new bar
            empty += int(np.count_nonzero(notes == 0))
            new_bars += len(notes)
        # one row per prompt: the mean over its continuations
        sims.append(np.nanmean([continuation_similarity(src, out, tok, 2, reference_bars=2) for out in outs], axis=0))
        whole.append(np.nanmean([continuation_similarity(src, out, tok, 2) for out in outs], axis=0))
        if len(bars) > 2 + args.bars:  # the piece's own next bars, as a reference
            own = src[: bars[2 + args.bars]]
            real.append(continuation_similarity(src, own, tok, 2, reference_bars=2))
            whole_real.append(continuation_similarity(src, own, tok, 2))
            # kick and snare: does a continuation keep the prompt's places as well as the piece does?
            bar = backbone_similarity(src, own, tok, prompt_bars=2)
            if np.isfinite(bar):
                backbone += [np.nan_to_num(backbone_similarity(src, out, tok, prompt_bars=2)) >= bar for out in outs]
            opening = backbeat_bars(note_grid(prompt, tok))
            if len(opening) == 2 and all(opening.values()):
                kept.append(np.nanmean([backbeat_kept(out) for out in outs]))
                kept_real.append(backbeat_kept(own))
    sims, real = np.array(sims), np.array(real)
    q, qr = np.nanmean(sims, axis=0), np.nanmean(real, axis=0)
    # bootstrap over prompts: each quarter's mean and the last/first ratio, with their 90% intervals
    rng = np.random.default_rng(0)
    draws = [sims[rng.integers(0, len(sims), len(sims))] for _ in range(2000)]
    q_lo, q_hi = np.percentile([np.nanmean(d, axis=0) for d in draws], [5, 95], axis=0)
    lo, hi = np.percentile([np.nanmean(d[:, 3]) / np.nanmean(d[:, 0]) for d in draws], [5, 95])
    print(f"\ngroove ({args.groove_model}): {args.per_prompt} continuations of {args.bars} bars after each of "
          f"{len(sources)} 2-bar prompts (Groove valid), {time.perf_counter() - t0:.0f} s, top-p {opts.top_p}, "
          f"bar top-p {opts.bar_top_p}")
    print("style similarity to the prompt, per quarter (90% bootstrap interval over prompts), against the real next "
          "bars of the pieces long enough")
    ok = [q[i] >= 0.8 * qr[i] for i in range(4)]
    for i in range(4):
        print(f"  Q{i + 1}  {q[i]:.3f} ({q_lo[i]:.3f}-{q_hi[i]:.3f})   real {qr[i]:.3f}   ratio {q[i] / qr[i]:.2f}   "
              f"goal >= 0.8  {'met' if ok[i] else 'MISSED'}")
    print(f"  last/first {q[3] / q[0]:.2f} (90% interval {lo:.2f}-{hi:.2f}; goal >= 0.9, "
          f"{'met' if q[3] / q[0] >= 0.9 else 'MISSED'})")
    w, wr = np.nanmean(whole, axis=0), np.nanmean(whole_real, axis=0)
    print("  against the whole source piece (which holds the real next bars themselves): "
          + "  ".join(f"Q{i + 1} {w[i]:.3f}/{wr[i]:.3f}" for i in range(4)))
    share = float(np.mean(backbone)) if backbone else float("nan")
    print(f"kick and snare: {share:.3f} of {len(backbone)} continuations keep the prompt's places (16ths) at least as "
          "well as the piece's own next bars")
    print(f"backbeat: after the {len(kept)} prompts with a snare on beats 2 and 4 in both bars, "
          f"{np.nanmean(kept) if kept else float('nan'):.3f} of the continuations' bars keep it; the pieces' own next bars "
          f"{np.nanmean(kept_real) if kept_real else float('nan'):.3f}")
    print(f"empty bars: {empty} of the continuations' {new_bars} new bars have no note (goal 0, "
          f"{'met' if empty == 0 else 'MISSED'})")
    scratch = sample(model, tok, num=args.scratch, bars=8, seed=10_000 + args.seed, options=opts).ids
    gen_grids, real_grids = [note_grid(s, tok) for s in scratch], [note_grid(s, tok) for s in sources]
    print(f"from scratch ({args.scratch} pieces of 8 bars) against the {len(sources)} valid pieces:")
    scratch_rows = {}
    for name, fn in (("bars with a snare on beats 2 and 4", backbeat_share), ("drum onsets per bar", drum_onsets_per_bar)):
        g, r = np.nanmean([fn(x) for x in gen_grids]), np.nanmean([fn(x) for x in real_grids])
        scratch_rows[name] = [float(g), float(r)]
        print(f"  {name:<36}{g:>8.3f}{r:>8.3f}   ratio {g / r:.2f}   goal 1 ± 0.15  "
              f"{'met' if abs(g / r - 1) <= 0.15 else 'MISSED'}")
    return {"model": str(args.groove_model), "quarters": q.tolist(), "quarters_90": [q_lo.tolist(), q_hi.tolist()],
            "ratio": float(q[3] / q[0]), "ratio_90": [float(lo), float(hi)], "real_quarters": qr.tolist(),
            "whole_source_quarters": w.tolist(), "whole_source_real_quarters": wr.tolist(),
            "backbone_share": share, "empty_bars": [empty, new_bars], "backbeat_kept": [float(np.nanmean(kept)) if kept else None,
                                                       float(np.nanmean(kept_real)) if kept_real else None],
            "from_scratch": scratch_rows, "per_prompt": sims.tolist()}


if __name__ == "__main__":
    run_script(main)
