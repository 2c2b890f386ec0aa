"""The REMI grammar as a finite-state machine: which tokens may come next.

Sampling masks every other token, so every generated sequence is valid by construction and,
because the grammar is exactly what the tokenizer writes, re-tokenizes to itself:

    BOS  (Bar [TimeSig] (Position [Chord] [Tempo] (Program Pitch Velocity [Duration])* )* )*  EOS

- a Position holds at least one note, unless it holds a Chord (a chord change between onsets);
  a Chord differs from the one in force (but with chord_every_bar, the one that opens a bar's other
  parts at Position_0 may repeat it), and the last Position of a piece has notes;

- TimeSig right after the first Bar (required) and after a later Bar only when it changes;
- Position strictly increasing inside a bar and inside the bar's length;
- Tempo required at the first Position of the piece, later only when it changes;
- notes at one Position sorted by (program, pitch), non-decreasing; a doubled (program, pitch)
  comes longest first, then loudest (as the tokenizer sorts them); Duration only for pitched
  programs (drums have none); at most `max_notes_per_onset` notes, doubled ones included:
  real music has fewer (POP909 at most 14 at one onset, Groove 9), and without the cap a model
  that has lost count of its notes stacks them, doubling the top pitch once it can climb no higher.

With a melody_first tokenizer a bar is ``Bar [TimeSig] [Tempo]``, the melody's onsets, then the
other parts' onsets (Position starts again; the Chords are there): see the tokenizer's notes.
With Repeat marks too, ``Bar [TimeSig] [Tempo] Repeat``, the melody's onsets (Positions only
forward), then ``Repeat`` and the other parts' onsets: the second mark opens their sweep. A copy
mark (``Repeat_copy8``) names a sweep with notes whose onsets fit in this bar; what follows it is
that sweep's tokens again, velocities aside, which the grammar does not enforce (the tokens are
valid either way) but `follow_copy` does when the sampler asks it to.

The real-data tests walk this grammar over every file of POP909 and Groove.

`strict_order=False` relaxes only the order of the notes inside one Position (any program and
pitch, but no (program, pitch) twice, at most `max_notes_per_onset` notes): a model that has not
learned the order exactly would otherwise be pushed up to pitch 127 by the mask. The sampler then
puts the notes of every onset back in the tokenizer's order (`canonical`), so what it returns is
strictly valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tokenizer import (
    BAR,
    BOS,
    CHORD,
    DURATION,
    EOS,
    PAD,
    PITCH,
    POSITION,
    PROGRAM,
    REPEAT,
    TEMPO,
    TIMESIG,
    VELOCITY,
    REMITokenizer,
)

# GrammarState.last is the kind of the last token (the tokenizer's kinds), or one of these
START = -1            # no token yet
NOTE_END = DURATION   # a note is complete: its Duration, or a drum note's Velocity


@dataclass
class GrammarState:
    last: int = START
    bars: int = 0
    pos: int = -1                 # last Position in this bar (-1: none yet)
    bar_len: int = 0              # steps in the current bar
    timesig: int = -1             # current TimeSig id
    tempo: int = -1               # current Tempo id
    chord: int = -1               # current Chord id
    chord_here: bool = False      # this Position holds a Chord (so it may hold no note)
    note: list = field(default_factory=lambda: [-1, -1, -1])  # (program, pitch, velocity) ids of the note being written
    last_note: tuple = (-1, -1, -1, -1)  # (program, pitch, velocity, duration) ids of the last note at this Position
    used: set = field(default_factory=set)  # (program, pitch) ids already at this Position
    notes_here: int = 0           # notes at this Position so far (doubled ones count)
    notes: int = 0                # notes in the piece so far
    sounding: int | None = None   # grid steps from this bar's start to where its last-ending note ends
                                  # (past the bar, or before it when a rest began earlier); None: no note yet
    in_melody: bool = False       # melody_first: the bar's onsets may still be the melody's (until the other
                                  # parts' sweep begins: a Position at or before the last, a Chord, their Program)
    marks: int = 0                # Repeat marks in this bar so far (repeats: one opens each sweep)
    notes_at_bar: int = 0         # `notes` when this bar began
    quiet_bars: int = 0           # bars in a row without a note just before this one
    melody_closed: bool = False   # repeats: a held melody's bar is complete; its second mark comes next
    swept: tuple = field(default_factory=lambda: ([], []))  # repeats: the tokens of this bar's melody sweep and
                                  # other parts' sweep so far (a sweep with any holds a note or a chord)
    swept_before: tuple = ()      # repeats: `swept` of the bars before, the last first (as many as a mark reaches)
    copy: list | None = None      # copies: the sweep a copy mark in force names (None: no copy going on)
    copy_at: int = 0              # how many of its tokens the copy has written
    like: list | None = None      # repeats: the sweep a Repeat mark of a like bar in force names (not a copy)
    eos: bool = False


class REMIGrammar:
    def __init__(self, tokenizer: REMITokenizer, strict_order: bool = True, max_notes_per_onset: int = 16):
        self.tok = tokenizer
        self.strict_order = strict_order
        self.max_notes_per_onset = max_notes_per_onset
        self.V = len(tokenizer)
        r = tokenizer.range
        self.ts_lo, self.ts_hi = r("TimeSig")
        self.pos_lo, self.pos_hi = r("Position")
        self.tempo_lo, self.tempo_hi = r("Tempo")
        self.prog_lo, self.prog_hi = r("Program")
        self.pitch_lo, self.pitch_hi = r("Pitch")
        self.vel_lo, self.vel_hi = r("Velocity")
        self.dur_lo, self.dur_hi = r("Duration")
        self.chord_lo, self.chord_hi = r("Chord") if tokenizer.config.chords else (0, 0)
        self.drum = tokenizer.drum_program_id
        self.bar_steps = {self.ts_lo + i: steps for i, steps in enumerate(tokenizer.bar_lengths.tolist())}
        # a Bar before any TimeSig: as long as the decoder makes it
        self.default_bar = self.bar_steps[self.ts_lo + tokenizer.map_time_signature(4, 4)]
        # time signatures whose bars fit the Position grid (the others can never be sampled)
        self.timesig_ok = np.zeros(self.V, dtype=bool)
        for i, steps in self.bar_steps.items():
            self.timesig_ok[i] = steps <= self.pos_hi - self.pos_lo
        self.kind_of = tokenizer.kinds
        self.duration_steps = tokenizer.duration_steps
        self.melody_first = tokenizer.config.melody_first
        self.melody = tokenizer.part_id("melody") if tokenizer.config.parts else -1
        self.chord_every_bar = tokenizer.config.chord_every_bar
        self.repeats = tokenizer.config.repeats
        self.mark_lo, self.mark_hi = r("Repeat") if self.repeats else (0, 0)
        self.mark_lags = tokenizer.mark_lags.tolist()
        self.longest_lag = max(self.mark_lags, default=0)
        self.copies = tokenizer.config.copies
        self.copy_lo = tokenizer._copy_first if self.copies else self.mark_hi

    def allowed(self, st: GrammarState, allow_eos: bool = True, allow_bar: bool = True) -> np.ndarray:
        m = np.zeros(self.V, dtype=bool)
        tok = self.tok
        if st.eos:
            m[tok.pad_id] = True
            return m
        last = st.last
        if self.repeats and last not in (START, BOS):
            return self._allowed_marked(st, allow_eos, allow_bar)
        if self.melody_first and last not in (START, BOS):
            return self._allowed_melody_first(st, allow_eos, allow_bar)
        if last == START:
            m[tok.bos_id] = True
        elif last == BOS:
            m[tok.bar_id] = True
        elif last == BAR and st.bars == 1:
            m |= self.timesig_ok
        elif last in (BAR, TIMESIG, NOTE_END):
            if last == BAR:
                m |= self.timesig_ok
                if st.timesig >= 0:
                    m[st.timesig] = False
            m[self.pos_lo + st.pos + 1: self.pos_lo + st.bar_len] = True
            m[tok.bar_id] = allow_bar
            m[tok.eos_id] = allow_eos and last == NOTE_END  # a trailing empty bar would not round-trip
            if last == NOTE_END and st.notes_here < self.max_notes_per_onset:
                m[st.last_note[0] if self.strict_order else self.prog_lo:self.prog_hi] = True
        elif last == POSITION or (last == CHORD and st.tempo < 0):
            if last == POSITION:
                m[self.chord_lo:self.chord_hi] = True
                if st.chord >= 0:
                    m[st.chord] = False
            m[self.tempo_lo:self.tempo_hi] = True
            if st.tempo >= 0:
                m[st.tempo] = False
                m[self.prog_lo:self.prog_hi] = True
        elif last in (CHORD, TEMPO):
            if last == CHORD:
                m[self.tempo_lo:self.tempo_hi] = True
                m[st.tempo] = False
            m[self.prog_lo:self.prog_hi] = True
            if st.chord_here:  # a chord change without a note: the next onset or bar may follow
                m[self.pos_lo + st.pos + 1: self.pos_lo + st.bar_len] = True
                m[tok.bar_id] = allow_bar
        else:
            self._allowed_note(st, m)
        return m

    def _allowed_melody_first(self, st: GrammarState, allow_eos: bool, allow_bar: bool) -> np.ndarray:
        """The grammar of melody_first pieces: ``Bar [TimeSig] [Tempo]``, then the bar's melody
        onsets, then the other parts' onsets (Position restarts; the Chords are there)."""
        m = np.zeros(self.V, dtype=bool)
        tok = self.tok
        last = st.last
        melody_onset = st.in_melody
        if last == BAR and st.bars == 1:
            m |= self.timesig_ok
            return m
        if last in (BAR, TIMESIG, TEMPO, NOTE_END):
            if last == BAR:
                m |= self.timesig_ok
                if st.timesig >= 0:
                    m[st.timesig] = False
            if last in (BAR, TIMESIG):
                m[self.tempo_lo:self.tempo_hi] = True
                if st.tempo >= 0:
                    m[st.tempo] = False
                if st.tempo < 0:  # the first bar states its tempo
                    m[:] = False
                    m[self.tempo_lo:self.tempo_hi] = True
                    return m
            after_melody = last == NOTE_END and melody_onset
            # in the melody's sweep any Position may come next (one at or before the last opens the
            # other parts' sweep); in theirs, only later ones
            m[self.pos_lo + (0 if after_melody else st.pos + 1): self.pos_lo + st.bar_len] = True
            m[tok.bar_id] = allow_bar
            m[tok.eos_id] = allow_eos and last == NOTE_END
            if last == NOTE_END and st.notes_here < self.max_notes_per_onset:
                if melody_onset:
                    m[self.melody] = True
                else:
                    m[st.last_note[0] if self.strict_order else self.prog_lo:self.prog_hi] = True
                    m[self.melody] = False
        elif last == POSITION:
            m[self.chord_lo:self.chord_hi] = True
            if st.chord >= 0 and not (self.chord_every_bar and st.pos == 0):  # (the bar's chord, even unchanged)
                m[st.chord] = False
            m[self.prog_lo:self.prog_hi] = True
            if not melody_onset:
                m[self.melody] = False
        elif last == CHORD:
            m[self.prog_lo:self.prog_hi] = True
            m[self.melody] = False
            m[self.pos_lo + st.pos + 1: self.pos_lo + st.bar_len] = True  # a chord change without a note
            m[tok.bar_id] = allow_bar
        else:
            return self._allowed_note(st, m)
        return m

    def _allowed_marked(self, st: GrammarState, allow_eos: bool, allow_bar: bool) -> np.ndarray:
        """melody_first with Repeat marks (spemusic.tokens.repeats): ``Bar [TimeSig] [Tempo] Repeat``,
        the melody's onsets (Positions only forward), ``Repeat``, the other parts' onsets."""
        last = st.last
        if st.marks == 0:  # the bar's header, then its first mark
            m = self._allowed_melody_first(st, False, False)
            if not (last == BAR and st.bars == 1 or st.tempo < 0):  # (the first bar's TimeSig and Tempo come first)
                m[self.pos_lo:self.pos_hi] = False
                self._marks(st, m)
            return m
        if last in (REPEAT, NOTE_END) or st.melody_closed:
            m = np.zeros(self.V, dtype=bool)
            if st.marks == 1:  # the melody's sweep: a later onset, a note more at this one, or the second mark
                self._marks(st, m)
                if not st.melody_closed:
                    m[self.pos_lo + st.pos + 1: self.pos_lo + st.bar_len] = True
                    if last == NOTE_END and st.notes_here < self.max_notes_per_onset:
                        m[self.melody] = True
                return m
            if last == REPEAT:  # the other parts' sweep opens anywhere in the bar, or the bar is done
                m[self.pos_lo: self.pos_lo + st.bar_len] = True
                m[self.tok.bar_id] = allow_bar
                m[self.tok.eos_id] = allow_eos and st.notes > st.notes_at_bar
                return m
        if last == POSITION and st.marks == 1:
            m = np.zeros(self.V, dtype=bool)
            m[self.melody] = True
            return m
        return self._allowed_melody_first(st, allow_eos, allow_bar)

    def without_melody(self, st: GrammarState, m: np.ndarray) -> None:
        """Narrow `m` for a piece that writes no melody note here (a part left out, or a melody
        held by the user): with Repeat marks, no onset in the melody's sweep, which could only
        hold a melody note."""
        if self.repeats and st.marks == 1:
            m[self.pos_lo:self.pos_hi] = False
        if self.repeats and st.marks == 0:  # nor a copy of an earlier melody
            m[self.copy_lo:self.mark_hi] = False

    def _marks(self, st: GrammarState, m: np.ndarray) -> None:
        """The Repeat marks allowed: ``Repeat_0``, and a lag whose bar had notes in this sweep (a
        mark names a bar to repeat; an empty sweep is never marked, and repeats none); a copy mark
        also needs that sweep's onsets to fit in this bar."""
        for mark, lag in enumerate(self.mark_lags, start=self.mark_lo):
            source = self._swept(st, lag, min(st.marks, 1))
            m[mark] = lag == 0 or bool(source) and (mark < self.copy_lo or self._last_onset(source) < st.bar_len)

    @staticmethod
    def _swept(st: GrammarState, lag: int, sweep: int) -> list:
        """The tokens of a sweep (0: the melody's, 1: the other parts') `lag` bars back (none: [])."""
        return st.swept_before[lag - 1][sweep] if 0 < lag <= len(st.swept_before) else []

    def _last_onset(self, sweep: list) -> int:
        """The last onset of a sweep with notes, in grid steps (its last Position: they only go forward)."""
        return next(t for t in reversed(sweep) if self.pos_lo <= t < self.pos_hi) - self.pos_lo

    def follow_copy(self, st: GrammarState, m: np.ndarray) -> None:
        """While a copy mark is in force, narrow the allowed tokens `m` (in place) to what the
        sweep it names wrote next: its token, or any velocity where it had a velocity (a doubled
        note no louder than the one before where both have one duration, as the tokenizer orders
        them); once the copy is complete, the end of the sweep. Where `m` holds none of those (a
        part the user left out, a chord the user asked for), `m` stays: the copy gives way, and
        ends at the token it did not name."""
        if st.copy is None:
            return
        want = np.zeros(self.V, dtype=bool)
        if st.copy_at < len(st.copy):
            nxt = st.copy[st.copy_at]
            if self.kind_of[nxt] == VELOCITY:
                duration = st.copy[st.copy_at + 1] if st.copy_at + 1 < len(st.copy) else -1
                doubled = tuple(st.note[:2]) == st.last_note[:2] and duration == st.last_note[3]
                want[self.vel_lo:st.last_note[2] + 1 if doubled else self.vel_hi] = True
            else:
                want[nxt] = True
        elif st.marks == 1:
            want[self.mark_lo:self.mark_hi] = True
        else:
            want[self.tok.bar_id] = want[self.tok.eos_id] = True
        if (m & want).any():
            m &= want

    def like_bar(self, st: GrammarState) -> np.ndarray | None:
        """While a Repeat mark of a like bar is in force (a lag, not a copy: the sampler writes
        those), the tokens the sweep it names wrote at this place, as V bools: its token at the
        same offset from the same onset Position (the next onset it had, where this onset has
        as many notes as its had), or the end of the sweep where it had no more onsets and a note
        just ended. None where it names nothing here: a velocity (each note's own), an onset
        that sweep did not have."""
        if st.like is None:
            return None
        named, written = st.like, st.swept[st.marks - 1]
        onset = next((i for i in range(len(written) - 1, -1, -1) if self.pos_lo <= written[i] < self.pos_hi), -1)
        if onset < 0:
            at = len(written)
        elif written[onset] in named:
            at = named.index(written[onset]) + len(written) - onset
        else:
            return None
        want = np.zeros(self.V, dtype=bool)
        if at < len(named):
            if self.kind_of[named[at]] == VELOCITY:
                return None
            want[named[at]] = True
        elif st.last == NOTE_END:
            if st.marks == 1:
                want[self.mark_lo:self.mark_hi] = True
            else:
                want[self.tok.bar_id] = want[self.tok.eos_id] = True
        else:
            return None
        return want

    def _allowed_note(self, st: GrammarState, m: np.ndarray) -> np.ndarray:
        """Inside a note (after its Program, Pitch or Velocity): the same in both grammars."""
        last = st.last
        if last == PROGRAM and not self.strict_order:
            m[self.pitch_lo:self.pitch_hi] = True
            for prog, pitch in st.used:
                if prog == st.note[0]:
                    m[pitch] = False
        elif last == PROGRAM:
            prog, pitch = st.last_note[:2]
            m[pitch if prog == st.note[0] else self.pitch_lo:self.pitch_hi] = True
        elif last in (PITCH, VELOCITY) and not self.strict_order:
            lo, hi = (self.vel_lo, self.vel_hi) if last == PITCH else (self.dur_lo, self.dur_hi)
            m[lo:hi] = True
        elif last == PITCH:
            doubled = tuple(st.note[:2]) == st.last_note[:2]
            # doubled drum hits go loudest first; so do doubled notes when no shorter duration is left
            if doubled and (st.note[0] == self.drum or st.last_note[3] == self.dur_lo):
                m[self.vel_lo:st.last_note[2] + 1] = True
            else:
                m[self.vel_lo:self.vel_hi] = True
        elif last == VELOCITY:
            if tuple(st.note[:2]) == st.last_note[:2]:  # doubled note: longest first, then loudest
                last_vel, last_dur = st.last_note[2:]
                m[self.dur_lo:last_dur] = True
                m[last_dur] = st.note[2] <= last_vel
            else:
                m[self.dur_lo:self.dur_hi] = True
        return m

    def advance(self, st: GrammarState, token: int) -> None:
        kind = int(self.kind_of[token]) if 0 <= token < self.V else PAD  # ids outside the vocabulary: ignored
        if kind == PAD:
            return
        if self.repeats and st.marks and kind not in (BAR, REPEAT, EOS):
            self._record(st, token, kind)
        if kind == BOS:
            st.last = BOS
        elif kind == BAR:
            st.quiet_bars = st.quiet_bars + 1 if st.bars and st.notes == st.notes_at_bar else 0
            st.bars += 1
            st.pos = -1
            st.in_melody = self.melody_first
            st.marks, st.notes_at_bar, st.melody_closed = 0, st.notes, False
            if self.repeats:
                if st.bars > 1:
                    st.swept_before = (st.swept, *st.swept_before[:self.longest_lag - 1])
                st.swept, st.copy, st.like = ([], []), None, None
            if st.sounding is not None:
                st.sounding -= st.bar_len  # the bar that ends here
            st.bar_len = self.bar_steps.get(st.timesig, self.default_bar)
            st.last = BAR
        elif kind == TIMESIG:
            st.timesig = token
            st.bar_len = self.bar_steps[token]
            st.last = TIMESIG
        elif kind == POSITION:
            if token - self.pos_lo <= st.pos:
                st.in_melody = False
            st.pos = token - self.pos_lo
            st.last_note = (-1, -1, -1, -1)
            st.used = set()
            st.notes_here = 0
            st.chord_here = False
            st.last = POSITION
        elif kind == CHORD:
            st.in_melody = False
            st.chord = token
            st.chord_here = True
            st.last = CHORD
        elif kind == TEMPO:
            st.tempo = token
            st.last = TEMPO
        elif kind == PROGRAM:
            if token != self.melody:
                st.in_melody = False
            st.note = [token, -1, -1]
            st.last = PROGRAM
        elif kind == PITCH:
            st.note[1] = token
            st.used.add((st.note[0], token))
            st.notes_here += 1
            st.notes += 1
            st.last = PITCH
        elif kind == VELOCITY:
            st.note[2] = token
            if st.note[0] == self.drum:
                st.last_note = (*st.note, -1)
                st.last = NOTE_END
                st.sounding = st.pos + 1 if st.sounding is None else max(st.sounding, st.pos + 1)
            else:
                st.last = VELOCITY
        elif kind == DURATION:
            st.last_note = (*st.note, token)
            end = st.pos + int(self.duration_steps[token - self.dur_lo])
            if not st.in_melody:  # (melody_first: the other parts' sweep alone)
                st.sounding = end if st.sounding is None else max(st.sounding, end)
            st.last = NOTE_END
        elif kind == REPEAT:
            st.marks += 1
            # (a prompt's copy mark may name a bar the prompt no longer holds: then no copy)
            named = self._swept(st, self.mark_lags[token - self.mark_lo], st.marks - 1) or None
            is_copy = token >= self.copy_lo
            st.copy, st.copy_at, st.like = (named if is_copy else None), 0, (None if is_copy else named)
            if st.marks == 2:  # the other parts' sweep begins
                st.in_melody, st.pos, st.melody_closed = False, -1, False
                st.last_note, st.used, st.notes_here = (-1, -1, -1, -1), set(), 0
            st.last = REPEAT
        elif kind == EOS:
            st.eos = True
            st.last = EOS

    def _record(self, st: GrammarState, token: int, kind: int) -> None:
        """Keep a token of the sweep in progress, and follow the copy in force: a token it did not
        name (a velocity may differ) ends it. A like bar ends where its chord is not the one the
        bar it names had there (a chord the user asked for): those notes were for another chord."""
        if st.like is not None and kind == CHORD:
            named = self.like_bar(st)
            if named is None or not named[token]:
                st.like = None
        st.swept[st.marks - 1].append(token)
        if st.copy is not None:
            named = st.copy[st.copy_at] if st.copy_at < len(st.copy) else -1
            if token == named or (kind == VELOCITY and named >= 0 and self.kind_of[named] == VELOCITY):
                st.copy_at += 1
            else:
                st.copy = None

    def end_melody(self, st: GrammarState) -> None:
        """melody_first, when a held melody's bar is complete: the state moves on to the other
        parts' sweep, whose first Position may be any (no more notes at the melody's last onset).
        Every token this then allows is one the grammar allows without it. With Repeat marks, the
        bar's second mark comes next."""
        if self.repeats:
            st.melody_closed = True
            return
        st.in_melody, st.pos = False, -1
        st.notes_here = self.max_notes_per_onset

    def _walk(self, ids) -> tuple[int | None, GrammarState]:
        """(index of the first token not allowed where it stands, or None; the state reached)."""
        st = GrammarState()
        for i, t in enumerate(ids):
            t = int(t)
            if not (0 <= t < self.V and self.allowed(st)[t]):
                return i, st
            self.advance(st, t)
        return None, st

    def first_violation(self, ids) -> int | None:
        """Index of the first token the grammar does not allow there (None: all allowed; a missing
        EOS is not counted)."""
        return self._walk(ids)[0]

    def is_valid(self, ids) -> bool:
        """True when `ids` follows the grammar from BOS to EOS."""
        bad, st = self._walk(ids)
        return bad is None and st.eos
