"""What the model is told about its own token stream, beyond the tokens: two input features read
off the ids, the same on the parallel path and one token at a time, carried across calls.

* Pitch memory: every token sees the last pitch written after each of some Program ids (the
  parts' tokens). A melody's next note is an interval from its last one, which sits 9-17 tokens
  back behind the accompaniment's notes in time order (median 10 on POP909): too far and too
  irregular for linear attention or a short convolution to read sharply.
* Bar echo: every token sees what came next at the same place of the bar before: the token that
  followed, one bar earlier, the token at the same (pass through the bar, position in the bar,
  place in its onset), or at the last place before it. A bar in time order is one pass; a
  melody-first bar two (its melody, then the other parts, each echoing its own).
  At a note's end that is where the last bar's next onset fell; at a Position, which drum or pitch
  it opened with. A drummer's pattern is a bar (about 75 tokens) back: linear attention blurs it,
  and a model that cannot look it up exactly cannot copy it.
  Over several bars (`bars` > 1) the echo is what most of the last `bars` bars had there, ties
  going to the nearest bar: the pattern held, not the last bar. A generated bar is the model's
  own, so an echo of it alone copies each slip forward; the bars around a slip outvote it.

Both are embeddings added to the token embedding, initialised at zero: added to a trained model,
they change nothing until training moves them.

* Echo head: the echoes 1, 2, 4 and 8 bars back (say) are also candidates for the next token,
  each scored by how many of the last `window` tokens its lag named right. Pop repeats itself
  at 4 and 8 bars (a bar's best match among the 16 before it is 4 or 8 bars back in 37% of
  POP909's bars, 1 bar back in 9%), and a drummer bar after bar: where the copy has held for
  the last dozen tokens it will most likely hold again, which linear attention cannot see.

* Repeat marks (spemusic.tokens.repeats): where the mark in force (the last since the bar line)
  names a lag, the bar echo is that lag's echo, exactly, and the echo head scores that lag from
  a second table: "this bar repeats the one 8 back" is then read, not guessed from agreement.

* Melody reads (melody first: every bar's melody is written before its other parts): where a
  token of the other parts' pass sits in its bar, the melody pitch sounding there and the
  melody's pitch classes over the bar from there on. The model's melody head scores the
  accompaniment's next pitch as an interval from that melody pitch, and the bar's chord by those
  pitch classes (spemusic.nn.model). Teacher-forced, v8 scored the accompaniment's pitches within
  0.001 nats and the chords within 0.02 whether or not the melody was moved by a fourth: linear
  attention does not read the bar's melody, 20-200 tokens back, sharply enough to follow it.

* Bar clock: every token sees how many bars the piece has had, counted from its BOS, up to 16
  (the model's config). A song opens on an intro: POP909's melody enters at bar 8 at the median
  (bar 3 to 12 for four songs in five), over a sparser accompaniment. A training window from
  inside a song does not show where the song began, and one token (BOS) a few hundred tokens
  back is too faint for linear attention to count bars from: v9 sampled from scratch brought its
  melody in at bar 2 and played as densely from its first bar as later ones. A context that did
  not open on BOS (a window from inside a song) reads the last row, as a piece past the clock's
  bars does: far enough in that the opening no longer matters. A second table reads the bars
  since the melody entered: once a song's melody is in, it stays (POP909's first 2,048 tokens:
  98% of the bars after it), and with the first clock alone the model, told "bar 6", dropped it
  in a third of them. A third table reads the bars since the melody last played: v10, with the
  first two, let its melody rest in 17% of the bars after its entry (the songs' openings 2%), and
  after one bar of rest brought it back in only 0.6 of them (the songs' openings 0.78; whole
  songs, where a rest opens an interlude, 0.35): whether the last bar had melody, 100-200 tokens
  back, is as faint to linear attention as the bar count.

* Interval anchor: where a token opens a note of a part (its Program), the last pitch that part
  wrote. The model's interval head (spemusic.nn.model) scores the coming Pitch as an interval from
  it as well as a pitch. Fed the same pitch as an input (the pitch memory), a fine-tuned model did
  not learn to read it in 2.5M tokens; as an output the interval is scored directly.

* Pitch profile (the key head): where a token opens a note of a part, how often each pitch class
  has sounded among the parts' notes so far (log shares, counted exactly). The key head scores
  the coming Pitch by the profile read from its pitch class. Teacher-forced on POP909's valid
  songs, v11 gave notes outside the song's scale 1.5% of the melody's probability (the songs play
  0.7%) and 3.1% of the accompaniment's (2.1%); sampled, its pieces sounded them 5x and 2.3x as
  often as the songs, and they were most of the melody's clashes with its accompaniment.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# tokens of context the bar echo keeps between calls: the bars it reads back and the one being
# written, as far back as a training window of 2,048 tokens sees (8 Groove bars reach past 1,024
# tokens in 3% of places); a bar beyond it is not echoed
ECHO_CONTEXT = 2048
# places in an onset told apart (Position, Chord, Tempo, then 4 tokens a note: 16 notes and more)
ECHO_PLACES = 128
# passes through one bar told apart: a melody-first bar goes through its positions twice (the
# melody, then the other parts); a time-ordered bar once
ECHO_SWEEPS = 4
# the melody notes of a bar the melody reads look through (a 4/4 bar holds 48 steps of 12 a beat)
MELODY_NOTES = 48
# the span of melody the chord reads weigh, from the token's position on: a bar of 4/4, in steps
MELODY_SPAN = 48
# the melody's register, where its next note is read against: the mean of its last notes (at
# least REGISTER_LEAST of them)
REGISTER_NOTES, REGISTER_LEAST = 16, 4
# the bar clock's carry before a context's first token: [opened on BOS (-1: not known yet), Bars so
# far, Bars at the melody's first note, at its last (-1: none yet)]
CLOCK_START = (-1, 0, -1, -1)


def _held_pitches(ids: torch.Tensor, carry: torch.Tensor, programs: torch.Tensor, pitch_range) -> tuple:
    """For ids (B, T) and the carry before them (B, 1 + S: the last token, each slot's last pitch
    + 1), each (B, T, S): the index in ids of each slot's latest pitch so far (-1: none in ids),
    and the last pitch + 1 written after Program `programs[s]` (0: none yet)."""
    B, T = ids.shape
    S = len(programs)
    lo, hi = pitch_range
    before = torch.cat([carry[:, :1], ids[:, :-1]], 1)
    hits = ((ids >= lo) & (ids < hi))[..., None] & (before[..., None] == programs)  # (B, T, S)
    where = torch.arange(T, device=ids.device)[None, :, None].expand(B, T, S)
    latest = torch.where(hits, where, -1).cummax(1).values
    pitch = (ids - lo + 1)[..., None].expand(B, T, S).gather(1, latest.clamp(min=0))
    return latest, torch.where(latest >= 0, pitch, carry[:, None, 1:1 + S])


def pitch_memory(ids: torch.Tensor, carry: torch.Tensor | None, programs: torch.Tensor, pitch_range) -> tuple:
    """Rows (B, T, S) of the pitch memory's table for ids (B, T): 129 * s + 1 + the last pitch
    written after Program `programs[s]`, or 129 * s for none yet; and the carry after `ids`
    (B, 1 + S): the last token, then the last pitch + 1 of each slot."""
    B, S = ids.shape[0], len(programs)
    if carry is None:
        carry = torch.cat([ids.new_full((B, 1), -1), ids.new_zeros(B, S)], 1)
    _, held = _held_pitches(ids, carry, programs, pitch_range)
    return held + 129 * torch.arange(S, device=ids.device), torch.cat([ids[:, -1:], held[:, -1]], 1)


def bar_clock(ids: torch.Tensor, carry: torch.Tensor | None, bos_id: int, bar_id: int, bars: int,
              melody_id: int = -1, rests: int = 0) -> tuple:
    """Rows (B, T) of the bar clock's table for ids (B, T): the Bar tokens the piece has had up to
    each token (0: BOS, before the first Bar), `bars` from that many on and wherever the context
    did not open on BOS; rows (B, T) of the melody clock's: the bars since the melody's first note
    (its Program token, `melody_id`; 1 in the bar it enters, 0 before), `bars` as the other's;
    rows (B, T) of the rest clock's: the bars since the melody's last note (0: it played in this
    bar, up to `rests` - 1), `rests` before the melody's first note in the context (known in any
    context, as the melody is seen); and the carry after `ids` (B, 4): [whether it opened on BOS,
    Bars so far, the Bars at the melody's first note, at its last (-1: none yet)]. `carry` None,
    or -1 first: the ids open the context."""
    if carry is None:
        carry = ids.new_tensor(CLOCK_START).expand(ids.shape[0], 4)
    opened = torch.where(carry[:, :1] < 0, ids[:, :1] == bos_id, carry[:, :1] > 0)  # (B, 1)
    count = carry[:, 1:2] + (ids == bar_id).long().cumsum(1)
    # the count at the melody's first note in ids: the least count among its Program tokens so far
    never = torch.iinfo(count.dtype).max
    first = torch.where(ids == melody_id, count, never).cummin(1).values
    entry = torch.where(carry[:, 2:3] >= 0, carry[:, 2:3], torch.where(first < never, first, -1))
    since = torch.where(entry >= 0, count - entry + 1, 0)
    last = torch.maximum(torch.where(ids == melody_id, count, -1).cummax(1).values, carry[:, 3:4])
    rows = torch.where(opened, count.clamp(max=bars), bars)
    melody_rows = torch.where(opened, since.clamp(max=bars), bars)
    rest_rows = torch.where(last >= 0, (count - last).clamp(max=max(rests - 1, 0)), rests)
    return rows, melody_rows, rest_rows, torch.cat([opened.long(), count[:, -1:], entry[:, -1:], last[:, -1:]], 1)


def interval_anchor(ids: torch.Tensor, carry: torch.Tensor | None, programs: torch.Tensor, pitch_range,
                    bar_id: int) -> tuple:
    """Where ids (B, T) hold one of `programs` (a part's note opens): that part's last pitch (0-127),
    else -1 (-1 too before the part's first pitch); and the part's interval table there, 2 * slot +
    (whether a Bar came since that pitch): a melody's first note of a bar follows the last bar's
    melody, 100-200 tokens back, not the note before it. And the carry after `ids` (B, 1 + 2S):
    the last token, each slot's last pitch + 1 (0: none yet), whether a Bar came since it."""
    B, T = ids.shape
    S = len(programs)
    if carry is None:
        carry = torch.cat([ids.new_full((B, 1), -1), ids.new_zeros(B, 2 * S)], 1)
    latest, held = _held_pitches(ids, carry, programs, pitch_range)  # (the carry's first 1 + S columns)
    t = torch.arange(T, device=ids.device)
    bar_at = torch.where(ids == bar_id, t, -1).cummax(1).values[..., None]  # (B, T, 1)
    crossed = torch.where(latest >= 0, bar_at > latest, (bar_at >= 0) | (carry[:, None, 1 + S:] > 0)).long()
    slot = ids[..., None] == programs
    anchor = torch.where(slot, held, 0).sum(-1) - 1
    table = torch.where(slot, 2 * torch.arange(S, device=ids.device) + crossed, 0).sum(-1)
    return anchor, table, torch.cat([ids[:, -1:], held[:, -1], crossed[:, -1]], 1)


def bar_echo(ids: torch.Tensor, tail: torch.Tensor | None, bar_id: int, position_range, none_id: int,
             bars: int = 1) -> tuple:
    """For ids (B, T), the token that followed one bar earlier at each one's place, or at the last
    place before it (B, T), `none_id` where the bar before is not in the context; with `bars` > 1,
    the token most of the last `bars` bars had there (ties: the nearest bar's). And the tail to
    carry (B, ECHO_CONTEXT): the last tokens, -1 before the start of the piece. `tail` None: the ids
    open the context (a training window). What comes before the context's first Bar (BOS, or a
    bar cut by the window) is never echoed."""
    echo, _, keep = echo_features(ids, tail, bar_id, position_range, none_id, bars)
    return echo, keep


def echo_features(ids: torch.Tensor, tail: torch.Tensor | None, bar_id: int, position_range, none_id: int,
                  bars: int = 1, lags: tuple = (), window: int = 16, marks: tuple = (), places: dict | None = None) -> tuple:
    """`bar_echo`'s echo (B, T), the echo head's inputs for ids (B, T), and the tail to carry. The
    head's inputs (None without `lags`): the candidates (B, T, K), the token that followed the
    same place lags[k] bars back (`none_id`: none), and the row of its table each is scored by
    (B, T, K): how many of the last `window` tokens up to each (itself included) were the
    candidate its lag named the token before. With Repeat `marks` ((id, lag) pairs): where a mark
    names a lag, the echo is that lag's, and the head scores that lag from a second table (rows
    window + 1 on). `places`: echo_places of the tail and ids, where the caller has them."""
    B, T = ids.shape
    seq = ids if tail is None else torch.cat([tail, ids], 1)
    N = seq.shape[1]
    lo, hi = position_range
    width = ECHO_SWEEPS * (hi - lo + 1) * ECHO_PLACES
    places = echo_places(seq, bar_id, position_range) if places is None else places
    key = places["key"]
    first = max(N - T - window, 0) if lags else N - T  # the head counts the hits of the tokens before
    echoes = echo_back(seq, key, key[:, first:], width, max([bars, *lags, *(lag for _, lag in marks)]), none_id)
    echo = most_held(echoes[:, -T:, :bars], none_id)
    marked = None
    if marks:
        marked = mark_in_force(seq, places["last_bar"], marks)[:, -T:]
        echo = torch.where(marked > 0, echoes[:, -T:].gather(-1, (marked - 1).clamp(min=0)[..., None])[..., 0], echo)
    head = None
    if lags:
        cands = echoes[..., [lag - 1 for lag in lags]]  # (B, N - first, K)
        hit = named_right(cands[:, :-1], seq[:, first + 1:], none_id)  # tokens first+1 …
        hits = torch.cat([hit.new_zeros(B, 1, len(lags)), hit.cumsum(1)], 1)
        p = torch.arange(N - T, N, device=ids.device) - first
        agree = hits[:, p] - hits[:, (p - window).clamp(min=0)]
        if marked is not None:
            agree = agree + marked_rows(marked, lags, window)
        head = (cands[:, -T:], agree)
    keep = seq[:, -ECHO_CONTEXT:]
    if keep.shape[1] < ECHO_CONTEXT:
        keep = torch.cat([keep.new_full((B, ECHO_CONTEXT - keep.shape[1]), -1), keep], 1)
    return echo, head, keep


def mark_in_force(seq: torch.Tensor, last_bar: torch.Tensor, marks: tuple) -> torch.Tensor:
    """(B, N): the lag the Repeat mark in force at each token of seq names (the last mark since
    the bar line, itself included; 0: none, or a mark of no repeat). `marks`: (id, lag) pairs;
    `last_bar` (B, N) the index of each token's Bar (echo_places)."""
    lag_here = mark_lags(seq, marks)
    t = torch.arange(seq.shape[1], device=seq.device).expand_as(seq)
    last = torch.where(lag_here > 0, t, -1).cummax(1).values
    return torch.where(last > last_bar, lag_here.gather(1, last.clamp(min=0)) - 1, 0)


def mark_lags(ids: torch.Tensor, marks: tuple) -> torch.Tensor:
    """The lag each Repeat mark among `ids` names, plus one (a mark of lag 0 is a mark too); 0 for
    every other token. `marks`: (id, lag) pairs."""
    out = torch.zeros_like(ids)
    for mark_id, lag in marks:
        out = torch.where(ids == mark_id, lag + 1, out)
    return out


def marked_rows(lag: torch.Tensor, lags: tuple, window: int) -> torch.Tensor:
    """(…, K) for the lag in force (…): where it is the head's lag k, the offset of lag k's second
    table (window + 1), else 0: added to the agreement, it picks the row the head scores by."""
    return (window + 1) * (lag[..., None] == torch.tensor(lags, device=lag.device)).long()


def named_right(cands: torch.Tensor, tokens: torch.Tensor, none_id: int) -> torch.Tensor:
    """(…, K) 1 where lag k's candidate was the token that came, `tokens` (…), else 0: what the echo
    head's agreement counts."""
    return ((cands == tokens[..., None]) & (cands != none_id)).long()


def add_echo_scores(logits: torch.Tensor, rows: torch.Tensor, cands: torch.Tensor, agree: torch.Tensor,
                    kind_offsets: torch.Tensor) -> torch.Tensor:
    """logits (…, V) + the echo head's scores: row k of `rows` (K, window + 1, twice that with
    Repeat marks, that again for each echo kind) at column `agree` (…, K) (echo_features') plus the
    candidate's kind's offset (`kind_offsets` (V + 1,), ModelConfig.echo_kind_offsets), added to lag
    k's candidate's logit (…, K) (twice where two lags name the same token); none where the
    candidate is V (no echo)."""
    V = logits.shape[-1]
    scores = rows[torch.arange(rows.shape[0], device=rows.device), agree + kind_offsets[cands]] * (cands < V)
    return logits.scatter_add(-1, cands.clamp(max=V - 1), scores.to(logits.dtype))


def echo_places(seq: torch.Tensor, bar_id: int, position_range) -> dict:
    """Per token of seq (B, N), what its place in its bar is made of, each (B, N): `key` (bar, pass,
    position, place in the onset, increasing along each row; -1 before the first Bar), and the
    running values it comes from (`bar`, `last_bar`, `last_pos`, `pos_val`, `in_onset`, `pos`,
    `again`, `again_at_bar`): the one-token step carries their last column on
    (spemusic.nn.step_graph). A pass starts at a Position at or before the last one of its bar
    (melody first: the other parts after the melody)."""
    B, N = seq.shape
    lo, hi = position_range
    t = torch.arange(N, device=seq.device).expand(B, N)
    is_bar, is_pos = seq == bar_id, (seq >= lo) & (seq < hi)
    bar = is_bar.long().cumsum(1)
    last_bar = torch.where(is_bar, t, -1).cummax(1).values
    last_pos = torch.where(is_pos, t, -1).cummax(1).values
    in_onset = last_pos > last_bar
    pos_val = torch.where(last_pos >= 0, seq.gather(1, last_pos.clamp(min=0)) - lo + 1, 0)
    pos = torch.where(in_onset, pos_val, 0)  # 0: before the bar's first onset
    place = (t - torch.maximum(last_bar, last_pos)).clamp(max=ECHO_PLACES - 1)
    before = torch.cat([pos.new_zeros(B, 1), pos[:, :-1]], 1)  # the position in force before
    was_in_onset = torch.cat([in_onset.new_zeros(B, 1), in_onset[:, :-1]], 1)
    again = (is_pos & was_in_onset & (pos <= before)).long().cumsum(1)
    again_at_bar = again.gather(1, last_bar.clamp(min=0))
    sweep = (again - again_at_bar).clamp(0, ECHO_SWEEPS - 1)
    width = ECHO_SWEEPS * (hi - lo + 1) * ECHO_PLACES
    key = bar * width + (sweep * (hi - lo + 1) + pos) * ECHO_PLACES + place
    return {"key": torch.where(bar >= 1, key, -1).contiguous(),  # before the first Bar: never matched
            "bar": bar, "last_bar": last_bar, "last_pos": last_pos, "pos_val": pos_val, "in_onset": in_onset,
            "pos": pos, "again": again, "again_at_bar": again_at_bar}


def echo_back(seq: torch.Tensor, key: torch.Tensor, mine: torch.Tensor, width: int, bars: int,
               none_id: int) -> torch.Tensor:
    """(B, T, bars): the token that followed the same place 1, 2, … `bars` bars back, or the last
    place before it in that bar (a drummer's onset a grid step early or late; an onset with fewer
    notes): every bar opens on its Bar token, so one is found wherever that bar lies in the context."""
    B, N = seq.shape
    back = width * torch.arange(1, bars + 1, device=seq.device)
    wanted = (mine[..., None] - back).view(B, -1)  # all the bars back in one search
    at = (torch.searchsorted(key, wanted, right=True) - 1).clamp(0, max(N - 2, 0))
    found = (wanted >= 0) & (key.gather(1, at) // width == wanted // width)  # (never with N < 2)
    echo = torch.where(found, seq.gather(1, (at + 1).clamp(max=N - 1)), none_id)
    return echo.view(*mine.shape, bars)


def most_held(echoes: torch.Tensor, none_id: int) -> torch.Tensor:
    """(B, T, K) echoes, nearest bar first -> (B, T): the one most of them agree on, ties going to
    the nearest bar; `none_id` where none was found."""
    K = echoes.shape[-1]
    if K == 1:
        return echoes[..., 0]
    found = echoes != none_id
    votes = ((echoes[..., :, None] == echoes[..., None, :]) & found[..., None, :]).sum(-1) * found
    nearest_first = torch.arange(K - 1, -1, -1, device=echoes.device)
    return echoes.gather(-1, (votes * K + nearest_first).argmax(-1, keepdim=True))[..., 0]


def melody_reads(seq: torch.Tensor, key: torch.Tensor, T: int, melody_id: int, parts: torch.Tensor, pitch_range,
                 position_range, durations: torch.Tensor) -> tuple:
    """For the last T tokens of seq (B, N), with their keys (echo_places'; -1 before the first Bar),
    what each reads of its bar's melody (a token of a bar's second pass or later: the other parts,
    once the whole bar's melody is written; others read nothing), and the melody of its register:
    * anchor (B, T): where the token is one of the `parts` Program ids (its pitch comes next), the
      melody pitch (0-127) sounding at its position (the latest melody note of the bar begun at or
      before it and not ended); where it is `melody_id`, the melody's register (the mean of its
      last REGISTER_NOTES pitches, rounded; with at least REGISTER_LEAST); else -1;
    * table (B, T): 2 * the part's slot + 1 where that melody note begins at this position; the
      melody's own: 2 * len(parts);
    * profile (B, T, 12): the melody's pitch classes over the next MELODY_SPAN steps of the bar from
      the token's position, in bars of 4/4 (steps / 48).
    `durations` (V,): the grid steps of each Duration id (0 for other ids); a note's duration is
    the token two after its pitch."""
    B, N = seq.shape
    lo, hi = pitch_range
    npos = position_range[1] - position_range[0] + 1
    width = ECHO_SWEEPS * npos * ECHO_PLACES
    bar = torch.where(key >= 0, key // width, -1)
    sweep = (key % width) // (npos * ECHO_PLACES)
    step = (key % width) // ECHO_PLACES % npos - 1  # the onset's grid step in the bar (-1: before one)
    before = torch.cat([seq.new_full((B, 1), -1), seq[:, :-1]], 1)
    is_note = (seq >= lo) & (seq < hi) & (before == melody_id) & (key >= 0)
    t = torch.arange(N, device=seq.device).expand(B, N)
    length = durations[seq.gather(1, (t + 2).clamp(max=N - 1)).clamp(min=0)]
    # the notes in stream order: note_at[:, r] the index of the r-th (the rest: N, unused)
    rank = is_note.long().cumsum(1)
    note_at = seq.new_full((B, N + 1), N).scatter_(1, torch.where(is_note, rank - 1, N), t)
    # each reader's last MELODY_NOTES notes, the latest first
    r = rank[:, -T:, None] - 1 - torch.arange(MELODY_NOTES, device=seq.device)  # (B, T, M)
    j = note_at.gather(1, r.clamp(min=0).view(B, -1)).clamp(max=N - 1).view(B, T, MELODY_NOTES)
    at = lambda x: x.gather(1, j.view(B, -1)).view(B, T, MELODY_NOTES)  # noqa: E731
    pitch, onset = at(seq) - lo, at(step)
    end = onset + at(length)
    q_bar, q_step = bar[:, -T:, None], step[:, -T:, None]
    mine = (r >= 0) & (at(bar) == q_bar) & (sweep[:, -T:, None] >= 1) & (q_bar >= 0)
    covers = mine & (onset <= q_step) & (q_step < end)
    first = covers.long().argmax(-1, keepdim=True)  # the latest note sounding (m = 0 is the latest)
    slot = seq[:, -T:, None] == parts  # (B, T, S)
    sounding = covers.any(-1) & slot.any(-1)
    anchor = torch.where(sounding, pitch.gather(-1, first)[..., 0], -1)
    begins = (onset.gather(-1, first)[..., 0] == q_step[..., 0]).long()
    table = torch.where(sounding, (slot.long() * torch.arange(parts.shape[0], device=seq.device)).sum(-1) * 2 + begins, 0)
    recent = (r[..., :REGISTER_NOTES] >= 0).long()  # (integer means: the same on every path)
    count, total = recent.sum(-1), (pitch[..., :REGISTER_NOTES] * recent).sum(-1)
    register = (seq[:, -T:] == melody_id) & (count >= REGISTER_LEAST)
    anchor = torch.where(register, (2 * total + count) // (2 * count).clamp(min=1), anchor)
    table = torch.where(register, 2 * parts.shape[0], table)
    weight = (torch.minimum(end, q_step + MELODY_SPAN) - torch.maximum(onset, q_step)).clamp(min=0) * mine
    profile = seq.new_zeros(B, T, 12, dtype=torch.float32).scatter_add_(-1, pitch % 12, weight.float() / MELODY_SPAN)
    return anchor, table, profile


def interval_scores(rows: torch.Tensor, pitches: torch.Tensor, anchor: torch.Tensor, table: torch.Tensor,
                    reach: int) -> torch.Tensor:
    """(…, 128) the score of each pitch p as the interval p - anchor (…) in row `table` (…) of
    `rows` (n, 2 * reach + 2): column interval + reach, the last for every farther one; 0 where
    anchor < 0. `pitches`: arange(128)."""
    interval = pitches - anchor[..., None]
    which = torch.where(interval.abs() <= reach, interval + reach, 2 * reach + 1)
    return rows[table].gather(-1, which) * (anchor >= 0)[..., None]


def pitch_profile(ids: torch.Tensor, carry: torch.Tensor | None, programs: torch.Tensor, pitch_range) -> tuple:
    """The key head's reads of ids (B, T): `slot` (B, T), s where the token is Program
    `programs[s]` (its pitch comes next), else -1; `profile` (B, T, 12), the log share of each
    pitch class among the notes of those programs up to the token, add-one smoothed (uniform
    before any); and the carry after `ids` (B, 13): the last token, then the counts. Integer
    counts: the same on every path. `carry` None: the ids open the context."""
    B = ids.shape[0]
    if carry is None:
        carry = torch.cat([ids.new_full((B, 1), -1), ids.new_zeros(B, 12)], 1)
    lo, hi = pitch_range
    before = torch.cat([carry[:, :1], ids[:, :-1]], 1)
    is_note = (ids >= lo) & (ids < hi) & (before[..., None] == programs).any(-1)
    onehot = F.one_hot((ids - lo).clamp(min=0) % 12, 12) * is_note[..., None]
    counts = carry[:, None, 1:] + onehot.cumsum(1)
    profile = torch.log((counts + 1).float() / (counts.sum(-1, keepdim=True) + 12).float())
    match = ids[..., None] == programs
    slot = torch.where(match.any(-1), match.long().argmax(-1), -1)
    return slot, profile, torch.cat([ids[:, -1:], counts[:, -1]], 1)


def key_scores(slot: torch.Tensor, profile: torch.Tensor, rows: torch.Tensor, roots: torch.Tensor,
               classes: torch.Tensor) -> torch.Tensor:
    """(…, 128) the key head's score of each pitch p where a part's pitch comes next (`slot` >= 0;
    0 elsewhere): row `slot` of `rows` (S, 12) against the profile (…, 12) read from p's pitch
    class (`roots`[c, i] = (c + i) % 12; `classes`: arange(128) % 12)."""
    w = rows[slot.clamp(min=0)]  # (…, 12)
    per_class = (profile[..., roots] * w[..., None, :]).sum(-1)  # (…, 12)
    return per_class[..., classes] * (slot >= 0)[..., None]


def chord_scores(profile: torch.Tensor, roots: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(…, 12 * Q) each chord's score, root by root then quality: its quality's row of `rows`
    (Q, 12) against the pitch-class profile (…, 12) read from its root (`roots`[r, i] = (r + i) % 12)."""
    return (profile[..., roots] @ rows.T.to(profile.dtype)).flatten(-2)


__all__ = ["CLOCK_START", "ECHO_CONTEXT", "add_echo_scores", "bar_clock", "bar_echo", "chord_scores", "echo_back",
           "echo_features", "echo_places", "interval_anchor", "interval_scores", "key_scores", "mark_in_force",
           "mark_lags", "marked_rows", "melody_reads", "most_held", "named_right", "pitch_memory", "pitch_profile"]
