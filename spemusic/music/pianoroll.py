"""Piano-roll pictures of MIDI files (`spemusic show`, `generate/continue --png`).

Time runs left to right in the file's own bars and beats (bar lines, bar numbers); pitch runs up,
with note names and the black keys shaded as on a keyboard. Each pitched track has its colour,
velocity shows as shade, drums are hits on named rows in a lane of their own, and the file's
markers (chords, and the "continuation" marker that `continue` writes where the prompt ends) are
printed along the top; the continuation marker also draws a line.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import symusic

from ..errors import OptionError, SpemusicError

FORMATS = (".png", ".svg", ".pdf")
CONTINUATION_MARKER = "continuation"  # written by `continue` where the new bars begin
DPI = 100
SYSTEM_BARS = 16  # bars per row of a long piece
BLACK_KEYS = {1, 3, 6, 8, 10}
TRACK_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


@dataclass
class Bars:
    starts: np.ndarray     # tick of every bar line, and the end of the last bar
    beats: np.ndarray      # tick of every beat


def bar_grid(score: symusic.Score) -> Bars:
    """Bar lines and beats from the file's time signatures (4/4 before the first one); a new time
    signature starts a new bar, as in a score editor."""
    tpq = score.ticks_per_quarter
    sigs = sorted((int(t.time), int(t.numerator), int(t.denominator)) for t in score.time_signatures)
    if not sigs or sigs[0][0] > 0:
        sigs.insert(0, (0, 4, 4))
    end = max(int(score.end()), 1)
    starts, beats, t, i = [], [], 0, 0
    while t < end:
        while i + 1 < len(sigs) and sigs[i + 1][0] <= t:
            i += 1
        _, num, den = sigs[i]
        beat = tpq * 4 / den
        nxt = t + num * beat
        if i + 1 < len(sigs) and sigs[i + 1][0] < nxt:
            nxt = sigs[i + 1][0]  # a meter change cuts the bar short
        starts.append(t)
        beats.extend(np.arange(t, nxt, beat))
        t = max(int(round(nxt)), t + 1)  # a bar shorter than a tick (1 tick per quarter, 1/8) still moves on
    starts.append(t)
    return Bars(np.asarray(starts, dtype=np.float64), np.asarray(beats, dtype=np.float64))


def annotated_grid(score: symusic.Score, beats) -> Bars:
    """Bar lines and beats from a beat annotation (spemusic.tokens.beats.Beats, in seconds) on the file's
    tempo map: a bar at each annotated downbeat, a pickup bar before the first if beats come
    before it, and the last bar as long as the one before it."""
    from ..tokens.beats import TempoMap

    tempo = TempoMap(score.ticks_per_quarter, [t.time for t in score.tempos], [t.qpm for t in score.tempos])
    ticks = tempo.ticks(beats.times)
    down = ticks[np.asarray(beats.downbeat, dtype=bool)]
    if not len(down):
        raise SpemusicError("the beat annotation marks no downbeat")
    last = down[-1] + (down[-1] - down[-2] if len(down) > 1 else ticks[-1] - down[-1] or score.ticks_per_quarter * 4)
    pickup = ticks[0] < down[0] - 0.5  # annotated beats before the first downbeat
    starts = np.concatenate([[0.0], down if pickup else down[1:], [max(last, float(score.end()))]])
    return Bars(starts, ticks)


def parse_bar_range(text: str) -> tuple[int, int]:
    """'A:B' (1-based, inclusive; 'A:' to the end, ':B' from the start) -> (A, B or 0)."""
    try:
        a, b = text.split(":")
        a, b = int(a) if a else 1, int(b) if b else 0
    except ValueError:
        raise OptionError("{bars} {text!r}: give A:B, bar numbers from 1 (e.g. 1:16, or 9: to the end)", text=text) from None
    if a < 1 or (b and b < a):
        raise OptionError("{bars} {text!r}: bars are numbered from 1 and B must not come before A", text=text)
    return a, b


def parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise OptionError("{size} {text!r}: give WIDTHxHEIGHT in pixels, e.g. 1600x600", text=text) from None
    if not (200 <= w <= 20000 and 150 <= h <= 8000):
        raise OptionError("{size} {text!r}: width 200-20000 and height 150-8000 pixels", text=text)
    return w, h


def _draw_notes(ax, tracks: list[tuple], names: list[str]) -> None:
    """Pitched tracks as bars, one colour each, louder notes darker; black keys shaded, C's named."""
    import matplotlib
    import pretty_midi

    all_pitches = np.concatenate([pitch for _, _, pitch, _ in tracks])
    lo, hi = (int(all_pitches.min()) - 2, int(all_pitches.max()) + 2) if len(all_pitches) else (48, 84)
    for p in range(lo, hi + 1):  # black keys shaded, as on a keyboard
        if p % 12 in BLACK_KEYS:
            ax.axhspan(p - 0.5, p + 0.5, color="#000000", alpha=0.045, lw=0)
    for i, ((start, end, pitch, vel), name) in enumerate(zip(tracks, names)):
        if not len(start):  # (a track silent in these bars: an empty bar chart would take the legend's default colour)
            continue
        rgba = np.tile(matplotlib.colors.to_rgba(TRACK_COLOURS[i % len(TRACK_COLOURS)]), (len(start), 1))
        rgba[:, 3] = 0.3 + 0.7 * vel / 127  # louder notes darker
        ax.barh(pitch, end - start, left=start, height=0.85, color=rgba, lw=0, label=name)
    ax.set_ylim(lo - 0.5, hi + 0.5)
    cs = [p for p in range(lo, hi + 1) if p % 12 == 0]
    ax.set_yticks(cs, [pretty_midi.note_number_to_name(p) for p in cs])
    ax.set_ylabel("pitch")
    if len(tracks) > 1:
        ax.legend(loc="upper right", fontsize=8, framealpha=0.8)


def _draw_drums(ax, hits: list[tuple]) -> int:
    """Drum hits as ticks on one named row per drum sound, louder hits darker; the longest row
    name's length in characters."""
    import matplotlib
    import pretty_midi

    kinds = sorted({int(p) for h in hits for p in h[2]})
    row = {p: i for i, p in enumerate(kinds)}
    for start, _, pitch, vel in hits:
        colours = np.tile(matplotlib.colors.to_rgba("#333333"), (len(start), 1))
        colours[:, 3] = 0.3 + 0.7 * vel / 127
        ax.scatter(start, [row[int(p)] for p in pitch], marker="|", s=60, c=colours, linewidths=1.5)
    names = [_drum_name(pretty_midi, p) for p in kinds]
    ax.set_yticks(range(len(kinds)), names, fontsize=7)
    ax.set_ylim(-0.7, len(kinds) - 0.3)
    ax.set_ylabel("drums")
    return max(map(len, names), default=0)  # (drum tracks with no hit in the bars shown: no row)


def render(score: symusic.Score, fmt: str = ".png", bars: tuple[int, int] | None = None,
           size: tuple[int, int] | None = None, title: str | None = None, beats=None) -> bytes:
    """The piano roll of `score` as PNG, SVG or PDF bytes; `beats` (spemusic.tokens.beats.Beats): its
    bars are the annotated ones, not the file's time signatures'."""
    plt = require_matplotlib()

    if fmt not in FORMATS:
        raise SpemusicError(f"cannot draw a {fmt or 'suffix-less'} file; use {', '.join(FORMATS)}")
    grid = bar_grid(score) if beats is None else annotated_grid(score, beats)
    n_bars = len(grid.starts) - 1
    first, last = bars or (1, 0)
    last = last or n_bars
    if first > n_bars:
        raise OptionError("{bars} {first}:{last}: the file has {n} bar{s}", first=first, last=last or "", n=n_bars,
                          s="s" * (n_bars != 1))
    last = min(last, n_bars)
    pitched = [t for t in score.tracks if not t.is_drum and len(t.notes)]
    drums = [t for t in score.tracks if t.is_drum and len(t.notes)]
    if not pitched and not drums:
        raise SpemusicError("no notes to draw")
    # a long piece without an asked size goes on in rows of SYSTEM_BARS bars, as a score does,
    # not on one strip too wide to read
    systems = [(a, min(a + SYSTEM_BARS - 1, last)) for a in range(first, last + 1, SYSTEM_BARS)]
    if size is not None or len(systems) <= 2:
        systems = [(first, last)]
    bar_px = 64  # pixels per bar when the size is not given
    row_height = 620 if not drums else 760
    width, height = size or (int(np.clip(220 + bar_px * (systems[0][1] - systems[0][0] + 1), 900, 8000)),
                             row_height if len(systems) == 1 else (row_height - 150) * len(systems) + 60)
    fig = plt.figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    rows = [fig] if len(systems) == 1 else fig.subfigures(len(systems), 1)
    for i, (row, (a, b)) in enumerate(zip(rows, systems)):
        _draw_system(row, score, grid, a, b, pitched, drums, width, height / len(systems), title if i == 0 else None)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt[1:], dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def _draw_system(fig, score: symusic.Score, grid: Bars, first: int, last: int, pitched: list, drums: list,
                 width: float, height: float, title: str | None) -> None:
    """Bars `first` to `last` on a figure (or a row of one): notes above, drums below."""
    import pretty_midi

    x0, x1 = grid.starts[first - 1], grid.starts[last]

    def notes_of(track):
        a = track.notes.numpy()
        start, end = a["time"].astype(np.float64), (a["time"] + a["duration"]).astype(np.float64)
        keep = (end > x0) & (start < x1)
        return start[keep], np.maximum(end[keep], start[keep] + 1), a["pitch"][keep], a["velocity"][keep]

    ratios = [3, 1] if pitched and drums else [1]
    axes = fig.subplots(len(ratios), 1, sharex=True, gridspec_kw={"height_ratios": ratios, "hspace": 0.05},
                        squeeze=False)[:, 0]
    ax_notes = axes[0] if pitched else None
    ax_drums = axes[-1] if drums else None

    if ax_notes is not None:
        _draw_notes(ax_notes, [notes_of(t) for t in pitched],
                    [t.name or pretty_midi.program_to_instrument_name(t.program) for t in pitched])
    left = 70  # pixels for the pitch names and the axis label
    if ax_drums is not None:  # drum names at 7 pt take ~5.5 px a character, the axis label ~25 px
        left = max(left, 40 + int(5.5 * _draw_drums(ax_drums, [notes_of(t) for t in drums])))

    shown = grid.starts[first - 1:last + 1]
    beats = grid.beats[(grid.beats >= x0) & (grid.beats <= x1)]
    markers = [(int(m.time), str(m.text)) for m in score.markers if x0 <= m.time < x1]
    for ax in axes:
        ax.vlines(beats, 0, 1, transform=ax.get_xaxis_transform(), color="#000000", alpha=0.08, lw=0.5)
        ax.vlines(shown, 0, 1, transform=ax.get_xaxis_transform(), color="#000000", alpha=0.4, lw=0.8)
        for time, text in markers:
            if text == CONTINUATION_MARKER:
                ax.axvline(time, color="#d62728", lw=1.6, ls="--")
        ax.set_xlim(x0, x1)
    top = axes[0]
    every = max(1, int(np.ceil((last - first + 1) / max(8, width / 45))))  # bar numbers that fit
    px_per_tick = (width - left - 20) / max(x1 - x0, 1)
    # a bar cut short (a pickup, a meter change) under 20 px keeps its line but not its number,
    # which would run into the next bar's
    numbered = [b for b in range(first, last + 1) if (b - first) % every == 0
                and (b == last or (grid.starts[b] - grid.starts[b - 1]) * px_per_tick >= 20)]
    axes[-1].set_xticks([grid.starts[b - 1] for b in numbered], [str(b) for b in numbered])
    axes[-1].set_xlabel("bar")
    # marker labels (chords, the continuation) along the top; one that would run into the label
    # before it goes up a line, of three (labels take ~5 px a character at 7 pt: 6 leaves a gap;
    # with every line taken, the one free first)
    ends = [-np.inf] * 3  # where the last label of each line ends, in ticks
    for time, text in markers:
        label = "continuation →" if text == CONTINUATION_MARKER else text
        line = next((i for i, end in enumerate(ends) if time >= end), int(np.argmin(ends)))
        ends[line] = time + (len(label) + 1) * 6 / px_per_tick
        top.text(time, 1.005 + 0.035 * line * 620 / height, label, transform=top.get_xaxis_transform(), fontsize=7,
                 rotation=0, color="#d62728" if text == CONTINUATION_MARKER else "#555555", va="bottom", ha="left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=left / width, right=1 - 20 / width, bottom=45 / height, top=1 - (74 if title else 54) / height)


def require_matplotlib():
    """matplotlib.pyplot on the Agg backend, or a one-line error saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpemusicError("piano rolls need matplotlib: pip install 'spemusic[plot]'") from None
    return plt


# drum sounds outside General MIDI that the Groove MIDI Dataset's kit (a Roland TD-11) plays
KIT_NAMES = {22: "Closed Hi Hat edge", 26: "Open Hi Hat edge"}


def _drum_name(pretty_midi, pitch: int) -> str:
    name = KIT_NAMES.get(pitch) or pretty_midi.note_number_to_drum_name(pitch)
    return f"{name} ({pitch})" if name else str(pitch)


def draw_file(src: Path, dest: Path, bars: tuple[int, int] | None = None, size: tuple[int, int] | None = None,
              overwrite: bool = True, beats: Path | None = None) -> None:
    """Read a MIDI file and write its piano roll (the format from dest's suffix), atomically; in
    the bars of a beat annotation file, if given."""
    from ..files import write_output
    from ..tokens.tokenizer import read_score

    fmt = dest.suffix.lower()
    if fmt not in FORMATS:
        raise SpemusicError(f"{dest}: cannot draw a {fmt or 'suffix-less'} file; use {', '.join(FORMATS)}")
    try:
        annotation = None
        if beats is not None:
            from ..files import check_input_file
            from ..tokens.beats import read_beats

            annotation = read_beats(check_input_file(beats))
        data = render(read_score(src), fmt, bars, size, title=src.name, beats=annotation)
    except OptionError as e:  # (its options stay named by parameter, for the CLI to spell)
        raise OptionError("{file}: " + e.template, **{**e.values, "file": str(src)}) from None
    except SpemusicError as e:
        msg = str(e)
        raise SpemusicError(msg if msg.startswith(str(src)) else f"{src}: {msg}") from None
    write_output(data, dest, overwrite)
