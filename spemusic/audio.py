"""Audio from MIDI: a General MIDI SoundFont played by symusic's synthesizer (prestosynth).

Chosen by measurement (``benchmarks/render_speed.py``, one core): it installs from PyPI with
symusic, which spemusic already needs, while FluidSynth is a system package; it renders pop piano
a little faster than FluidSynth's fast-render mode and drums many times faster (the benchmark
prints both per SoundFont, as real-time factors). FluidSynth is the more faithful player
(modulators, reverb, chorus, controllers); prestosynth plays no MIDI controllers, so the
sustain pedal is applied here, before rendering, by holding notes until the pedal lifts."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .errors import MidiError, SpemusicError

SAMPLE_RATE = 44100
# suffix -> libsndfile format (soundfile writes all four)
AUDIO_FORMATS = {".wav": "WAV", ".flac": "FLAC", ".ogg": "OGG", ".mp3": "MP3"}
SOUNDFONT_ENV = "SPEMUSIC_SOUNDFONT"
# the usual system places, then the small GM SoundFont that pretty_midi ships (TimGM6mb, GPL-2.0)
SYSTEM_SOUNDFONTS = (
    "/usr/share/sounds/sf2/default-GM.sf2",
    "/usr/share/sounds/sf2/FluidR3_GM.sf2",
    "/usr/share/soundfonts/default.sf2",
    "/usr/share/soundfonts/FluidR3_GM.sf2",
    "/usr/local/share/soundfonts/default.sf2",
    "/opt/homebrew/share/soundfonts/default.sf2",
)
PEAK = 10 ** (-1 / 20)  # normalise to -1 dBFS: prestosynth sums voices without a limiter
HOW_TO_GET_ONE = ("point SPEMUSIC_SOUNDFONT (or render --soundfont) at a .sf2 file; "
                  "on Debian/Ubuntu: apt-get install fluid-soundfont-gm")


class SoundFontError(SpemusicError):
    """No usable SoundFont: missing, not a file, or not a SoundFont 2."""


def bundled_soundfont() -> Path | None:
    """pretty_midi's own GM SoundFont, so that a plain ``pip install`` can render."""
    try:
        import pretty_midi
    except ImportError:
        return None
    path = Path(pretty_midi.__file__).parent / "TimGM6mb.sf2"
    return path if path.is_file() else None


def soundfont_candidates() -> list[Path]:
    places = [Path(p) for p in SYSTEM_SOUNDFONTS]
    bundled = bundled_soundfont()
    return places + ([bundled] if bundled else [])


def find_soundfont(explicit: Path | str | None = None) -> Path:
    """``explicit``, then $SPEMUSIC_SOUNDFONT, then the system places; checked to be an SF2 file."""
    if explicit:
        return check_soundfont(Path(explicit), "--soundfont")
    if os.environ.get(SOUNDFONT_ENV):
        return check_soundfont(Path(os.environ[SOUNDFONT_ENV]), SOUNDFONT_ENV)
    for path in soundfont_candidates():
        if path.is_file():
            return check_soundfont(path, "the SoundFont")
    raise SoundFontError(f"no SoundFont found: {HOW_TO_GET_ONE}")


def check_soundfont(path: Path, given_as: str) -> Path:
    if not path.exists():
        raise SoundFontError(f"{given_as} {path}: no such file; {HOW_TO_GET_ONE}")
    if not path.is_file():
        raise SoundFontError(f"{given_as} {path}: not a file")
    with open(path, "rb") as f:
        head = f.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"sfbk":
        raise SoundFontError(f"{given_as} {path}: not a SoundFont 2 file (no RIFF 'sfbk' header)")
    return path


def hold_sustained_notes(score):
    """A copy of ``score`` where each note sounding when the sustain pedal (CC 64) is down lasts
    until the pedal lifts, as a piano's dampers would."""
    score = score.copy()
    for track in score.tracks:
        pedals = sorted((p.time, p.time + p.duration) for p in track.pedals)
        if not pedals:
            continue
        starts = np.array([a for a, _ in pedals])
        for note in track.notes:
            end = note.time + note.duration
            i = int(np.searchsorted(starts, end, side="right")) - 1  # last pedal down at or before the end
            if i >= 0 and pedals[i][0] <= end < pedals[i][1]:
                note.duration = pedals[i][1] - note.time
    return score


def render(score, soundfont: Path, sample_rate: int = SAMPLE_RATE):
    """Stereo float32 audio, shape (frames, 2), peak at -1 dBFS. Tempo map, programs and drum
    tracks (channel 10) come from the score; the audio runs on to the end of the last release."""
    import symusic

    if score.note_num() == 0:
        raise MidiError("no notes to render")
    try:
        synth = symusic.Synthesizer(str(soundfont), sample_rate)
    except RuntimeError as e:
        raise SoundFontError(f"{soundfont}: cannot read the SoundFont ({e})") from None
    audio = np.ascontiguousarray(synth.render(hold_sustained_notes(score), True).T)
    peak = float(np.abs(audio).max())
    if peak > 0:
        audio *= PEAK / peak
    return audio


def write_audio(audio: np.ndarray, path: Path, sample_rate: int = SAMPLE_RATE) -> bytes:
    """The encoded file's bytes, format by suffix (.wav 16-bit, .flac, .ogg, .mp3)."""
    import io

    import soundfile

    fmt = AUDIO_FORMATS[path.suffix.lower()]
    buffer = io.BytesIO()
    subtype = {"WAV": "PCM_16", "FLAC": "PCM_16"}.get(fmt)
    soundfile.write(buffer, audio, sample_rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def render_file(src: Path, dest: Path, soundfont: Path, sample_rate: int = SAMPLE_RATE) -> float:
    """Read a MIDI file and write its audio (the format from dest's suffix), atomically; returns
    the audio's length in seconds."""
    from .files import write_output
    from .tokenizer import read_score

    if dest.suffix.lower() not in AUDIO_FORMATS:
        raise SpemusicError(f"{dest}: cannot write a {dest.suffix or 'suffix-less'} file; use {', '.join(AUDIO_FORMATS)}")
    try:
        audio = render(read_score(src), soundfont, sample_rate)
    except MidiError as e:
        msg = str(e)
        raise MidiError(msg if msg.startswith(str(src)) else f"{src}: {msg}") from None
    write_output(write_audio(audio, dest, sample_rate), dest)
    return len(audio) / sample_rate
