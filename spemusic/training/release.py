"""Turn a training checkpoint into a shipped model: fp16 weights (FAVOR+ features kept in fp32)
and a model card whose figures come from `spemusic eval` on the same file.

    python -m spemusic.training.release runs/pop/best checkpoints/pop-piano --name pop-piano \\
        --data ../shared/data/pop909 --credit "POP909 (MIT)" --command "spemusic train …"
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch

from ..nn.checkpoint import WEIGHTS, load_model, write_weights
from ..options import SAMPLING_DEFAULTS, model_sampling


def export(src: Path, dest: Path, name: str, data: Path, credit: str, command: str, eval_len: int | None = None,
           beats: Path | None = None, chords: Path | None = None, sampling: dict | None = None) -> dict:
    """`sampling`: the sampling defaults the checkpoint records, beyond those of its name
    (spemusic.options.model_sampling); generate, continue and spemusic.generation.pieces sample it with them."""
    from ..generation.sampling import SamplingOptions
    from .evaluate import evaluate_nll

    model, tok, info = load_model(src, return_info=True)
    defaults = model_sampling(name, **(sampling or {}))
    SamplingOptions(**defaults).check()
    shipped = copy.deepcopy(model)
    for p in shipped.parameters():  # parameters in fp16; buffers (FAVOR+ features) stay fp32
        p.data = p.data.half()
    dest.mkdir(parents=True, exist_ok=True)
    info = {**info, "name": name, "data_name": credit, "data": Path(data).name, "sampling": defaults}
    if "trained_tokens" not in info:  # runs from before training recorded it (trained with the default transposition)
        from .data import open_dataset, trained_vocabulary
        from .train import TrainConfig

        info["trained_tokens"] = trained_vocabulary(open_dataset(Path(data), tok.config, beats_dir=beats,
                                                                 chords_dir=chords), TrainConfig.transpose)
    write_weights(dest / WEIGHTS, shipped, tok.config, info)

    # the card's figures are measured on the shipped file itself
    model, tok, info = load_model(dest / WEIGHTS, return_info=True)
    seq_len = int(info["seq_len"])
    eval_len = eval_len or 2 * seq_len
    report = evaluate_nll(model, tok, Path(data), "valid", eval_len, 128, name=name, trained_len=seq_len,
                          beats_dir=beats, chords_dir=chords)
    annotations = "".join(f" --{k} {v}" for k, v in (("beats", beats), ("chords", chords)) if v)
    within = report.mean_between(0, seq_len)
    beyond = report.mean_between(seq_len, eval_len)
    cfg = model.cfg.to_dict()
    echo = ", bar echo" + (f" over {cfg['echo_bars']} bars" if cfg.get("echo_bars", 1) > 1 else "")
    clock = ", the bars since the piece began" + {4: " and since its melody came in",
                                                  5: ", since its melody came in and since it last played"}.get(
        len(cfg.get("bar_clock", [])), "")
    recall = "".join(text for key, text in (("pitch_memory", ", pitch memory of the parts"),
                                                    ("interval_head", ", each part's pitch also scored as an interval"),
                                                    ("bar_echo", echo),
                                                    ("echo_head", ", the echoes 1-8 bars back also scored as the next token"),
                                                    ("melody_head", ", the accompaniment and chords also scored by the melody"),
                                                    ("bar_clock", clock),
                                                    ("key_head", (", the parts' pitches also scored by the piece's "
                                                                 "pitch classes so far")))
                     if cfg.get(key))
    sampling_flag = f" --sampling {','.join(f'{k}={v:g}' for k, v in sampling.items())}" if sampling else ""
    card = f"""# {name}

A Performer (FAVOR+ linear attention) with gated sineSPE, shipped with spemusic. Trained on
{credit}, train split; figures measured on its valid split. Credit: "trained on POP909 (MIT) and
the Groove MIDI Dataset (CC BY 4.0)" covers both shipped models.

| | |
|---|---|
| parameters | {info['parameters']:,} (weights stored in fp16, FAVOR+ features in fp32) |
| positional encoding | {cfg['pe']}{' gated' if cfg['gated'] else ''}, {cfg['n_sines']} sines, R = {cfg['n_realizations']}, shared across layers |
| model | {cfg['n_layers']} layers, d_model {cfg['d_model']}, {cfg['n_heads']} heads, d_ff {cfg['d_ff']}, {cfg['n_features']} FAVOR+ features{f", short convolution of {cfg['short_conv']} tokens" if cfg.get('short_conv') else ''}{recall} |
| tokenizer | REMI, {tok.config.beat_resolution} steps per quarter, {len(tok)} tokens (fingerprint {tok.config.fingerprint()}) |
| trained length | {seq_len} tokens |
| steps | {info['step']:,} |
| tokens seen | {info['tokens']:,} |
| train loss (last log window) | {info['train_loss']:.4f} |
| valid loss at the checkpoint (training's fixed windows) | {info['valid_loss']:.4f} |
| **valid NLL, `spemusic eval`, positions 0–{eval_len}** | **{report.mean_nll:.4f}** over {report.pieces} pieces |
| valid NLL within the trained length (0–{seq_len}) | {within:.4f} |
| valid NLL beyond it ({seq_len}–{eval_len}) | {beyond:.4f} |
| valid nats per note / per bar (same span) | {report.nats_per_note:.4f} / {report.nats_per_bar:.2f} ({report.notes:,} notes, {report.bars:,} bars) |
| sampling defaults (recorded in the checkpoint) | {", ".join(f"{k} {v:g}" for k, v in defaults.items())} |

Reproduce the figures:

```bash
spemusic eval {name} {data} --max-len {eval_len}{annotations}
```

Reproduce the model:

```bash
{command}
python -m spemusic.training.release RUN_DIR/best checkpoints/{name} --name {name} --data {data} --credit "{credit}"{annotations}{sampling_flag}
```
"""  # noqa: E501 - a row of the card's table is one line
    (dest / "README.md").write_text(card)
    return {"mean_nll": report.mean_nll, "within": within, "beyond": beyond, "eval_len": eval_len}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--name", required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--credit", required=True)
    ap.add_argument("--command", default="spemusic train …")
    ap.add_argument("--eval-len", type=int, default=None)
    ap.add_argument("--beats", type=Path, default=None, help="beat annotations of DATA (as for data prepare)")
    ap.add_argument("--chords", type=Path, default=None, help="chord annotations of DATA")
    ap.add_argument("--sampling", type=_sampling_flag, default=None, metavar="KEY=VALUE,…",
                    help=f"sampling defaults to record beyond the name's ({', '.join(SAMPLING_DEFAULTS)})")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(json.dumps(export(args.src, args.dest, args.name, args.data, args.credit, args.command, args.eval_len,
                            args.beats, args.chords, args.sampling)))


def _sampling_flag(text: str) -> dict:
    """"top_p=0.8,bar_top_p=0.8" -> {"top_p": 0.8, "bar_top_p": 0.8} (argparse's type: a bad one is its error)."""
    pairs = [item.partition("=") for item in text.split(",") if item]
    bad = [k for k, eq, _ in pairs if k not in SAMPLING_DEFAULTS or not eq]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad[0]!r} is not one of {', '.join(SAMPLING_DEFAULTS)} given as KEY=VALUE")
    try:
        return {k: float(v) for k, _, v in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"not KEY=NUMBER,…: {text!r}") from None


if __name__ == "__main__":
    main()
