"""The recurrent step compiled ahead of time: a token in about the time its weights take to read.

`Performer.step` runs a token as ~1,400 small PyTorch operations. At batch 1 on a CPU each costs
microseconds of Python and dispatch whatever its size, and together they cost several times the
reading of the weights, which is all a token must do (benchmarks/step_profile.py). `StepGraph`
computes the same function with three programs compiled by AOTInductor (`torch.export`, then
inductor's C++ in a shared library), each a few fused loops:

* the input: the token's embedding, its bar echo and bar clock, and the sineSPE code at t
  (closed form; the position is a float64 input, so one program serves every position). The echo
  is incremental: the keys of the tokens before are carried with them, so a token computes only
  its own key and searches the carried ones (the parallel path recomputes every key of its
  2,048-token context);
* a layer, run once per layer on that layer's weights and state;
* the head: the final norm and the logits (and the output heads' scores, from what the input
  program read: the interval, melody and key heads').

Each updates its inputs in place (the token's activations, the layer's attention state and
short-convolution history, the echo's carry), so the calls pass the same tensors every token and
the State stays a `State`: it can be cloned or stepped by `Performer.step` at any time.

At batch 1 the products with the weights are multiply-and-sum loops, which read half-precision
weights faster than `F.linear`'s matrix-vector product on a CPU; larger batches use matrix
products. Compiling takes seconds once per model shape, batch and machine; the programs are
kept in the user's cache (`cache_dir()`), so later runs load them in milliseconds.

Served: FAVOR+ models with sineSPE shared by the layers (or no positional encoding), with or
without the bar echo, the interval head and the short convolution: both shipped models. Other models, machines
where compiling is unavailable (no C++ compiler, TORCH_COMPILE_DISABLE=1, SPEMUSIC_COMPILE=0) and
failed compiles run `Performer.step` (`StepGraph.unavailable` says why). Rounding differs from
`Performer.step` in the last bits; the same seed gives the same tokens on the same machine
(tests/test_step_graph.py; the distributions' agreement: benchmarks/generation.py).
"""
from __future__ import annotations

import hashlib
import math
import os
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from spemusic.nn import compiled, recall
from spemusic.nn.attention import EPS
from spemusic.nn.recurrent import State

__all__ = ["StepGraph", "cache_dir"]

# called (no arguments) before a step is compiled on this machine for the first time: the
# command line says what the wait is
on_compile = None
# called with the message when compiling fails (None: a UserWarning): the command line's warning
on_failure = None


def cache_dir() -> Path:
    """Where compiled steps are kept: $SPEMUSIC_CACHE, else $XDG_CACHE_HOME/spemusic, else
    ~/.cache/spemusic; in its `steps` folder."""
    root = os.environ.get("SPEMUSIC_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spemusic"
    return Path(root) / "steps"


# --------------------------------------------------------------------------- the programs


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (B, n) fp32 @ w (m, n).T + b, accumulated in fp32: at batch 1 a multiply-and-sum (one
    vectorised loop reading w once), above it a matrix product that reuses each row of w."""
    if x.shape[0] == 1:
        y = (x[:, None, :] * w.float()).sum(-1)
    else:
        y = F.linear(x.to(w.dtype), w).float()
    return y if b is None else y + b.float()


def _norm(x: torch.Tensor, norm: tuple) -> torch.Tensor:
    weight, bias, eps = norm
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _echo(ids: torch.Tensor, carry: dict, cfg: tuple) -> torch.Tensor:
    """recall.bar_echo for one token per row, ids (B,), `carry` updated in place: the last
    ECHO_CONTEXT tokens with their keys and the index of their bar's Bar token, and the running
    counts a key is made of; with an echo head, the candidates it scores for the next token and
    whether each lag named each of the last tokens (`carry["cands"]`, `carry["got"]`). Indices
    count from the first token the carry was made from."""
    bar_id, lo, hi, none_id, bars, lags, marks = cfg
    n = carry["n"]  # (B,) this token's index
    is_bar, is_pos = ids == bar_id, (ids >= lo) & (ids < hi)
    bar = carry["bar"] + is_bar.long()
    last_bar = torch.where(is_bar, n, carry["last_bar"])
    last_pos = torch.where(is_pos, n, carry["last_pos"])
    pos_val = torch.where(is_pos, ids - lo + 1, carry["pos_val"])
    in_onset = last_pos > last_bar
    pos = torch.where(in_onset, pos_val, 0)
    place = (n - torch.maximum(last_bar, last_pos)).clamp(max=recall.ECHO_PLACES - 1)
    again = carry["again"] + (is_pos & carry["in_onset"] & (pos <= carry["pos"])).long()
    again_at_bar = torch.where(is_bar, again, carry["again_at_bar"])
    sweep = (again - again_at_bar).clamp(0, recall.ECHO_SWEEPS - 1)
    width = recall.ECHO_SWEEPS * (hi - lo + 1) * recall.ECHO_PLACES
    mine = torch.where(bar >= 1, bar * width + (sweep * (hi - lo + 1) + pos) * recall.ECHO_PLACES + place, -1)
    # this token's context: the carried tokens and itself. A bar whose Bar token has left it is
    # not echoed, as in the parallel path's window.
    seq = torch.cat([carry["ids"], ids[:, None]], 1)
    bar_at = torch.cat([carry["bar_at"], last_bar[:, None]], 1)
    keys = torch.cat([carry["keys"], mine[:, None]], 1)
    keys = torch.where(bar_at >= (n - recall.ECHO_CONTEXT)[:, None], keys, -1)
    echoes = recall.echo_back(seq, keys, mine[:, None], width, max([bars, *lags, *(m for _, m in marks)]), none_id)[:, 0]
    echo = recall.most_held(echoes[:, :bars], none_id)
    new = {}
    if marks:  # the Repeat mark in force (recall.mark_in_force): its lag's echo, and its lag's second table
        here = recall.mark_lags(ids, marks)
        lag = torch.where(is_bar, 0, torch.where(here > 0, here - 1, carry["mark"]))
        echo = torch.where(lag > 0, echoes.gather(1, (lag - 1).clamp(min=0)[:, None])[:, 0], echo)
        new["mark"] = lag
        if lags:
            new["marked"] = recall.marked_rows(lag, lags, carry["got"].shape[-1])
    if lags:  # whether each lag named this token, then its candidates for the next
        got = recall.named_right(carry["cands"], ids, none_id)
        new.update(got=torch.cat([carry["got"][..., 1:], got[..., None]], -1), cands=echoes[:, [k - 1 for k in lags]])
    new |= {"ids": seq[:, 1:], "keys": torch.cat([carry["keys"][:, 1:], mine[:, None]], 1), "bar_at": bar_at[:, 1:],
           "n": n + 1, "bar": bar, "last_bar": last_bar, "last_pos": last_pos, "pos_val": pos_val,
           "in_onset": in_onset, "pos": pos, "again": again, "again_at_bar": again_at_bar}
    for name, value in new.items():
        carry[name].copy_(value)
    return echo


def _intervals(ids: torch.Tensor, iv: dict, P: dict) -> None:
    """recall.interval_anchor for one token per row, ids (B,): its anchor and table written into
    iv's, its carry (B, 1 + 2S) updated in place."""
    programs, (lo, hi, bar_id) = P["interval_programs"], P["interval_cfg"]
    carry = iv["carry"]
    S = programs.shape[0]
    hit = ((ids >= lo) & (ids < hi))[:, None] & (carry[:, :1] == programs)  # (B, S): a part's pitch
    held = torch.where(hit, (ids - lo + 1)[:, None], carry[:, 1:1 + S])
    crossed = torch.where(hit, 0, torch.where((ids == bar_id)[:, None], 1, carry[:, 1 + S:]))
    slot = ids[:, None] == programs
    iv["anchor"].copy_(torch.where(slot, held, 0).sum(-1) - 1)
    iv["table"].copy_(torch.where(slot, 2 * torch.arange(S) + crossed, 0).sum(-1))
    carry.copy_(torch.cat([ids[:, None], held, crossed], 1))


def _input(ids: torch.Tensor, t: torch.Tensor, x: torch.Tensor, code: torch.Tensor | None,
           carry: dict | None, iv: dict | None, mh: dict | None, clock: torch.Tensor | None, kh: dict | None,
           P: dict) -> None:
    """The token ids (B,) at position t () float64 -> x (B, d): its embedding (and bar echo); code
    (2, H, D, R): the sineSPE code [Q̄_t; K̄_t] (SineSPE.code_at); with an interval head, where it
    reads (`_intervals`); with a melody head, what it reads of the bar's melody (recall.melody_reads
    over the echo's carried tokens and keys, this one's last); with a bar clock, its row (`clock`:
    recall.bar_clock's carry); with a key head, its reads (recall.pitch_profile, `kh`'s carry).
    Written in place."""
    if iv is not None:
        _intervals(ids, iv, P)
    emb = P["tok"][ids]
    if clock is not None:
        *rows, after = recall.bar_clock(ids[:, None], clock, *P["clock_cfg"])
        for table, r in zip(P["clock_tables"], rows):
            emb = emb + table[r[:, 0]]
        clock.copy_(after)
    if kh is not None:
        slot, profile, after = recall.pitch_profile(ids[:, None], kh["carry"], P["key_programs"], P["key_range"])
        kh["slot"].copy_(slot[:, 0])
        kh["profile"].copy_(profile[:, 0])
        kh["carry"].copy_(after)
    if carry is not None:
        emb = emb + P["echo_rows"][_echo(ids, carry, P["echo_cfg"])]
    if mh is not None:
        anchor, table, profile = recall.melody_reads(carry["ids"], carry["keys"], 1, *P["melody_cfg"])
        mh["anchor"].copy_(anchor[:, 0])
        mh["table"].copy_(table[:, 0])
        mh["profile"].copy_(profile[:, 0])
    x.copy_(emb)
    if code is not None:
        _, H, D, R = code.shape
        f = torch.sin(torch.remainder(P["spe_offs"] + P["spe_f2pi"] * t, 2 * math.pi).float())  # (H, D, 2, K, 2)
        qk = (f.view(H * D, 2, -1, 1) * P["spe_z"][:, None]).sum(-2)  # (H·D, 2, R)
        code.copy_(qk.view(H, D, 2, R).permute(2, 0, 1, 3))


def _layer(x: torch.Tensor, S: torch.Tensor, hist: torch.Tensor | None, code: torch.Tensor | None,
           L: dict) -> None:
    """Block.step in place: x (B, d), S (B, H, M, D+1) FAVOR+'s state, hist (B, K, d) the short
    convolution's last inputs (newest first), code as `_input` wrote it."""
    B, d = x.shape
    H, D = L["dims"]
    h = x
    if hist is not None:
        h = x + (hist * L["shift"]).sum(1)
        hist.copy_(torch.cat([x[:, None], hist[:, :-1]], 1))
    q, k, v = _linear(_norm(h, L["ln1"]), *L["qkv"]).view(B, 3, H, D).unbind(1)
    if code is not None:
        qbar, kbar = code[0], code[1]
        if "gate" in L:  # gated SPE: √(1-g) ⊙ code + √g ⊙ ε
            a, c = L["gate"]
            qbar, kbar = a * qbar + c * L["eps"], a * kbar + c * L["eps"]
        q, k = (q[..., None] * qbar).sum(-2), (k[..., None] * kbar).sum(-2)  # q̂, k̂ (B, H, R)
    omega_t = L["omega_t"]  # (dk, M), data scaling folded in
    pq, pk = (q[..., None] * omega_t).sum(-2), (k[..., None] * omega_t).sum(-2)
    qf = (pq - pq.amax(-1, keepdim=True)).exp()
    kf = (pk - (L["key_scale"] * (k * k).sum(-1, keepdim=True) + L["key_offset"])).exp()
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], -1)  # [v, 1]: the last column sums the normaliser
    s = S + kf[..., :, None] * v1[..., None, :]
    S.copy_(s)
    out = (qf[..., :, None] * s).sum(-2)
    h = h + _linear((out[..., :D] / (out[..., D:] + EPS)).reshape(B, d), *L["out"])
    x.copy_(h + _linear(F.gelu(_linear(_norm(h, L["ln2"]), *L["ff1"])), *L["ff2"]))


def _head(x: torch.Tensor, iv: dict | None, eh: dict | None, mh: dict | None, kh: dict | None,
          P: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (logits (B, V), the final-normed state (B, d)); with an interval head, its scores added
    to the Pitch logits (Performer.add_intervals); with an echo head, to its candidates'
    (recall.add_echo_scores; `eh`: the echo's carry as `_echo` left it); with a melody head, to
    the Pitch and Chord logits (Performer.add_melody; `mh` as `_input` wrote it); with a key head,
    to the Pitch logits (`kh` as `_input` wrote it)."""
    h = _norm(x, P["ln_f"])
    logits = _linear(h, P["tok"], None)
    if eh is not None:
        logits = recall.add_echo_scores(logits, P["echo_head_rows"], eh["cands"], eh["got"].sum(-1) + eh.get("marked", 0),
                                        P["echo_kind_offsets"])
    if iv is not None:
        rows, (lo, K) = P["interval_rows"], P["interval_reach"]
        interval = torch.arange(128) - iv["anchor"][:, None]
        which = torch.where(interval.abs() <= K, interval + K, 2 * K + 1)
        scores = rows[iv["table"]].gather(-1, which) * (iv["anchor"] >= 0)[:, None]
        logits = torch.cat([logits[:, :lo], logits[:, lo:lo + 128] + scores, logits[:, lo + 128:]], 1)
    if mh is not None:
        lo, K = P["melody_reach"]
        scores = recall.interval_scores(P["melody_rows"], torch.arange(128), mh["anchor"], mh["table"], K)
        logits = torch.cat([logits[:, :lo], logits[:, lo:lo + 128] + scores, logits[:, lo + 128:]], 1)
        if "chord_rows" in P:
            first, Q = P["melody_chords"]
            scores = recall.chord_scores(mh["profile"], P["roots"], P["chord_rows"])
            logits = torch.cat([logits[:, :first], logits[:, first:first + 12 * Q] + scores, logits[:, first + 12 * Q:]], 1)
    if kh is not None:
        lo = P["key_range"][0]
        scores = recall.key_scores(kh["slot"], kh["profile"], P["key_rows"], P["key_roots"], P["pitch_classes"])
        logits = torch.cat([logits[:, :lo], logits[:, lo:lo + 128] + scores, logits[:, lo + 128:]], 1)
        if "key_chord_rows" in P:
            first, Q = P["key_chords"]
            scores = recall.chord_scores(kh["profile"], P["key_roots"], P["key_chord_rows"])
            logits = torch.cat([logits[:, :first], logits[:, first:first + 12 * Q] + scores, logits[:, first + 12 * Q:]], 1)
    return logits, h


class _Fn(torch.nn.Module):
    """A function as the module torch.export takes."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


_SOURCE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
_CONSTANTS = (recall.ECHO_CONTEXT, recall.ECHO_PLACES, recall.ECHO_SWEEPS, EPS)  # compiled into the programs
# inductor's settings for these programs: a pointwise chain is materialised before a product
# reads it instead of being recomputed for every row of the weights (gelu's erf for each of
# d_ff's rows cost 3x the product)
_INDUCTOR = {"realize_opcount_threshold": 4}


class _Program:
    """fn compiled by AOTInductor for these arguments' shapes (loaded from the cache when there),
    run on exactly these tensors: `run()` after writing the new inputs into them."""

    def __init__(self, fn, args: tuple, name: str):
        leaves, spec = pytree.tree_flatten((args, {}))
        self.flat = [x for x in leaves if isinstance(x, torch.Tensor)]
        shapes = [(tuple(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor) else repr(x) for x in leaves]
        # (the loops are compiled for the number of threads in use: OpenMP's, fixed in the code)
        key = repr((name, str(spec), shapes, _SOURCE, _CONSTANTS, torch.__version__,
                    torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(), sorted(_INDUCTOR.items())))
        path = cache_dir() / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.pt2"
        if not path.exists():
            global on_compile
            if on_compile is not None:  # once a process
                announce, on_compile = on_compile, None
                announce()
            self._compile(fn, args, path)
        with warnings.catch_warnings():  # (torch's own deprecation notices, on unpickling its tree specs)
            warnings.simplefilter("ignore", FutureWarning)
            self.loader = torch._inductor.aoti_load_package(str(path)).loader

    @staticmethod
    def _compile(fn, args, path: Path) -> None:
        # export traces on copies outside inference mode (the state's tensors may be inference
        # tensors, which export cannot mutate)
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            copies = pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, args)
            program = torch.export.export(_Fn(fn), copies, strict=False)
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                out = torch._inductor.aoti_compile_and_package(program, package_path=str(Path(tmp) / path.name),
                                                               inductor_configs=dict(_INDUCTOR))
                os.replace(out, path)  # whole or not at all, whatever runs beside it

    def run(self):
        return self.loader.run(self.flat)


class StepGraph:
    """`Performer.step` for one State, on compiled programs (see the module doc). Make it with
    `StepGraph.of`, which answers None where the step cannot be compiled."""

    _failure: str | None = None  # why compiling failed in this process, once it has

    @staticmethod
    def serves(model) -> bool:
        cfg = model.cfg
        return (cfg.attention == "favor" and (cfg.pe == "none" or (cfg.pe == "sinespe" and cfg.share_pe))
                and not cfg.pitch_memory and model.abs_pe is None and model.device.type == "cpu")

    @classmethod
    def unavailable(cls) -> str | None:
        """Why steps run uncompiled in this process (None: they are compiled where served)."""
        if os.environ.get("SPEMUSIC_COMPILE", "").strip() == "0":
            return "SPEMUSIC_COMPILE=0"
        import torch._inductor  # (here: importing it takes as long as importing torch)

        if not hasattr(torch._inductor, "aoti_load_package"):
            return f"PyTorch {torch.__version__} has no AOTInductor packages (2.6 and later have)"
        return compiled.unavailable() or cls._failure

    @classmethod
    def of(cls, model, state: State) -> StepGraph | None:
        """The compiled step of `state` (its tensors become the programs' own), or None where the
        model is not served or compiling is unavailable or fails (warned once)."""
        if not cls.serves(model) or cls.unavailable() is not None:
            return None
        try:
            return cls(model, state)
        except Exception as e:  # noqa: BLE001 - export's and inductor's errors share no base class
            first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
            cls._failure = f"compiling the step failed ({type(e).__name__}: {first}); it runs uncompiled"
            if on_failure is not None:
                on_failure(cls._failure)
            else:
                warnings.warn(cls._failure, stacklevel=2)
            return None

    @torch.no_grad()
    def __init__(self, model, state: State):
        cfg, plan = model.cfg, state.plan
        B, H, D = state.batch_size, cfg.n_heads, cfg.d_head
        detach = lambda t: t.detach().contiguous()  # noqa: E731
        P = {"tok": detach(model.tok.weight.float()),
             "ln_f": (detach(model.ln_f.weight), detach(model.ln_f.bias), model.ln_f.eps)}
        self.code = None
        if cfg.uses_spe:
            tables = state.pe[0]
            P.update(spe_offs=detach(tables.offs), spe_f2pi=detach(tables.f2pi), spe_z=detach(tables.z))
            self.code = torch.zeros(2, H, D, cfg.n_realizations)
        self.carry, self.iv, self.eh = None, None, None
        if model.interval_head is not None:
            lo, hi = cfg.pitch_range
            P.update(interval_programs=torch.tensor(cfg.interval_head), interval_cfg=(lo, hi, cfg.bar_id),
                     interval_rows=detach(model.interval_head.weight.float()), interval_reach=(lo, cfg.interval_reach))
            carry = (state.recall or {}).get("interval")
            if carry is None:
                carry = torch.cat([torch.full((B, 1), -1), torch.zeros(B, 2 * len(cfg.interval_head))], 1).long()
            self.iv = {"carry": carry.contiguous(), "anchor": torch.zeros(B, dtype=torch.long),
                       "table": torch.zeros(B, dtype=torch.long)}
            state.recall = {**(state.recall or {}), "interval": self.iv["carry"]}  # kept current by the program
        if model.bar_echo is not None:
            bar_id, lo, hi = cfg.bar_echo
            lags, marks = tuple(cfg.echo_head), tuple(tuple(m) for m in cfg.repeat_marks)
            P.update(echo_rows=detach(model.bar_echo.weight.float()),
                     echo_cfg=(bar_id, lo, hi, cfg.vocab_size, cfg.echo_bars, lags, marks))
            self.carry = _echo_carry((state.recall or {}).get("echo"), B, bar_id, lo, hi, cfg.vocab_size,
                                     cfg.echo_bars, lags, cfg.echo_window, marks)
            if lags:
                P["echo_head_rows"] = detach(model.echo_head.weight.float())
                P["echo_kind_offsets"] = model.echo_kind_offsets
                self.eh = {k: self.carry[k] for k in ("cands", "got", "marked") if k in self.carry}
            state.recall = {**(state.recall or {}), "echo": self.carry["ids"]}  # the same tensor, kept current
        self.mh = None
        if model.melody_head is not None:
            P.update(melody_cfg=(cfg.melody_head[0], model.melody_parts, tuple(cfg.pitch_range), tuple(cfg.bar_echo[1:]),
                                 model.melody_durations),
                     melody_rows=detach(model.melody_head.weight.float()),
                     melody_reach=(cfg.pitch_range[0], cfg.interval_reach))
            if model.chord_head is not None:
                P.update(chord_rows=detach(model.chord_head.weight.float()), roots=model.roots,
                         melody_chords=tuple(cfg.melody_chords))
            self.mh = {"anchor": torch.zeros(B, dtype=torch.long), "table": torch.zeros(B, dtype=torch.long),
                       "profile": torch.zeros(B, 12)}
        self.clock = None
        if model.bar_clock is not None:
            P.update(clock_tables=[detach(t.weight.float()) for t in model.clocks], clock_cfg=tuple(cfg.bar_clock))
            clock = (state.recall or {}).get("clock")
            self.clock = (torch.tensor([recall.CLOCK_START]).repeat(B, 1) if clock is None else clock).contiguous()
            state.recall = {**(state.recall or {}), "clock": self.clock}  # kept current by the program
        self.kh = None
        if model.key_head is not None:
            P.update(key_programs=model.key_programs, key_range=tuple(cfg.pitch_range), key_roots=model.key_roots,
                     pitch_classes=model.pitch_classes, key_rows=detach(model.key_head.weight.float()))
            if model.key_chords is not None:
                P.update(key_chord_rows=detach(model.key_chords.weight.float()), key_chords=tuple(cfg.key_chords))
            carry = (state.recall or {}).get("key")
            if carry is None:
                carry = torch.cat([torch.full((B, 1), -1), torch.zeros(B, 12)], 1).long()
            self.kh = {"carry": carry.contiguous(), "slot": torch.zeros(B, dtype=torch.long), "profile": torch.zeros(B, 12)}
            state.recall = {**(state.recall or {}), "key": self.kh["carry"]}  # kept current by the program
        self.ids = torch.zeros(B, dtype=torch.long)
        self.t = torch.zeros((), dtype=torch.float64)
        self.x = torch.zeros(B, cfg.d_model)
        self.state = state
        for i in range(cfg.n_layers):  # the programs write the state's own tensors
            state.layers[i] = state.layers[i].contiguous()
            if cfg.short_conv:
                state.histories[i] = state.histories[i].contiguous()
        layers = []
        for blk, lp in zip(model.blocks, plan.layers):
            L = {"dims": (H, D), "ln1": (detach(blk.ln1.weight), detach(blk.ln1.bias), blk.ln1.eps),
                 "ln2": (detach(blk.ln2.weight), detach(blk.ln2.bias), blk.ln2.eps),
                 "qkv": lp.qkv, "out": lp.out, "ff1": lp.ff[0], "ff2": lp.ff[1], "omega_t": lp.omega_t,
                 "key_scale": lp.key_scale, "key_offset": lp.key_offset.view(())}
            if lp.gate is not None:
                g = detach(blk.attn.filter.gate_values())
                L.update(gate=(torch.sqrt(1 - g)[..., None], torch.sqrt(g)[..., None]), eps=plan.codes[0].eps)
            if blk.shift is not None:
                L["shift"] = detach(blk.shift.float())[None]  # (1, K, d)
            layers.append(L)
        hist = lambda i: state.histories[i] if cfg.short_conv else None  # noqa: E731
        tag = f"{cfg.vocab_size}v{cfg.n_layers}x{cfg.d_model}-b{B}-{str(plan.weights_dtype).split('.')[-1]}"
        self.input = _Program(_input, (self.ids, self.t, self.x, self.code, self.carry, self.iv, self.mh, self.clock, self.kh, P),
                              f"input-{tag}")
        self.layers = [_Program(_layer, (self.x, state.layers[i], hist(i), self.code, L), f"layer-{tag}")
                       for i, L in enumerate(layers)]
        self.head = _Program(_head, (self.x, self.iv, self.eh, self.mh, self.kh, P), f"head-{tag}")

    @torch.no_grad()
    def __call__(self, state: State, next_ids: torch.Tensor, want_hidden: bool = False):
        """As Performer.step: (logits (B, V), state[, the final-normed state (B, d)])."""
        if state is not self.state:
            raise ValueError("a StepGraph steps the State it was made for")
        self.ids.copy_(next_ids)
        self.t.fill_(float(state.position))
        self.input.run()
        for layer in self.layers:
            layer.run()
        logits, hidden = self.head.run()
        state.position += 1
        return (logits, state, hidden) if want_hidden else (logits, state)


def _echo_carry(tail: torch.Tensor | None, B: int, bar_id: int, lo: int, hi: int, none_id: int, bars: int,
                lags: tuple, window: int, marks: tuple = ()) -> dict:
    """The echo's carry after the tokens of `tail` (B, ECHO_CONTEXT) (-1: before the piece; None:
    nothing yet), as recall.bar_echo computes its keys over that window (and the echo head its
    candidates and their hits, recall.echo_features)."""
    C = recall.ECHO_CONTEXT
    seq = torch.full((B, C), -1, dtype=torch.long) if tail is None else tail.clone()
    places = recall.echo_places(seq, bar_id, (lo, hi))
    key, last_bar = places.pop("key"), places["last_bar"]
    carry = {"ids": seq, "keys": key, "bar_at": torch.where(places["bar"] >= 1, last_bar, -1).contiguous(),
             "n": torch.full((B,), C), **{k: v[:, -1].clone() for k, v in places.items()}}
    if lags:
        width = recall.ECHO_SWEEPS * (hi - lo + 1) * recall.ECHO_PLACES
        echoes = recall.echo_back(seq, key, key[:, -window - 1:], width, max([bars, *lags]), none_id)
        cands = echoes[..., [k - 1 for k in lags]]  # (B, window + 1, K): for the tokens after each
        got = recall.named_right(cands[:, :-1], seq[:, -window:], none_id)
        carry.update(cands=cands[:, -1].contiguous(), got=got.transpose(1, 2).contiguous())
    if marks:
        lag = recall.mark_in_force(seq, last_bar, marks)[:, -1].contiguous()
        carry["mark"] = lag
        if lags:
            carry["marked"] = recall.marked_rows(lag, lags, window).contiguous()
    return carry
