"""Endless live play: bars sampled on the recurrent path (constant time and memory per token) and
sent out paced to real time: MIDI messages to a port or to stdout, audio to the sound card or to
stdout.

The sampler runs ahead of the music by at most `ahead` seconds; between two tokens the player
sends what has come due (MIDI events on time; audio `lead` seconds early, so that a buffer never
runs dry). Each bar is timed with the meter and tempo in force, its notes become note-on/off
events, and its audio is rendered on its own and added into a rolling buffer (the release of a
bar's last notes sounds on over the next).
"""

from __future__ import annotations

import heapq
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import OptionError, SpemusicError
from ..tokens.tokenizer import REMITokenizer
from .settings import GenerationConfig

DRUM_CHANNEL = 9
AUDIO_GAIN = 0.6  # a live stream cannot be normalised afterwards: a fixed gain, then a soft limiter


# bars rendered by one synthesizer: its voice cache grows with every bar (the memory over 240 bars:
# benchmarks/play_margin.py)
SYNTH_RENEWAL = 32


class WallClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass
class TimedBar:
    tokens: list[int]
    seconds: float
    score: object  # symusic.Score in ticks, its bar starting at tick 0


class BarTimer:
    """Times each bar on its own: the meter and the tempo in force carry over from bar to bar."""

    def __init__(self, tokenizer: REMITokenizer, timesig: int = -1, tempo: int = -1):
        self.tok = tokenizer
        self.timesig, self.tempo = timesig, tempo
        self.ts_lo, self.ts_hi = tokenizer.range("TimeSig")
        self.tempo_lo, self.tempo_hi = tokenizer.range("Tempo")
        self.position_0 = tokenizer.range("Position")[0]

    def time(self, tokens: list[int]) -> TimedBar:
        import symusic

        tok = self.tok
        body = list(tokens[1:])  # after the Bar token
        has_timesig = bool(body) and self.ts_lo <= body[0] < self.ts_hi
        prefix = [tok.bos_id, tok.bar_id]
        if self.timesig >= 0 and not has_timesig:
            prefix.append(self.timesig)
        if self.tempo >= 0:  # the tempo in force until the bar changes it
            prefix += [self.position_0, self.tempo]
        for t in body:
            if self.ts_lo <= t < self.ts_hi:
                self.timesig = t
            elif self.tempo_lo <= t < self.tempo_hi:
                self.tempo = t
        score = tok.decode_to_score(prefix + body + [tok.eos_id])
        score.markers = []  # chords: no sound
        num, den = tok.time_signatures[self.timesig - self.ts_lo] if self.timesig >= 0 else (4, 4)
        end = symusic.Score(score.ticks_per_quarter)
        end.tempos = score.tempos
        end.markers.append(symusic.TextMeta(round(num * 4 / den * score.ticks_per_quarter), "end"))
        seconds = end.to("second").markers[0].time
        return TimedBar(list(tokens), float(seconds), score)


class Player:
    """Schedules timed bars and sends them out on time. `midi_out(message)` gets mido messages
    (or None); `audio_out(int16 (n, 2) array)` gets audio blocks in order (or None)."""

    def __init__(self, *, midi_out=None, audio_out=None, soundfont=None, sample_rate: int = 44100,
                 clock=None, lead: float = 0.25):
        self.midi_out, self.audio_out = midi_out, audio_out
        self.clock = clock or WallClock()
        self.lead = lead
        self.rate = sample_rate
        self.synth, self.soundfont, self.rendered = None, soundfont, 0
        if audio_out is not None:
            import symusic

            self.synth = symusic.Synthesizer(str(soundfont), sample_rate)
        self.t0: float | None = None       # wall time of music time 0
        self.sampled = 0.0                 # music seconds sampled (the end of the last bar)
        self.bar_ends: list[float] = []    # music time where each scheduled bar ends
        self.events: list = []             # heap of (music time, order, mido message)
        self.order = 0
        self.channels: dict[tuple[int, bool], int] = {}
        self.audio = np.zeros((0, 2), dtype=np.float32)  # pending audio from sample `written` on
        self.written = 0
        self.slept = 0.0                   # wall seconds spent waiting for the music
        self.late, self.underruns = 0.0, 0  # how often and how long the music waited for the sampler

    # ------------------------------------------------------------------ scheduling
    def music_now(self) -> float:
        return 0.0 if self.t0 is None else self.clock.now() - self.t0

    def add(self, bar: TimedBar) -> None:
        start = self.sampled
        late = self.music_now() - start
        if self.t0 is not None and late > 0:  # the sampler fell behind: the music waits for it
            self.t0 += late
            self.late += late
            self.underruns += 1
        if self.midi_out is not None:
            self._schedule_midi(bar, start)
        if self.audio_out is not None:
            self._mix_audio(bar, start)
        self.sampled = start + bar.seconds
        self.bar_ends.append(self.sampled)
        if self.t0 is None:  # the music starts once its first bar is ready
            self.t0 = self.clock.now() + self.lead

    def _channel(self, program: int, drum: bool, when: float) -> int:
        import mido

        key = (program, drum)
        if key not in self.channels:
            free = [c for c in range(16) if c != DRUM_CHANNEL and c not in self.channels.values()]
            self.channels[key] = DRUM_CHANNEL if drum else (free[0] if free else 0)
            if not drum:
                self._push(when, mido.Message("program_change", channel=self.channels[key], program=program))
        return self.channels[key]

    def _push(self, when: float, message) -> None:
        heapq.heappush(self.events, (when, self.order, message))
        self.order += 1

    def _schedule_midi(self, bar: TimedBar, start: float) -> None:
        import mido

        for track in bar.score.to("second").tracks:
            channel = self._channel(track.program, track.is_drum, start)
            for note in track.notes:
                on = start + note.time
                self._push(on, mido.Message("note_on", channel=channel, note=note.pitch, velocity=note.velocity))
                self._push(on + max(note.duration, 0.01), mido.Message("note_off", channel=channel, note=note.pitch))

    def _mix_audio(self, bar: TimedBar, start: float) -> None:
        if not bar.score.note_num():
            return
        from ..music.audio import hold_sustained_notes, synthesize

        self.rendered += 1
        if self.rendered % SYNTH_RENEWAL == 0:  # prestosynth caches every voice it renders: start afresh
            import symusic

            self.synth = symusic.Synthesizer(str(self.soundfont), self.rate)
        self.synth, block = synthesize(self.synth, hold_sustained_notes(bar.score), self.soundfont, self.rate)
        block = np.ascontiguousarray(block.T) * AUDIO_GAIN
        offset = round(start * self.rate) - self.written
        need = offset + len(block)
        if need > len(self.audio):
            self.audio = np.concatenate([self.audio, np.zeros((need - len(self.audio), 2), np.float32)])
        self.audio[offset:need] += block

    # ------------------------------------------------------------------ output
    def service(self, until: float | None = None) -> None:
        """Send what is due now (or, with `until`, everything up to that music time)."""
        now = self.music_now() if until is None else until
        if self.midi_out is not None:
            while self.events and self.events[0][0] <= now:
                self.midi_out(heapq.heappop(self.events)[2])
        if self.audio_out is not None:
            horizon = min(self.sampled, now + (self.lead if until is None else 0.0))
            self._write_audio_to(round(horizon * self.rate))

    def _write_audio_to(self, sample: int) -> None:
        n = sample - self.written
        if n <= 0:
            return
        block = self.audio[:n]
        if len(block) < n:
            block = np.concatenate([block, np.zeros((n - len(block), 2), np.float32)])
        self.audio = self.audio[n:]
        self.written = sample
        self.audio_out((np.tanh(block) * 32767).astype(np.int16))

    def wait(self, ahead: float, should_stop=lambda: False) -> None:
        """Let the music catch up until at most `ahead` seconds of it remain unplayed (or until
        `should_stop()`)."""
        while self.sampled - self.music_now() > ahead and not should_stop():
            pause = min(0.01, self.sampled - self.music_now() - ahead)
            self.clock.sleep(max(pause, 0.0))
            self.slept += max(pause, 0.0)
            self.service()

    def finish(self, cut: float | None = None, release: float = 0.5) -> float:
        """Play on to `cut` (default: the end of everything sampled), then silence the notes and
        let the audio ring for `release` seconds at most. Returns the music time played."""
        end = self.sampled if cut is None else min(cut, self.sampled)
        while self.music_now() < end:
            pause = min(0.01, end - self.music_now())
            self.clock.sleep(pause)
            self.slept += pause
            self.service(min(self.music_now(), end))
        self.service(end)
        if self.midi_out is not None:
            import mido

            self.events.clear()
            for channel in sorted(set(self.channels.values())):
                self.midi_out(mido.Message("control_change", channel=channel, control=123, value=0))
        if self.audio_out is not None:
            tail = min(len(self.audio), round(release * self.rate))
            if tail:
                self.audio[:tail] *= np.linspace(1, 0, tail, dtype=np.float32)[:, None]
                self._write_audio_to(self.written + tail)
        return end

    def bar_end_after(self, when: float) -> float:
        """The end of the bar playing at music time `when`."""
        return next((e for e in self.bar_ends if e > when), self.sampled)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that nothing left in its buffer breaks the pipe again at exit."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def stdout_audio(block: np.ndarray) -> None:
    """Raw audio on stdout: 16-bit little-endian stereo (`aplay -f cd` at 44.1 kHz)."""
    sys.stdout.buffer.write(block.astype("<i2").tobytes())
    sys.stdout.buffer.flush()


def require_mido() -> None:
    try:
        import mido  # noqa: F401
    except ImportError:
        raise SpemusicError("MIDI output needs mido: pip install 'spemusic[play]'") from None


def stdout_midi(message) -> None:
    """Raw MIDI bytes on stdout, each message when it is due (for `amidi -s -` or a pipe)."""
    sys.stdout.buffer.write(bytes(message.bytes()))
    sys.stdout.buffer.flush()


def open_midi_port(name: str):
    """A mido output port by name (python-rtmidi backend); a missing backend or name is a one-line error."""
    require_mido()
    import mido

    try:
        import rtmidi  # noqa: F401  (mido's default backend)
    except ImportError:
        raise OptionError("{port} needs mido and python-rtmidi: pip install 'spemusic[play]'") from None
    names = mido.get_output_names()
    if name not in names:
        raise OptionError("{port} {name}: no such MIDI output; there are: {names}", name=name,
                          names=", ".join(names) or "none")
    port = mido.open_output(name)
    return port.send


@dataclass
class SoundCard:
    """The default sound card through sounddevice (PortAudio): writes block until played."""
    sample_rate: int
    stream: object = field(default=None)

    def __post_init__(self):
        try:
            import sounddevice
        except (ImportError, OSError) as e:  # OSError: the PortAudio library itself is missing
            raise OptionError("playing on the sound card needs sounddevice and PortAudio (pip install "
                              "'spemusic[play]'; apt-get install libportaudio2), or use {to_stdout} | aplay -f cd, "
                              "or {port} ({reason})", reason=str(e).splitlines()[0][:80]) from None
        try:
            self.stream = sounddevice.OutputStream(samplerate=self.sample_rate, channels=2, dtype="int16")
            self.stream.start()
        except Exception as e:  # noqa: BLE001  (PortAudioError: no device)
            raise OptionError("no sound card to play on ({reason}); use {to_stdout} | aplay -f cd, or {port}",
                              reason=str(e).splitlines()[0][:100]) from None

    def __call__(self, block: np.ndarray) -> None:
        self.stream.write(block)

    def close(self) -> None:
        self.stream.stop()
        self.stream.close()


@dataclass
class PlayReport:
    bars: int                 # bars played (to the end of the one playing when stopped)
    music_seconds: float
    sampled_seconds: float    # music sampled, including bars sampled ahead and not played
    sampling_seconds: float   # wall time spent sampling (waiting for the music excluded)
    underruns: int
    late_seconds: float
    tokens: list[int]         # the played bars' tokens, with --record (else empty)
    reader_closed: bool = False  # stdout's reader (aplay, head) went away: the music stopped there

    @property
    def margin(self) -> float:
        """Seconds of music sampled per wall second of sampling: above 1, sampling keeps ahead."""
        return self.sampled_seconds / max(self.sampling_seconds, 1e-9)


def play(model, tokenizer: REMITokenizer, player: Player, config: GenerationConfig | None = None, *, prompt=None,
         should_stop=lambda: False, ahead: float = 3.0, record: bool = False, on_bar=None, **settings) -> PlayReport:
    """Sample bars without end (or `config.bars` of them) and play them on `player`, paced to real
    time; the config's seed, sampling options (None: the model's own) and step weights
    (GenerationConfig; `settings`: its fields by name). `should_stop()` (Ctrl-C) ends the music
    at the end of the bar playing. `on_bar(report)` is called after each bar is sampled."""
    from ..tokens.grammar import GrammarState, REMIGrammar
    from .sampling import stream_bars

    config = GenerationConfig.of(config, **settings).for_model(model)
    config.check()
    bars = config.bars

    st, grammar = GrammarState(), REMIGrammar(tokenizer)  # the meter and tempo in force after the prompt
    for t in ([] if prompt is None else prompt):
        grammar.advance(st, int(t))
    timer = BarTimer(tokenizer, st.timesig, st.tempo)
    kept: list[list[int]] = []
    started = player.clock.now()
    n = 0
    stopped = False

    def stop() -> bool:
        nonlocal stopped
        stopped = stopped or should_stop()
        return stopped

    def report(played_bars: int, music: float) -> PlayReport:  # the tokens are joined once, at the end
        busy = player.clock.now() - started - player.slept
        return PlayReport(played_bars, music, player.sampled, busy, player.underruns, player.late, [])

    closed = False
    try:
        for bar in stream_bars(model, tokenizer, prompt=prompt, options=config.options, seed=config.seed,
                               weights_dtype=config.weights_dtype, should_stop=stop, on_token=player.service):
            player.add(timer.time(bar))
            if record:
                kept.append(bar)
            n += 1
            if on_bar is not None:
                on_bar(report(n, player.music_now()))
            if bars is not None and n >= bars or stop():
                break
            player.wait(ahead, stop)
            if stop():
                break
        sampled = report(n, 0.0)
        if stopped:
            cut = player.bar_end_after(player.music_now())
            played = sum(1 for e in player.bar_ends if e <= cut + 1e-9)
        else:
            cut, played = None, n
        music = player.finish(cut)
    except BrokenPipeError:  # the reader of stdout (aplay, head) left: a stop there, the bars it had are kept
        closed = True
        _silence_stdout()
        sampled = report(n, 0.0)
        music = player.music_now()
        played = min(n, 1 + sum(1 for e in player.bar_ends if e <= music + 1e-9))  # with the bar it was in
    sampled.bars, sampled.music_seconds, sampled.reader_closed = played, music, closed
    sampled.tokens = [t for bar in kept[:played] for t in bar]
    return sampled
