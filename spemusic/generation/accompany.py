"""Accompany a melody: the user's melody held fixed, token by token, while the model writes the
bridge and the piano part around it (`spemusic accompany`).

Holding the melody is a rule of the sampler, not a second model; the model never writes a melody
note of its own. With a melody_first tokenizer (each bar's melody, then the other parts) the
melody's tokens of each bar are forced right after its Bar, and the model writes the rest of the
bar having seen all of them (`MelodyBlocks`). With parts in one stream in time order, at each bar
line the melody's time signature is forced; wherever the model chooses its next onset, it may not
pass the melody's next one, and when it reaches it, the melody's Tempo and notes are forced there
(the model may open a Chord first) (`HeldMelody`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import symusic

from ..errors import MidiError, OptionError
from ..files import check_input_file
from ..tokens.grammar import BAR, NOTE_END, POSITION, TIMESIG, GrammarState, REMIGrammar
from ..tokens.tokenizer import CHORD, PROGRAM, REPEAT, TEMPO, REMITokenizer, part_of_track, read_midi
from .prompts import annotated_meters


@dataclass
class MelodyBar:
    timesig: int | None                      # the TimeSig token written at this bar, if any
    onsets: list[tuple[int, list[int]]]      # (position, tokens after its Position: [Tempo] notes)


@dataclass
class HeldMelody:
    """A melody's tokens by bar, and for each piece being sampled, where it stands in them."""

    bars: list[MelodyBar]
    tokenizer: REMITokenizer
    melody_id: int                           # Program_melody: the model never writes it
    first_tempo: int | None                  # the melody's opening Tempo token
    due: dict[int, list[int]] = field(default_factory=dict)  # piece -> tokens still to force at this onset

    @classmethod
    def of(cls, ids: np.ndarray, tokenizer: REMITokenizer) -> HeldMelody:
        kinds = tokenizer.kinds

        bars: list[MelodyBar] = []
        for t in np.asarray(ids).tolist():
            k = int(kinds[t])
            if t == tokenizer.bar_id:
                bars.append(MelodyBar(None, []))
            elif not bars or k == CHORD or t in (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id):
                continue
            elif k == TIMESIG:
                bars[-1].timesig = t
            elif k == POSITION:
                bars[-1].onsets.append((t - tokenizer.range("Position")[0], []))
            elif bars[-1].onsets:
                bars[-1].onsets[-1][1].append(t)
        for bar in bars:  # an onset that held only a chord change is no melody onset
            bar.onsets = [(p, toks) for p, toks in bar.onsets if any(kinds[t] == PROGRAM for t in toks)]
        tempos = [t for bar in bars for _, toks in bar.onsets for t in toks if kinds[t] == TEMPO]
        return cls(bars, tokenizer, tokenizer.part_id("melody"), tempos[0] if tempos else None)

    def _next_onset(self, st: GrammarState) -> int | None:
        """The melody's next onset in the current bar after position st.pos (None: none left)."""
        if not 1 <= st.bars <= len(self.bars):
            return None
        return next((p for p, _ in self.bars[st.bars - 1].onsets if p > st.pos), None)

    def restrict(self, piece: int, st: GrammarState, mask: np.ndarray) -> int | None:
        """Narrow `mask` (the tokens allowed next) to what keeps the melody as written; the token
        the piece must take next, if only one is left (the sampler takes it whatever its odds)."""
        tok = self.tokenizer
        mask[self.melody_id] = False
        tempo_lo, tempo_hi = tok.range("Tempo")
        due = self.due.get(piece)
        if due:
            chord_ok = mask.copy() if st.last == POSITION else None
            mask[:] = False
            mask[due[0]] = True
            if chord_ok is not None and tok.config.chords:  # a chord change may open the onset
                lo, hi = tok.range("Chord")
                mask[lo:hi] = chord_ok[lo:hi]
            return due[0] if mask.sum() == 1 else None
        if st.tempo >= 0:  # the melody's tempo map, not the model's
            mask[tempo_lo:tempo_hi] = False
        elif self.first_tempo is not None and mask[tempo_lo:tempo_hi].any():  # the model's onset opens the piece
            mask[tempo_lo:tempo_hi] = False
            mask[self.first_tempo] = True
        if st.last == BAR and 1 <= st.bars <= len(self.bars):
            ts = self.bars[st.bars - 1].timesig
            if ts is not None:  # (a meter the model never trained on too: the melody's is the piece's)
                mask[:] = False
                mask[ts] = True
                return ts
            mask[tok.range("TimeSig")[0]:tok.range("TimeSig")[1]] = False
        if st.last in (BAR, TIMESIG, NOTE_END) or mask[tok.bar_id]:
            nxt = self._next_onset(st)
            if nxt is not None:
                lo = tok.range("Position")[0]
                mask[lo + nxt + 1: tok.range("Position")[1]] = False
                mask[lo + nxt] = True  # the melody's onset, even at a place the model never trained on
                mask[tok.bar_id] = False
                mask[tok.eos_id] = False
        if not mask.any():  # (never: the grammar always allows the melody's own next onset)
            raise RuntimeError("accompany: no token keeps the melody")
        return None

    def advance(self, piece: int, st: GrammarState, token: int) -> None:
        """After `token` was taken (st already advanced): what the melody forces next."""
        due = self.due.get(piece)
        if due and token == due[0]:
            due.pop(0)
            return
        if due:  # a Chord before the melody's notes
            return
        if int(self.tokenizer.kinds[token]) == POSITION and 1 <= st.bars <= len(self.bars):
            here = dict(self.bars[st.bars - 1].onsets).get(st.pos)
            if here:
                tempo_lo, tempo_hi = self.tokenizer.range("Tempo")
                # a tempo already in force (the model's first onset came before the melody's) is not repeated
                toks = [t for t in here if not (tempo_lo <= t < tempo_hi and t == st.tempo)]
                if st.tempo < 0 and not any(tempo_lo <= t < tempo_hi for t in toks):
                    raise RuntimeError("accompany: the melody has no tempo at its first onset")
                self.due[piece] = list(toks)
        elif int(self.tokenizer.kinds[token]) == BAR:
            self.due.pop(piece, None)


@dataclass
class MelodyBlocks:
    """A melody held bar by bar in a melody_first stream: after each Bar, the melody's own bar
    header (TimeSig, Tempo), its Repeat mark and onsets are forced; the model then writes the
    other parts (after their own mark, with Repeat marks)."""

    bars: list[list[int]]                    # per bar, the tokens after its Bar (melody notes and header only)
    tokenizer: REMITokenizer
    melody_id: int
    due: dict[int, list[int]] = field(default_factory=dict)
    grammar: REMIGrammar = field(init=False)  # its end_melody: the other parts' sweep begins

    def __post_init__(self) -> None:
        self.grammar = REMIGrammar(self.tokenizer)

    @classmethod
    def of(cls, ids: np.ndarray, tokenizer: REMITokenizer) -> MelodyBlocks:
        kinds, melody = tokenizer.kinds, tokenizer.part_id("melody")
        bars: list[list[int]] = []
        onset: list[int] = []
        program = -1

        def close_onset() -> None:
            if any(t == melody for t in onset):
                bars[-1].extend(onset)
            onset.clear()

        for t in np.asarray(ids).tolist():
            k = int(kinds[t])
            if t == tokenizer.bar_id:
                if bars:
                    close_onset()
                bars.append([])
            elif not bars or t in (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id):
                continue
            elif k in (TIMESIG, TEMPO) and not onset:
                bars[-1].append(t)
            elif k == REPEAT:  # the melody's mark is held; the other parts' the model writes
                close_onset()
                if not any(kinds[x] == REPEAT for x in bars[-1]):
                    bars[-1].append(t)
            elif k == POSITION:
                close_onset()
                onset.append(t)
            elif k == PROGRAM:
                program = t
                if t == melody:
                    onset.append(t)
            elif k != CHORD and program == melody and onset:
                onset.append(t)
        if bars:
            close_onset()
        return cls(bars, tokenizer, melody)

    def restrict(self, piece: int, st: GrammarState, mask: np.ndarray) -> int | None:
        """Narrow `mask` to what keeps the melody as written; the token the piece must take next
        while the melody's tokens of the bar are being forced (the sampler takes it whatever its odds)."""
        due = self.due.get(piece)
        if due:
            mask[:] = False
            mask[due[0]] = True
            return due[0]
        tok = self.tokenizer
        mask[self.melody_id] = False
        self.grammar.without_melody(st, mask)  # (past the melody's bars: no melody onset of the model's)
        mask[tok.range("TimeSig")[0]:tok.range("TimeSig")[1]] = False  # the melody's meter and tempo map
        mask[tok.range("Tempo")[0]:tok.range("Tempo")[1]] = False
        if not mask.any():  # (never: a bar line or an accompaniment onset is always allowed)
            raise RuntimeError("accompany: no token keeps the melody")
        return None

    def advance(self, piece: int, st: GrammarState, token: int) -> None:
        """After `token` was taken: at a Bar, the melody's tokens of that bar are due; once they are
        written, the bar's other parts begin (where the model likes: --chords opens them on Position_0)."""
        due = self.due.get(piece)
        if due and token == due[0]:
            due.pop(0)
        elif token == self.tokenizer.bar_id and 1 <= st.bars <= len(self.bars):
            due = self.due[piece] = list(self.bars[st.bars - 1])
        else:
            return
        if not due:
            self.grammar.end_melody(st)


def hold_melody(ids: np.ndarray, tokenizer: REMITokenizer) -> HeldMelody | MelodyBlocks:
    """The sampler's rule that holds a melody (its tokens as the melody part), for this tokenizer's order."""
    return (MelodyBlocks if tokenizer.config.melody_first else HeldMelody).of(ids, tokenizer)


@dataclass
class Melody:
    """The melody `accompany` holds: the user's file with that track alone, and its tokens."""

    score: symusic.Score         # the user's file (its ticks, tempo map, meter, markers), the melody's track alone
    ids: np.ndarray              # its tokens as the melody part (BOS … EOS)
    bars: int
    beat_map: object | None      # spemusic.tokens.beats.BeatMap when read on a beat annotation
    track_name: str


def melody_track(score: symusic.Score, track: str | None, path: Path) -> int:
    """Which track holds the melody: `track` (a name or a 1-based number among the tracks with
    notes), else the one named MELODY, else the only track with notes."""
    tracks = [i for i, t in enumerate(score.tracks) if len(t.notes) and not t.is_drum]
    listing = ", ".join(f"{n + 1}: {score.tracks[i].name or '(no name)'}" for n, i in enumerate(tracks)) or "none"
    if track is not None:
        if track.isdigit() and 1 <= int(track) <= len(tracks):
            return tracks[int(track) - 1]
        named = [i for i in tracks if score.tracks[i].name.strip().lower() == track.strip().lower()]
        if named:
            return named[0]
        raise OptionError("{track} {value}: {path} has no such track with notes (its tracks: {listing})",
                          value=track, path=str(path), listing=listing)
    named = [i for i in tracks if part_of_track(score.tracks[i].name) == "melody"]
    if named:
        return named[0]
    if len(tracks) == 1:
        return tracks[0]
    if not tracks:
        raise MidiError(f"{path}: no pitched notes to accompany")
    raise OptionError("{path}: {n} tracks have notes and none is named MELODY; choose the melody with {track} "
                      "(its tracks: {listing})", path=str(path), n=len(tracks), listing=listing)


def load_melody(path: Path, tokenizer: REMITokenizer, track: str | None = None, beats: Path | None = None) -> Melody:
    """The melody of a MIDI file, as `accompany` holds it (see melody_track)."""
    if not tokenizer.config.parts:
        raise OptionError("this model has no parts (melody, bridge, piano): accompany needs one that has, such as "
                          "pop-piano")
    path = check_input_file(path)
    score, _ = read_midi(path)  # corrupt, empty or note-less files: one line naming the problem
    index = melody_track(score, track, path)
    solo = score.copy()
    kept = score.tracks[index].copy()
    while len(solo.tracks):
        solo.tracks.pop()
    solo.tracks.append(kept)
    as_part = solo.copy()  # the tokenizer reads the track as the melody part, whatever its name
    as_part.tracks[0].name = "MELODY"
    beat_map = None
    if beats is not None:
        ids, beat_map = tokenizer.encode_on_beats(as_part, _beats_of_melody(beats, as_part))
    else:
        ids = tokenizer.encode(as_part)
    bars = int(np.count_nonzero(ids == tokenizer.bar_id))
    return Melody(solo, ids, bars, beat_map, kept.name)


def _beats_of_melody(path: Path, melody: symusic.Score):
    """A song's beat annotation up to where its melody ends (and one beat more): the song may go
    on past its melody, and accompany writes the melody's bars."""
    from ..tokens.beats import Beats, read_beats

    check_input_file(path)
    beats = read_beats(path)
    notes = melody.to("second").tracks[0].notes.numpy()
    end = float((notes["time"] + notes["duration"]).max())
    keep = min(int(np.searchsorted(beats.times, end + 1.0, side="right")) + 1, len(beats.times))
    return Beats(beats.times[:keep], beats.downbeat[:keep], beats.source)


def with_accompaniment(melody: Melody, ids: np.ndarray, tokenizer: REMITokenizer, overlaps: str = "trim",
                       ) -> symusic.Score:
    """The user's melody track exactly as it was, and the parts the model wrote (every part but
    the melody) on the melody file's own timeline, with the new chords as markers; on annotated
    beats, the time signatures of the annotated bars."""
    decoded = tokenizer.decode_to_score(ids, overlaps)
    out = melody.score.copy()
    res = tokenizer.ticks_per_beat_out

    if melody.beat_map is not None:  # the tokens' beats are the annotation's beats
        def conv(t: np.ndarray) -> np.ndarray:
            return np.rint(melody.beat_map.tick_of(t / res)).astype(np.int64)
    else:
        def conv(t: np.ndarray) -> np.ndarray:
            return np.rint(t * (out.ticks_per_quarter / res)).astype(np.int64)

    for tr in decoded.tracks:
        if part_of_track(tr.name) == "melody" or not len(tr.notes):
            continue
        a = tr.notes.numpy()
        start, end = conv(a["time"]), conv(a["time"] + a["duration"])
        new = symusic.Track(name=tr.name, program=tr.program, is_drum=tr.is_drum)
        new.notes = symusic.Note.from_numpy(start.astype(np.int32), np.maximum(end - start, 1).astype(np.int32),
                                            a["pitch"], a["velocity"], ttype="tick")
        out.tracks.append(new)
    for m in decoded.markers:
        out.markers.append(symusic.TextMeta(int(conv(np.array([m.time]))[0]), m.text))
    out.markers.sort()
    if melody.beat_map is not None:  # the annotated bars, not the file's own meter (POP909's say 1/4)
        while len(out.time_signatures):
            out.time_signatures.pop()
        for ts in annotated_meters(ids, tokenizer, melody.beat_map):
            out.time_signatures.append(symusic.TimeSignature(ts.time, ts.numerator, ts.denominator))
    return out


__all__ = ["HeldMelody", "Melody", "MelodyBlocks", "hold_melody", "load_melody", "melody_track", "with_accompaniment"]
