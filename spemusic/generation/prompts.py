"""Prompts and MIDI output: reading a MIDI prompt into tokens, merging a continuation back into the
prompt's own MIDI, output paths, and bar counts (spemusic.generation.pieces generates and continues)."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import miditoolkit
import numpy as np

from ..errors import MidiError, OptionError, SpemusicError
from ..files import check_input_file, check_output_file, check_output_folder, names_new_folder
from ..tokens.grammar import REMIGrammar
from ..tokens.tokenizer import REMITokenizer, part_of_track, read_midi
from ..words import count


def output_paths(out: str | Path, num: int, overwrite: bool) -> list[Path]:
    """OUT.mid for one piece; OUT-1.mid … OUT-K.mid for K (or piece-i.mid inside a folder: an
    existing one, or OUT/ with a trailing slash, which the writer creates: nothing is made before
    the work succeeds). Refuses, before any sampling, outputs that exist (without --overwrite) or
    cannot be written."""
    new_folder = names_new_folder(out)
    out = Path(out)
    if not (new_folder or out.is_dir()) and out.suffix and out.suffix.lower() not in (".mid", ".midi"):
        raise SpemusicError(f"-o {out}: a MIDI file is written; name it .mid (or give a folder)")
    if new_folder or out.is_dir():
        paths = [out / f"piece-{i + 1}.mid" for i in range(num)] if num > 1 else [out / "piece.mid"]
    elif num > 1:
        paths = [out.with_name(f"{out.stem}-{i + 1}{out.suffix or '.mid'}") for i in range(num)]
    else:
        paths = [out if out.suffix else out.with_suffix(".mid")]
    if new_folder:
        check_output_folder(out)  # its files cannot exist yet
        return paths
    for p in paths:
        check_output_file(p, overwrite)
    return paths


def midi_bytes(midi: miditoolkit.MidiFile) -> bytes:
    buf = io.BytesIO()
    midi.dump(file=buf)
    return buf.getvalue()


def midi_stats(midi: miditoolkit.MidiFile) -> tuple[int, float]:
    """(notes, seconds until the last note ends)."""
    notes = sum(len(i.notes) for i in midi.instruments)
    end = max((n.end for i in midi.instruments for n in i.notes), default=0)
    return notes, tick_seconds(midi, end)


def tick_seconds(midi: miditoolkit.MidiFile, tick: int) -> float:
    """The time of a tick through the tempo map, tempo change by tempo change (miditoolkit's
    get_tick_to_time_mapping builds an array of every tick: 2 GB for a note 2^28 ticks long)."""
    seconds, last_tick, bpm = 0.0, 0, 120.0
    for tc in sorted(midi.tempo_changes, key=lambda tc: tc.time):
        if tc.time >= tick:
            break
        seconds += (tc.time - last_tick) * 60.0 / (bpm * midi.ticks_per_beat)
        last_tick, bpm = tc.time, tc.tempo
    return seconds + (tick - last_tick) * 60.0 / (bpm * midi.ticks_per_beat)


def count_bars(ids: np.ndarray, tokenizer: REMITokenizer) -> int:
    return int(np.count_nonzero(np.asarray(ids) == tokenizer.bar_id))


def bar_start_beats(ids: np.ndarray, tokenizer: REMITokenizer) -> list[float]:
    """Start of every bar of a token sequence, in quarter notes from the start."""
    grammar = REMIGrammar(tokenizer)
    res = tokenizer.config.beat_resolution
    starts, t, bar_steps, ts_lo, ts_hi = [], 0.0, 4 * res, *tokenizer.range("TimeSig")
    for i, tok in enumerate(ids):
        tok = int(tok)
        if tok == tokenizer.bar_id:
            if starts:
                t += bar_steps / res
            starts.append(t)
            ts = _next_timesig(ids, i, ts_lo, ts_hi)
            if ts is not None:
                bar_steps = grammar.bar_steps[ts]
    return starts


def _next_timesig(ids, i, ts_lo, ts_hi):
    if i + 1 < len(ids) and ts_lo <= int(ids[i + 1]) < ts_hi:
        return int(ids[i + 1])
    return None


# ----------------------------------------------------------------------------- prompts

def annotated_meters(ids: np.ndarray, tokenizer: REMITokenizer, beat_map) -> list[miditoolkit.TimeSignature]:
    """The time signatures of a file's annotated bars (its tokens read on a beat annotation), at
    the file's ticks of their downbeats."""
    starts = bar_start_beats(ids, tokenizer)
    lo, hi = tokenizer.range("TimeSig")
    bar, out = -1, []
    for t in ids:
        if t == tokenizer.bar_id:
            bar += 1
        elif lo <= t < hi:
            n, d = tokenizer.time_signatures[int(t) - lo]
            out.append(miditoolkit.TimeSignature(n, d, int(round(float(beat_map.tick_of(starts[bar]))))))
    return out


@dataclass
class Prompt:
    midi: miditoolkit.MidiFile      # the user's file, cut to the prompt bars, otherwise untouched
    ids: np.ndarray                 # its tokens, BOS … last note (no EOS)
    end_beats: float                # where the continuation starts, in the tokens' beats
    only_drums: bool
    caveats: list[str] = field(default_factory=list)  # what the model reads differently from the file
    end_tick: int | None = None     # where it starts in the file's ticks (None: end_beats quarter notes)
    end_qpm: float | None = None    # with beats: the tempo of the prompt's last beat, kept by the new bars
    warnings: list[str] = field(default_factory=list)  # what makes the model read the prompt badly

    @property
    def cut_tick(self) -> int:
        return self.end_tick if self.end_tick is not None else round(self.end_beats * self.midi.ticks_per_beat)


# The longest prompt continue and play read: a few times the longest POP909 song. Priming is flat
# in memory (Performer.prime, a chunk at a time) but not in time: a prompt of hundreds of
# thousands of tokens takes minutes (docs/measurements.md).
MAX_PROMPT_TOKENS = 65_536


def load_prompt(path: Path, tokenizer: REMITokenizer, prompt_bars: int | None = None, beats: Path | None = None,
                from_bar: int | None = None) -> Prompt:
    """The prompt of `continue`. With `beats` (a beat annotation of the file), its bars are the
    annotated ones and the new bars start on the beat grid where the last annotated bar ends.
    `prompt_bars`: the first N bars of music (leading empty bars not counted); `from_bar`: the
    file's bars 1 to N, as a score editor numbers them."""
    path = check_input_file(path)  # a named pipe would block the read forever
    beat_map = None
    if beats is not None:
        check_input_file(beats)
        ids, beat_map = tokenizer.encode_on_beats(path, beats)
    else:
        ids = tokenizer.encode(path)  # raises MidiError with the reason for corrupt/empty/note-less files
    score, warnings = read_midi(path)  # what tokenize skips or clips, continue skips or clips and says
    midi = _prompt_midi(path, score, warnings)
    ids = ids[:-1] if ids[-1] == tokenizer.eos_id else ids
    bar_idx = np.flatnonzero(ids == tokenizer.bar_id)
    starts = bar_start_beats(ids, tokenizer)
    caveats = []
    if from_bar is not None:
        if prompt_bars is not None:
            raise OptionError("{from_bar} and {prompt_bars}: give one")
        if not 1 <= from_bar <= len(bar_idx):
            raise OptionError("{from_bar} {n}: {path} has bars 1 to {bars}", n=from_bar, path=str(path), bars=len(bar_idx))
        lo, hi = tokenizer.range("Pitch")
        head = ids[: bar_idx[from_bar]] if from_bar < len(bar_idx) else ids
        if not ((head >= lo) & (head < hi)).any():
            first = int(np.searchsorted(bar_idx, np.flatnonzero((ids >= lo) & (ids < hi))[0], side="right"))
            raise OptionError("{from_bar} {n}: bars 1-{n} of {path} hold no note (the first is in bar {first})",
                              n=from_bar, path=str(path), first=first)
        prompt_bars = from_bar
    elif prompt_bars is not None:
        if prompt_bars < 1:
            raise OptionError("{prompt_bars} must be at least 1 (got {value})", value=prompt_bars)
        # leading empty bars (a silent intro, a pickup of rests) do not count: the prompt is the
        # first N bars of music
        lo, hi = tokenizer.range("Pitch")
        first_note = int(np.flatnonzero((ids >= lo) & (ids < hi))[0])
        skipped = int(np.searchsorted(bar_idx, first_note, side="right")) - 1
        if prompt_bars > len(bar_idx) - skipped:
            raise OptionError("{path}: the prompt has {bars} from its first note (bar {first}); {prompt_bars} "
                              "asks for {n}", path=str(path), bars=count(len(bar_idx) - skipped, "bar"), first=skipped + 1,
                              n=prompt_bars)
        if skipped:
            first = "its first bar holds" if skipped == 1 else f"its first {skipped} bars hold"
            caveats.append(f"{first} no note: --prompt-bars {prompt_bars} "
                           f"takes bars {skipped + 1}-{skipped + prompt_bars}")
        prompt_bars += skipped
    if prompt_bars is not None and prompt_bars < len(bar_idx):
        ids = ids[: bar_idx[prompt_bars]]
        end_beats = starts[prompt_bars]
    else:
        # the last bar runs to its end: its length follows the time signature in force
        bars = bar_start_beats(np.concatenate([ids, [tokenizer.bar_id]]), tokenizer)
        end_beats = bars[-1]
    if len(ids) > MAX_PROMPT_TOKENS:  # priming is flat in memory, but its time grows with the prompt
        n = count_bars(ids, tokenizer)
        raise OptionError("{path}: the prompt is {tokens:,} tokens ({n:,} bar{s}); a prompt may hold at most {most:,}: "
                          "take fewer bars with {prompt_bars} or {from_bar}", path=str(path), tokens=len(ids), n=n,
                          s="s" * (n != 1), most=MAX_PROMPT_TOKENS)
    end_tick = end_qpm = None
    if beat_map is not None:
        # beat_map ticks are the file's as symusic reads them; miditoolkit reads the same ticks
        end_tick = int(round(float(beat_map.tick_of(end_beats))))
        qpm = beat_map.qpm_per_beat()
        end_qpm = float(qpm[min(int(np.ceil(end_beats)) - 1, len(qpm) - 1)])
    prompt = Prompt(midi, np.asarray(ids, dtype=np.int64), end_beats, False, [], end_tick, end_qpm, warnings)
    _clip_midi(midi, prompt.cut_tick)
    if beat_map is not None:  # the annotated bars, so that the whole file opens in them (not POP909's 1/4)
        midi.time_signature_changes = annotated_meters(prompt.ids, tokenizer, beat_map)
    if not any(i.notes for i in midi.instruments):
        raise MidiError(f"{path}: no notes in the prompt")
    prompt.only_drums = all(i.is_drum for i in midi.instruments if i.notes)
    prompt.caveats = caveats + ([] if beat_map is not None else _outside_vocabulary(midi, tokenizer))
    if beat_map is None and _one_beat_bars(prompt.ids, tokenizer):
        prompt.warnings.append("most of its bars are one beat long (1/4), as in POP909's files, so the model reads "
                               "no real bars; give its beat annotation with --beats FILE")
    return prompt


def _prompt_midi(path: Path, score, warnings: list[str]) -> miditoolkit.MidiFile:
    """The prompt file as miditoolkit reads it (its events go into the output as they are), or,
    where the reader policy skipped or clipped something (which miditoolkit refuses: a tempo of
    0, a data byte of 200) or miditoolkit fails, the file as the policy read it."""
    if not warnings:
        try:
            return miditoolkit.MidiFile(str(path))
        except Exception:  # noqa: BLE001 - mido's own limits (65,535 empty tracks): read it as tokenize does
            pass
    try:
        return miditoolkit.MidiFile(file=io.BytesIO(score.dumps_midi()))
    except Exception as e:  # noqa: BLE001
        raise MidiError(f"{path}: cannot read MIDI ({str(e).splitlines()[0][:100]})") from None


def _one_beat_bars(ids: np.ndarray, tokenizer: REMITokenizer) -> bool:
    """True when most bars of a pitched prompt are 1/4 (a file whose meter is not its music's)."""
    starts = bar_start_beats(ids, tokenizer)
    if len(starts) < 4:
        return False
    lengths = np.diff(starts)
    return bool(np.mean(lengths == 1.0) > 0.5)


def _outside_vocabulary(midi: miditoolkit.MidiFile, tokenizer: REMITokenizer) -> list[str]:
    """Meters and tempi of the prompt that the tokens can only approximate: the file keeps them,
    but the model continues from the approximation."""
    caveats = []
    for ts in {(t.numerator, t.denominator) for t in midi.time_signature_changes}:
        if ts not in tokenizer.time_signatures:
            n, d = tokenizer.time_signatures[tokenizer.map_time_signature(*ts)]
            caveats.append(f"time signature {ts[0]}/{ts[1]} is outside the vocabulary: the model reads its bars as {n}/{d}")
    cfg = tokenizer.config
    tempi = [t.tempo for t in midi.tempo_changes if not cfg.tempo_min <= t.tempo <= cfg.tempo_max]
    if tempi:
        caveats.append(f"tempo {tempi[0]:.0f} BPM is outside {cfg.tempo_min:.0f}-{cfg.tempo_max:.0f}: the model reads "
                       "the nearest")
    return caveats


SUSTAIN = 64  # the sustain pedal's controller number


def _clip_midi(midi: miditoolkit.MidiFile, cut: int) -> None:
    """Keep what starts before tick ``cut`` (notes, controllers, pitch bends, tempo, meter, keys,
    markers, lyrics): the continuation follows from there. A sustain pedal still down at the cut
    is released there, so it does not hold the continuation's notes."""
    for inst in midi.instruments:
        inst.notes = [n for n in inst.notes if n.start < cut]
        inst.control_changes = [c for c in inst.control_changes if c.time < cut]
        inst.pitch_bends = [b for b in inst.pitch_bends if b.time < cut]
        pedal = [c for c in inst.control_changes if c.number == SUSTAIN]
        if pedal and pedal[-1].value >= 64:
            inst.control_changes.append(miditoolkit.ControlChange(SUSTAIN, 0, cut))
        # miditoolkit also keeps the pedal as (start, end) spans, written when there are no controllers
        inst.pedals = [p for p in inst.pedals if p.start < cut]
        for p in inst.pedals:
            p.end = min(p.end, cut)
    midi.instruments = [i for i in midi.instruments if i.notes]
    midi.tempo_changes = [t for t in midi.tempo_changes if t.time < cut] or midi.tempo_changes[:1]
    midi.time_signature_changes = [t for t in midi.time_signature_changes if t.time < cut] or midi.time_signature_changes[:1]
    midi.key_signature_changes = [k for k in midi.key_signature_changes if k.time < cut]
    midi.markers = [m for m in midi.markers if m.time < cut]
    midi.lyrics = [m for m in midi.lyrics if m.time < cut]
    midi.max_tick = max([cut] + [n.end for i in midi.instruments for n in i.notes])


def merge_continuation(prompt: Prompt, ids: np.ndarray, tokenizer: REMITokenizer,
                       only_continuation: bool = False, overlaps: str = "trim") -> miditoolkit.MidiFile:
    """The prompt's own notes (its ticks, velocities, instruments) followed by the continuation's
    notes, tempo and time-signature changes, converted to the prompt's resolution."""
    import copy

    decoded = tokenizer.decode(ids, overlaps)
    scale = prompt.midi.ticks_per_beat / decoded.ticks_per_beat
    start_dec = prompt.end_beats * decoded.ticks_per_beat
    cut = prompt.cut_tick
    shift = cut if only_continuation else 0

    def conv(t: int) -> int:  # decoded ticks (from the continuation's start) -> output ticks
        return cut + round((t - start_dec) * scale) - shift

    if only_continuation:
        out = miditoolkit.MidiFile(ticks_per_beat=prompt.midi.ticks_per_beat)
        last_tempo = [t for t in decoded.tempo_changes if t.time <= start_dec][-1:]
        last_ts = [t for t in decoded.time_signature_changes if t.time <= start_dec][-1:]
        out.tempo_changes = [miditoolkit.TempoChange(t.tempo, 0) for t in last_tempo]
        out.time_signature_changes = [miditoolkit.TimeSignature(t.numerator, t.denominator, 0) for t in last_ts]
    else:
        out = copy.deepcopy(prompt.midi)
    if prompt.end_qpm is not None:  # on annotated beats: the new bars keep the prompt's last beat's tempo
        if only_continuation:
            out.tempo_changes = [miditoolkit.TempoChange(prompt.end_qpm, 0)]
        else:
            out.tempo_changes = [t for t in out.tempo_changes if t.time < cut]
            out.tempo_changes.append(miditoolkit.TempoChange(prompt.end_qpm, cut))
    for t in decoded.tempo_changes:
        if t.time >= start_dec and (not out.tempo_changes or abs(out.tempo_changes[-1].tempo - t.tempo) > 1e-6):
            out.tempo_changes.append(miditoolkit.TempoChange(t.tempo, conv(t.time)))
    # the meter in force where the new bars begin, then the later changes: a prompt meter outside
    # the vocabulary (9/4, read as 8/4) must not stay marked over bars of another length
    at_start = [t for t in decoded.time_signature_changes if t.time <= start_dec][-1:]
    later = [t for t in decoded.time_signature_changes if t.time > start_dec]
    for ts, time in [(t, start_dec) for t in at_start] + [(t, t.time) for t in later]:
        last = out.time_signature_changes[-1] if out.time_signature_changes else None
        if last is None or (last.numerator, last.denominator) != (ts.numerator, ts.denominator):
            out.time_signature_changes.append(miditoolkit.TimeSignature(ts.numerator, ts.denominator, conv(time)))
    for inst in decoded.instruments:
        notes = [n for n in inst.notes if n.start >= start_dec]
        if not notes:
            continue
        # a part continues on the prompt's track of that part; an instrument on the prompt's track
        # of that program with the most notes (the accompaniment, if parts were merged)
        part = part_of_track(inst.name)
        if part is not None:
            same = [i for i in out.instruments if part_of_track(i.name) == part]
        else:
            same = [i for i in out.instruments
                    if i.is_drum == inst.is_drum and (inst.is_drum or i.program == inst.program)]
        target = max(same, key=lambda i: len(i.notes), default=None)
        if target is None:
            target = miditoolkit.Instrument(program=inst.program, is_drum=inst.is_drum, name=inst.name)
            out.instruments.append(target)
        for n in notes:
            target.notes.append(miditoolkit.Note(n.velocity, n.pitch, conv(n.start), max(conv(n.end), conv(n.start) + 1)))
        target.notes.sort(key=lambda n: (n.start, n.pitch))
    for m in decoded.markers:  # the new bars' chords
        if m.time >= start_dec:
            out.markers.append(miditoolkit.Marker(m.text, conv(m.time)))
    if not only_continuation:  # where the new bars begin, for score editors, DAWs and `spemusic show`
        from ..music.pianoroll import CONTINUATION_MARKER

        out.markers.append(miditoolkit.Marker(CONTINUATION_MARKER, cut))
    out.markers.sort(key=lambda m: m.time)
    out.max_tick = max((n.end for i in out.instruments for n in i.notes), default=0)
    return out
