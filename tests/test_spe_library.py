"""SPE as a library (README, "SPE as a library"): its PyTorch example runs as written, in a plain
linear-attention layer outside spemusic's model, and equals the naive O(T²) attention with the
same draws; the streaming form gives the parallel form's q̂, k̂; importing it pulls no MIDI code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_blocks() -> list[str]:
    section = README.read_text().split("## SPE as a library", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def naive_causal_attention(q_hat, k_hat, v):
    """The O(T²) form: every position's weights over the positions up to it, normalised."""
    a = torch.einsum("bmhr,bnhr->bhmn", F.elu(q_hat) + 1, F.elu(k_hat) + 1)
    a = a * torch.tril(torch.ones(a.shape[-2:]))
    return torch.einsum("bhmn,bnhd->bmhd", a / a.sum(-1, keepdim=True), v)


def test_readme_example_is_linear_attention_with_spe():
    scope: dict = {}
    exec(readme_blocks()[0], scope)
    q_hat, k_hat, v, out = (scope[n] for n in ("q_hat", "k_hat", "v", "out"))
    assert q_hat.shape == (2, 256, 4, 64)
    torch.testing.assert_close(out, naive_causal_attention(q_hat, k_hat, v), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(scope["q0_hat"], q_hat[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scope["k0_hat"], k_hat[:, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["sine", "conv"])
def test_streaming_gives_the_parallel_codes(kind):
    from spemusic.nn.spe import ConvSPE, SineSPE, SPEFilter

    torch.manual_seed(0)
    H, D, T, start = 2, 8, 40, 300
    spe = SineSPE(H, D, n_realizations=16) if kind == "sine" else ConvSPE(H, D, kernel_size=16, n_realizations=16)
    spe_filter = SPEFilter(H, D, gated=True)
    with torch.no_grad():
        spe_filter.gate.normal_()
    q, k = torch.randn(1, T, H, D), torch.randn(1, T, H, D)
    code = spe.draw(seed=(4,))
    q_hat, k_hat = spe_filter(q, k, spe.context(code, start=start, T=T))
    stream = spe.stream_init(code, start=start)
    for t in range(T):
        qt, kt = spe_filter.step(q[:, t], k[:, t], spe.code_at(code, stream, start + t), code.eps)
        torch.testing.assert_close(qt, q_hat[:, t], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kt, k_hat[:, t], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="eps"):
        spe_filter.step(q[:, 0], k[:, 0], spe.code_at(code, stream, start + T))


def test_importing_spe_pulls_no_midi_code():
    code = ("import sys, spemusic.nn.spe; "
            "print(sorted(m for m in ('symusic', 'miditoolkit', 'pretty_midi', 'mido') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


@pytest.mark.jax
def test_readme_jax_example_runs():
    pytest.importorskip("jax")  # tests/test_spe_jax.py fails in CI without it
    scope: dict = {}
    exec(readme_blocks()[1], scope)
    assert scope["q_hat"].shape == (2, 256, 4, 64)
