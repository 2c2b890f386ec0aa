"""Audio from MIDI: a General MIDI SoundFont played by symusic's synthesizer (prestosynth).

Chosen by measurement (``benchmarks/render_speed.py``, one core): it installs from PyPI with
symusic, which spemusic already needs, while FluidSynth is a system package; it renders pop piano
a little faster than FluidSynth's fast-render mode and drums many times faster (the benchmark
prints both per SoundFont, as real-time factors). FluidSynth is the more faithful player
(modulators, reverb, chorus, controllers); prestosynth plays no MIDI controllers, so the
sustain pedal is applied here, before rendering, by holding notes until the pedal lifts."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import numpy as np

from ..errors import MidiError, SpemusicError

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
    _synthesizer(path, SAMPLE_RATE)  # a right header on a broken body is refused here, before any sampling
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


SEGMENT_SECONDS = 30.0  # notes are synthesised 30 s of onsets at a time: memory stays flat in the song's length
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)  # MPEG-1, 2 and 2.5 layer III


def check_audio_format(dest: Path, sample_rate: int, label: str | None = None) -> str:
    """The libsndfile format of `dest`'s suffix, refused before any work where it cannot be written."""
    fmt = AUDIO_FORMATS.get(dest.suffix.lower())
    label = label or str(dest)
    if fmt is None:
        raise SpemusicError(f"{label}: cannot write a {dest.suffix or 'suffix-less'} file; use {', '.join(AUDIO_FORMATS)}")
    if fmt == "MP3" and sample_rate not in MP3_RATES:
        raise SpemusicError(f"{label}: MP3 has no {sample_rate:,} Hz; use --sample-rate "
                            f"{', '.join(map(str, MP3_RATES))}, or .flac, .ogg or .wav")
    return fmt


def _synthesizer(soundfont: Path, sample_rate: int):
    import symusic

    try:
        return symusic.Synthesizer(str(soundfont), sample_rate)
    except RuntimeError as e:
        raise SoundFontError(f"{soundfont}: cannot read the SoundFont ({e})") from None


def synthesize(synth, score, soundfont: Path, sample_rate: int):
    """(synthesizer, stereo float32 audio of shape (2, frames)) for `score`. prestosynth keeps every
    voice it has rendered, and once it holds many, a render can come out with NaN frames (seen in
    `play` after a few bars of odd instruments); a fresh synthesizer renders the same notes right,
    and is handed back to be used from then on."""
    audio = synth.render(score, True)
    if not np.isfinite(audio).all():
        synth = _synthesizer(soundfont, sample_rate)
        audio = np.nan_to_num(synth.render(score, True), nan=0.0, posinf=0.0, neginf=0.0)
    return synth, audio


def _check_memory(seconds_score, sample_rate: int) -> None:
    """Refuse, before the work, a segment that could not be held: one with a note of hours."""
    longest = max((float(n.duration) for t in seconds_score.tracks for n in t.notes), default=0.0)
    need = (SEGMENT_SECONDS + longest + 10) * sample_rate * 2 * 4 * 3  # float32 stereo, the synth's own copies
    from ..memory import available_memory

    free = available_memory()
    if free is not None and need > free:
        raise MidiError(f"a note of {longest / 3600:.1f} hours would need about {need / 2**30:.1f} GiB to render; "
                        f"{free / 2**30:.1f} GiB are free")


def render_blocks(score, soundfont: Path, sample_rate: int = SAMPLE_RATE):
    """The unnormalised stereo audio of `score`, float32 blocks of shape (frames, 2) in order. Each
    segment's notes are synthesised alone and added where they sound (their release runs into the
    next segments), so memory holds a segment, not the song; the sum is the whole render's."""
    if score.note_num() == 0:
        raise MidiError("no notes to render")
    synth = _synthesizer(soundfont, sample_rate)
    seconds = hold_sustained_notes(score).to("second")
    _check_memory(seconds, sample_rate)
    step = int(round(SEGMENT_SECONDS * sample_rate))
    pending, at = np.zeros((0, 2), dtype=np.float32), 0  # audio from frame `at` on, still being summed
    for start in range(0, int(np.ceil(float(seconds.end()) * sample_rate)) + 1, step):
        part = seconds.clip(start / sample_rate, (start + step) / sample_rate, clip_end=False)
        if part.note_num():
            synth, audio = synthesize(synth, part.shift_time(-start / sample_rate), soundfont, sample_rate)
            audio = audio.T
            if start - at > len(pending):  # silence since the last sound: given out a segment at a time
                yield from ([pending] if len(pending) else [])
                for s in range(at + len(pending), start, step):
                    yield np.zeros((min(step, start - s), 2), dtype=np.float32)
                pending, at = np.zeros((0, 2), dtype=np.float32), start
            end = start + len(audio)
            if end - at > len(pending):
                pending = np.concatenate((pending, np.zeros((end - at - len(pending), 2), dtype=np.float32)))
            pending[start - at:end - at] += audio
        done = min(start + step - at, len(pending))  # frames before the next segment's onsets are final
        if done > 0:
            yield pending[:done]
            pending, at = pending[done:], at + done
    if len(pending):
        yield pending


def render(score, soundfont: Path, sample_rate: int = SAMPLE_RATE):
    """Stereo float32 audio, shape (frames, 2), peak at -1 dBFS. Tempo map, programs and drum
    tracks (channel 10) come from the score; the audio runs on to the end of the last release."""
    audio = np.concatenate(list(render_blocks(score, soundfont, sample_rate)))
    peak = float(np.abs(audio).max())
    if peak > 0:
        audio *= PEAK / peak
    return audio


def write_audio(audio: np.ndarray, path: Path, sample_rate: int = SAMPLE_RATE) -> bytes:
    """The encoded file's bytes, format by suffix (.wav 16-bit, .flac, .ogg, .mp3)."""
    import io

    buffer = io.BytesIO()
    _encode([audio], buffer, path, sample_rate)
    return buffer.getvalue()


def _encode(blocks, out, path: Path, sample_rate: int, gain: float = 1.0) -> None:
    """Encode audio blocks into the binary file `out`, format by `path`'s suffix. In blocks: libsndfile
    1.2.2 crashes writing a minute or more of Ogg Vorbis at once (python-soundfile #426)."""
    import soundfile

    fmt = check_audio_format(path, sample_rate)
    subtype = {"WAV": "PCM_16", "FLAC": "PCM_16"}.get(fmt)
    with _ctrl_c_between_blocks() as interrupted, \
            soundfile.SoundFile(out, "w", sample_rate, 2, format=fmt, subtype=subtype) as f:
        for block in blocks:
            for i in range(0, len(block), 1 << 16):
                if interrupted:
                    raise KeyboardInterrupt
                f.write(block[i:i + (1 << 16)] * gain)


@contextlib.contextmanager
def _ctrl_c_between_blocks():
    """Hold a Ctrl-C until the block being encoded is written: raised inside libsndfile's write
    callback, Python prints it and the write goes on."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    interrupted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def render_file(src: Path, dest: Path, soundfont: Path, sample_rate: int = SAMPLE_RATE, overwrite: bool = True) -> float:
    """Read a MIDI file and write its audio (the format from dest's suffix), atomically; returns
    the audio's length in seconds. Two passes, in segments: the first finds the peak, the second
    writes the normalised audio, so that neither the audio nor the encoded file is held whole."""
    from ..files import write_output
    from ..tokens.tokenizer import read_score

    check_audio_format(dest, sample_rate)
    try:
        score = read_score(src)
        frames, peak = 0, 0.0
        for block in render_blocks(score, soundfont, sample_rate):
            frames, peak = frames + len(block), max(peak, float(np.abs(block).max(initial=0.0)))
    except MidiError as e:
        msg = str(e)
        raise MidiError(msg if msg.startswith(str(src)) else f"{src}: {msg}") from None
    gain = PEAK / peak if peak > 0 else 1.0
    write_output(lambda out: _encode(render_blocks(score, soundfont, sample_rate), out, dest, sample_rate, gain),
                 dest, overwrite)
    return frames / sample_rate
