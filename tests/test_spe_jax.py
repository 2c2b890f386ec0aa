"""The JAX/Flax SPE (spemusic.nn.spe_jax) against the PyTorch one, on the same parameters and the
same draws: codes, q̂ and k̂, a causal linear attention's output, and the streaming form."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from spemusic.nn import spe

# JAX is imported when these tests run, and they run last (conftest.py): JAX starts threads,
# which a later test's fork (data prepare's workers) would copy
pytestmark = pytest.mark.jax
jax = jnp = spe_jax = None


@pytest.fixture(autouse=True, scope="module")
def _jax():
    global jax, jnp, spe_jax
    if os.environ.get("CI"):  # CI installs the jax extra: a missing JAX is a failure there, not a skip
        import jax
    else:
        jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from spemusic.nn import spe_jax


H, D, R, B, T = 2, 4, 16, 2, 48
TOL = 1e-5


def torch_and_jax(kind: str):
    """A PyTorch code generator with moved parameters, its Flax twin and variables, and one draw
    of it in both (the same numbers)."""
    torch.manual_seed(3)
    if kind == "sine":
        gen = spe.SineSPE(H, D, n_sines=3, n_realizations=R)
        twin = spe_jax.SineSPE(H, D, n_sines=3, n_realizations=R)
    else:
        gen = spe.ConvSPE(H, D, kernel_size=8, n_realizations=R)
        twin = spe_jax.ConvSPE(H, D, kernel_size=8, n_realizations=R)
    with torch.no_grad():
        for p in gen.parameters():
            p.add_(0.3 * torch.randn_like(p))
    code = gen.draw((11,))
    return gen, twin, spe_jax.params_from_torch(gen), code


def jax_code(kind, gen, code, first: int, last: int):
    """The torch draw as a JAX code; for convSPE, its noise over positions first … last - 1."""
    if kind == "sine":
        return spe_jax.SineCode(jnp.asarray(code.z.numpy()), jnp.asarray(code.eps.numpy()))
    table = gen.noise(code, first, last, "cpu")
    return spe_jax.ConvCode(jnp.asarray(code.eps.numpy()), noise=jnp.asarray(table.numpy()), noise_start=first)


def close(a, b):
    a, b = np.asarray(a), (b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b))
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, atol=TOL, rtol=TOL)


def causal_linear_attention(q, k, v, xp):
    """elu + 1 features, causal, in numpy-like `xp` (torch or jax.numpy)."""
    elu1 = (lambda x: torch.nn.functional.elu(x) + 1) if xp is torch else (lambda x: jax.nn.elu(x) + 1)
    q, k = elu1(q), elu1(k)
    kv = xp.cumsum(xp.einsum("bthr,bthd->bthrd", k, v), 1)
    num = xp.einsum("bthr,bthrd->bthd", q, kv)
    return num / xp.einsum("bthr,bthr->bth", q, xp.cumsum(k, 1))[..., None]


@pytest.mark.parametrize("kind", ["sine", "conv"])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("start", [0, 1000])
def test_jax_matches_torch(kind, gated, start):
    gen, twin, variables, code = torch_and_jax(kind)
    with jax.enable_x64(True):  # float64 phases, as the PyTorch sineSPE forms them
        jcode = jax_code(kind, gen, code, start - 8, start + T)
        qbar, kbar = twin.apply(variables, jcode, start, T)
        tq, tk = spe.SPE.materialize(gen.context(code, start, T))
        close(qbar, tq)
        close(kbar, tk)

        torch.manual_seed(5)
        filt = spe.SPEFilter(H, D, gated=gated)
        if gated:
            with torch.no_grad():
                filt.gate.normal_()
        q, k, v = (torch.randn(B, T, H, D) for _ in range(3))
        th, tkh = filt(q, k, gen.context(code, start, T))
        jfilt = spe_jax.SPEFilter(H, D, gated=gated)
        fvars = spe_jax.params_from_torch(filt)
        jq, jk, jv = (jnp.asarray(x.numpy()) for x in (q, k, v))
        qh, kh = jax.jit(lambda fv, a, b, c: jfilt.apply(fv, a, b, c, jcode.eps))(fvars, jq, jk, (qbar, kbar))
        close(qh, th)
        close(kh, tkh)
        close(causal_linear_attention(qh, kh, jv, jnp), causal_linear_attention(th, tkh, v, torch))

        # streaming: one position at a time, in both, as the parallel form
        stream = gen.stream_init(code, start, "cpu")
        jstream = twin.apply(variables, jcode, start, method="stream_init") if kind == "conv" else None
        for t in range(start, start + 6):
            code_t = gen.code_at(code, stream, t)
            if kind == "conv":
                jstream, jcode_t = twin.apply(variables, jcode, jstream, t, method="code_at")
            else:
                jcode_t = twin.apply(variables, jcode, t, method="code_at")
            close(jcode_t, code_t)
            sq, sk = jfilt.apply(fvars, jq[:, t - start], jk[:, t - start], jcode_t, jcode.eps, method="step")
            close(sq, filt.step(q[:, t - start], k[:, t - start], code_t, code.eps)[0])
            close(sq, qh[:, t - start])
            close(sk, kh[:, t - start])


def test_jax_draws_follow_the_key():
    """One key, one realization: the parallel codes and the streamed ones agree, under jit."""
    twin = spe_jax.ConvSPE(H, D, kernel_size=8, n_realizations=R)
    key = jax.random.key(0)
    code = twin.draw(key)
    variables = twin.init(jax.random.key(1), code, 0, T)
    again = twin.draw(key)
    qbar, _ = jax.jit(lambda v, c: twin.apply(v, c, 0, T))(variables, code)
    qbar2, _ = twin.apply(variables, again, 0, T)
    close(qbar, qbar2)
    stream = twin.apply(variables, code, 0, method="stream_init")
    step = jax.jit(lambda v, c, s, t: twin.apply(v, c, s, t, method="code_at"))
    for t in range(10):
        stream, code_t = step(variables, code, stream, t)
        close(code_t[0], qbar[t])
    other = twin.draw(jax.random.key(2))
    assert not np.allclose(np.asarray(twin.apply(variables, other, 0, T)[0]), np.asarray(qbar))
