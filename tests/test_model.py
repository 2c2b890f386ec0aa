"""Model tests: SPE statistics, FAVOR+ chunked vs recurrent paths, PE options.

All on CPU and fast (tiny configs)."""
import math

import pytest
import torch

from spemusic.errors import SpemusicError
from spemusic.nn.attention import orthogonal_features
from spemusic.nn.model import ModelConfig, Performer
from spemusic.nn.spe import ConvSPE, SineSPE, SPEFilter

V = 97


def _model(**kw) -> Performer:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=V, **kw)
    m = Performer(cfg)
    # Sharpen the random model so the comparison is meaningful: larger logits,
    # peakier attention, larger q/k norms (exercises the FAVOR+ stabiliser).
    with torch.no_grad():
        m.tok.weight.mul_(50.0)
        for b in m.blocks:
            b.attn.qkv.weight.mul_(3.0)
            if b.shift is not None:  # the short convolution starts at zero: give it a say
                b.shift.normal_(0.0, 0.5)
        if m.spe is not None:
            for s in m.spe:
                if isinstance(s, SineSPE):
                    s.freqs.add_(2.0)  # higher frequencies: positions matter more
    return m.eval()


PE_CASES = [
    ("sinespe", True, "favor"),
    ("sinespe", False, "favor"),
    ("convspe", True, "favor"),
    ("convspe", False, "favor"),
    ("ape", True, "favor"),
    ("sinusoidal", True, "favor"),
    ("axial", True, "favor"),
    ("axial-continuous", True, "favor"),
    ("none", True, "favor"),
    ("sinespe", True, "softmax"),
    ("none", True, "softmax"),
    ("sinespe", True, "favor", 0),  # no short convolution: models trained before it
    ("convspe", False, "softmax", 1),
]


@pytest.mark.parametrize("pe,gated,attention,short_conv", [c if len(c) == 4 else (*c, 4) for c in PE_CASES])
def test_parallel_equals_recurrent(pe, gated, attention, short_conv):
    m = _model(pe=pe, gated=gated, attention=attention, short_conv=short_conv)
    m.resample(7)
    T = 1024
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = m(ids)
    assert full.shape == (2, T, V)
    assert full.abs().max() > 1.0  # the comparison is not between tiny numbers

    # prime on the first half + step over the second half
    lp, st = m.prime(ids[:, : T // 2])
    outs = [lp]
    for t in range(T // 2, T):
        logits, st = m.step(st, ids[:, t])
        outs.append(logits[:, None])
    assert st.position == T
    primed = torch.cat(outs, 1)
    assert (primed - full).abs().max().item() <= 1e-4

    # step alone from the start
    st = m.init_state(2)
    outs = []
    for t in range(T):
        logits, st = m.step(st, ids[:, t])
        outs.append(logits[:, None])
    stepped = torch.cat(outs, 1)
    assert (stepped - full).abs().max().item() <= 1e-4
    if attention == "favor":
        for s in st.layers:  # O(1) state: (B, H, M, Dv+1) fp32
            assert s.shape == (2, m.cfg.n_heads, m.cfg.n_features, m.cfg.d_head + 1)
            assert s.dtype == torch.float32


def _forward_and_steps(m, ids) -> torch.Tensor:
    """The parallel pass's logits, checked against the recurrent path's from the start."""
    with torch.no_grad():
        full = m(ids)
    st = m.init_state(ids.shape[0])
    stepped = torch.stack([m.step(st, ids[:, t])[0] for t in range(ids.shape[1])], 1)
    assert (stepped - full).abs().max().item() <= 1e-4
    return full


@pytest.mark.parametrize("short_conv", [0, 4])
def test_forward_and_step_share_the_ffn(monkeypatch, short_conv):
    """The FFN is written once (Block.ffn): changed, it changes the parallel pass and the step
    alike, which still agree."""
    from spemusic.nn.model import Block

    m = _model(pe="sinespe", short_conv=short_conv)
    m.resample(7)
    ids = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(1))
    before = _forward_and_steps(m, ids)
    ffn = Block.ffn
    monkeypatch.setattr(Block, "ffn", lambda self, x, weights=None: 2 * ffn(self, x, weights))
    assert (_forward_and_steps(m, ids) - before).abs().max() > 1.0


@pytest.mark.parametrize("pe,gated", [("sinespe", True), ("convspe", False), ("none", True)])
@pytest.mark.parametrize("name", ["favor_query", "favor_key"])
def test_forward_and_step_share_phi(monkeypatch, name, pe, gated):
    """FAVOR+'s φ is written once (attention.favor_query, favor_key): another feature map in its
    place changes the parallel pass and the step alike, which still agree."""
    import spemusic.nn.attention
    import spemusic.nn.model

    m = _model(pe=pe, gated=gated)
    m.resample(7)
    ids = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(1))
    before = _forward_and_steps(m, ids)
    phi = getattr(spemusic.nn.attention, name)
    assert getattr(spemusic.nn.model, name) is phi
    for module in (spemusic.nn.attention, spemusic.nn.model):
        monkeypatch.setattr(module, name, lambda *args: phi(*args) ** 2)  # another positive feature map
    assert (_forward_and_steps(m, ids) - before).abs().max() > 1.0


@pytest.mark.parametrize("pe,gated,attention,short_conv", [c if len(c) == 4 else (*c, 4) for c in PE_CASES])
def test_prime_in_chunks_equals_one_pass(pe, gated, attention, short_conv):
    """A long prompt is primed a chunk at a time (flat memory): the same logits and the same state
    as one pass, chunks shorter than the short convolution and uneven last chunks included."""
    m = _model(pe=pe, gated=gated, attention=attention, short_conv=short_conv)
    m.resample(5)
    ids = torch.randint(0, V, (2, 300), generator=torch.Generator().manual_seed(3))
    full, st_full = m.prime(ids)
    for chunk in (3, 64, 77):
        lp, st = m.prime(ids, chunk=chunk)
        assert lp.shape == full.shape and (lp - full).abs().max().item() <= 1e-4, chunk
        last, _ = m.prime(ids, chunk=chunk, all_logits=False)
        assert last.shape == (2, 1, V) and (last[:, 0] - full[:, -1]).abs().max().item() <= 1e-4
        assert st.position == st_full.position == 300
        nxt = torch.randint(0, V, (2,), generator=torch.Generator().manual_seed(4))
        a, _ = m.step(st, nxt)
        b, _ = m.step(st_full.clone(), nxt)
        assert (a - b).abs().max().item() <= 1e-4, chunk


@pytest.mark.parametrize("pe,gated,dtype,tol", [("sinespe", True, torch.float16, 2e-3), ("convspe", False, torch.float16, 2e-3),
                                               ("none", False, torch.float16, 2e-3), ("sinespe", True, torch.bfloat16, 1e-2)])
def test_half_precision_step_weights(pe, gated, dtype, tol):
    """Half-precision copies of the linear weights for the step: close to the fp32 function
    (fp16 measured 3-4e-4 of the logits' range, bf16 ~8x that), state and parameters stay fp32."""
    m = _model(pe=pe, gated=gated)
    m.resample(3)
    ids = torch.randint(0, V, (2, 300), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = m(ids)
    _, st = m.prime(ids[:, :100], weights_dtype=dtype)
    assert all(lp.qkv[0].dtype == dtype and lp.ff[1][0].dtype == dtype for lp in st.plan.layers)
    outs = []
    for t in range(100, 300):
        logits, st = m.step(st, ids[:, t])
        outs.append(logits)
    diff = (torch.stack(outs, 1) - full[:, 100:]).abs().max().item()
    assert 1e-6 < diff < tol * full.abs().max().item()
    assert all(s.dtype == torch.float32 for s in st.layers)
    assert all(p.dtype == torch.float32 for p in m.parameters())


def test_eval_mode_is_a_fixed_function_and_training_redraws():
    m = _model(pe="sinespe")
    ids = torch.randint(0, V, (1, 64))
    with torch.no_grad():
        a = m(ids)  # lazily behaves as resample(0)
        m.resample(0)
        b = m(ids)
        m.resample(1)
        c = m(ids)
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-3
    m.train()
    with torch.no_grad():
        d, e = m(ids), m(ids)
    assert (d - e).abs().max() > 1e-3  # a fresh SPE code per training forward


def test_favor_features_are_persistent_and_kept_by_resample():
    m = _model(pe="sinespe")
    sd = m.state_dict()
    keys = [k for k in sd if k.endswith("omega")]
    assert len(keys) == m.cfg.n_layers
    om = sd[keys[0]].clone()
    m.resample(5)
    assert torch.equal(m.state_dict()[keys[0]], om)
    m.resample(5, redraw_features=True)
    assert not torch.equal(m.state_dict()[keys[0]], om)
    m2 = Performer(m.cfg)
    m2.load_state_dict(m.state_dict())
    m.redraw_features(torch.Generator().manual_seed(3))
    assert not torch.equal(m.state_dict()[keys[0]], m2.state_dict()[keys[0]])


# ----------------------------------------------------------------------- SPE statistics
# Each realization r gives an unbiased estimate R·q̂_m[r]·k̂_n[r] of
# Σ_d q_d k_d P_d(m-n). We average N = R realizations and accept a deviation of
# 5 standard errors (sample std / √N): a false failure has probability < 1e-6
# (and the test is seeded).


def _estimate(qbar_m, kbar_n, q, k):
    """qbar_m, kbar_n: (H, D, R); q, k: (H, D) -> per-head mean and standard error."""
    R = qbar_m.shape[-1]
    qh = torch.einsum("hd,hdr->hr", q, qbar_m).double()
    kh = torch.einsum("hd,hdr->hr", k, kbar_n).double()
    samples = R * qh * kh  # (H, R)
    return samples.mean(-1), samples.std(-1) / math.sqrt(R)


def test_sinespe_relative_in_expectation():
    torch.manual_seed(0)
    H, D, K, R = 2, 4, 3, 100_000
    spe = SineSPE(H, D, K, R)
    with torch.no_grad():
        spe.freqs.add_(2.0)
    q, k = torch.randn(H, D), torch.randn(H, D)
    code = spe.draw((1,))
    lag = 7
    estimates = []
    for m0 in (10, 1_010, 100_010):
        qbar, kbar = SineSPE.materialize(spe.context(code, m0 - lag, lag + 1))  # positions m0 - lag … m0
        est, se = _estimate(qbar[lag], kbar[0], q, k)
        target = (q * k * spe.kernel(torch.tensor(float(lag)))).sum(-1).double()
        assert ((est - target).abs() <= 5 * se).all(), (m0, est, target, se)
        estimates.append((est, se))
    # the same lag at different absolute positions: same value
    (e0, s0), (e1, s1), (e2, s2) = estimates
    assert ((e0 - e1).abs() <= 5 * (s0**2 + s1**2).sqrt()).all()
    assert ((e0 - e2).abs() <= 5 * (s0**2 + s2**2).sqrt()).all()
    # and a different lag gives a (clearly) different kernel value somewhere
    assert (spe.kernel(torch.tensor(7.0)) - spe.kernel(torch.tensor(0.0))).abs().max() > 0.05


def test_convspe_relative_in_expectation():
    torch.manual_seed(0)
    H, D, L, R = 2, 3, 8, 20_000
    spe = ConvSPE(H, D, L, R)
    with torch.no_grad():  # make Q and K filters different (asymmetric P)
        spe.filters[1].copy_(torch.randn(H, D, L) / math.sqrt(L))
    q, k = torch.randn(H, D), torch.randn(H, D)
    code = spe.draw((123,))
    P = spe.cross_correlation()  # (2L-1, H, D), index tau + L - 1
    for m0, n0 in ((5, 2), (405, 402), (2, 5), (300, 300), (20, 5)):
        start = min(m0, n0)
        T = abs(m0 - n0) + 1
        qbar, kbar = ConvSPE.materialize(spe.context(code, start, T))
        est, se = _estimate(qbar[m0 - start], kbar[n0 - start], q, k)
        tau = m0 - n0
        Pt = P[tau + L - 1] if abs(tau) < L else torch.zeros(H, D)
        target = (q * k * Pt).sum(-1).double()
        assert ((est - target).abs() <= 5 * se).all(), (m0, n0, est, target, se)


def test_gating_limits():
    torch.manual_seed(0)
    H, D, K, R = 2, 4, 3, 16
    spe = SineSPE(H, D, K, R)
    code = spe.draw((2,))
    ctx = spe.context(code, 0, 50)
    q, k = torch.randn(3, 50, H, D), torch.randn(3, 50, H, D)
    ungated = SPEFilter(H, D, gated=False)
    gated = SPEFilter(H, D, gated=True)
    with torch.no_grad():
        # g -> 1: position-independent code (equal to the shared eps)
        gated.gate.fill_(40.0)
        qbar, kbar = gated.code(ctx)
        assert torch.allclose(qbar, qbar[:1].expand_as(qbar), atol=1e-6)
        assert torch.allclose(kbar, qbar, atol=1e-6)
        # g -> 0: the ungated code and filter output
        gated.gate.fill_(-40.0)
        qg, kg = gated.code(ctx)
        qu, ku = ungated.code(ctx)
        assert torch.allclose(qg, qu, atol=1e-6) and torch.allclose(kg, ku, atol=1e-6)
        assert torch.allclose(gated(q, k, ctx)[0], ungated(q, k, ctx)[0], atol=1e-5)
        # the efficient filter equals applying the materialised gated code
        gated.gate.normal_()
        qh, kh = gated(q, k, ctx)
        qbar, kbar = gated.code(ctx)
        assert torch.allclose(qh, torch.einsum("bthd,thdr->bthr", q, qbar), atol=1e-5)
        assert torch.allclose(kh, torch.einsum("bthd,thdr->bthr", k, kbar), atol=1e-5)


def test_tiled_sine_filter_matches_the_materialised_code(monkeypatch):
    import spemusic.nn.fused as fused

    torch.manual_seed(0)
    H, D, K, R, T = 2, 4, 3, 16, 50
    spe = SineSPE(H, D, K, R)
    ctx = spe.context(spe.draw((2,)), 0, T)
    filt = SPEFilter(H, D, gated=True)
    q = torch.randn(3, T, H, D, requires_grad=True)
    k = torch.randn(3, T, H, D)
    results = []
    for rows in (10**6, 3 * 7):  # one tile; uneven tiles of 7 positions
        monkeypatch.setattr(fused, "SINE_TILE_ROWS", rows)
        qh, kh = filt(q, k, ctx)
        (grad_q,) = torch.autograd.grad((qh * torch.arange(R)).sum() + kh.sum(), q)
        results.append((qh.detach(), kh.detach(), grad_q))
    qbar, kbar = filt.code(ctx)
    for qh, kh, grad_q in results:
        assert torch.allclose(qh, torch.einsum("bthd,thdr->bthr", q, qbar), atol=1e-5)
        assert torch.allclose(kh, torch.einsum("bthd,thdr->bthr", k, kbar), atol=1e-5)
        assert torch.allclose(grad_q, torch.einsum("thdr,r->thd", qbar, torch.arange(R).float()).expand_as(q),
                              atol=1e-4)


@pytest.mark.parametrize("gated,compile_regions", [(True, False), (False, False), (True, True)])
def test_sine_filter_gradients_match_the_plain_formula(monkeypatch, request, gated, compile_regions):
    """The hand-written filter (and its cos/sin) against autograd through the textbook formula
    q̂ = Σ_d q_d Q̄'_d with Q̄ = Σ_k λ_k [cos(2πf_k m + θ_k) Z_k,1 + sin(2πf_k m + θ_k) Z_k,2],
    Q̄' = √(1-g) Q̄ + √g ε: outputs and every gradient (q, k, frequencies, phases, gains, gate),
    in one tile and in uneven tiles; also with the tiles' products compiled, as training runs them."""
    import spemusic.nn.fused as fused

    if compile_regions:
        request.getfixturevalue("compiling")

    torch.manual_seed(0)
    B, T, H, D, K, R = 3, 37, 2, 4, 3, 8
    spe = SineSPE(H, D, K, R)
    filt = SPEFilter(H, D, gated=gated)
    if gated:
        filt.gate.data.normal_()
    code = spe.draw((3,))
    q, k = torch.randn(B, T, H, D, requires_grad=True), torch.randn(B, T, H, D, requires_grad=True)
    wq, wk = torch.randn(B, T, H, R), torch.randn(B, T, H, R)
    params = [q, k, spe.freqs, spe.phases, spe.gains] + ([filt.gate] if gated else [])

    def reference():
        m = torch.arange(T, dtype=torch.float64)[:, None, None, None]
        base = 2 * math.pi * spe.frequencies().double() * m
        z = code.z.view(H, D, K, 2, R)

        def bar(ph):
            c, s = torch.cos(ph).float(), torch.sin(ph).float()
            return torch.einsum("thdk,hdkr->thdr", c * spe.gains, z[:, :, :, 0]) + \
                torch.einsum("thdk,hdkr->thdr", s * spe.gains, z[:, :, :, 1])

        qbar, kbar = bar(base + spe.phases.double()), bar(base)
        if gated:
            g = torch.sigmoid(filt.gate)[..., None]
            qbar = torch.sqrt(1 - g) * qbar + torch.sqrt(g) * code.eps
            kbar = torch.sqrt(1 - g) * kbar + torch.sqrt(g) * code.eps
        return torch.einsum("bthd,thdr->bthr", q, qbar), torch.einsum("bthd,thdr->bthr", k, kbar)

    def outputs_and_grads(fn):
        qh, kh = fn()
        return (qh.detach(), kh.detach()) + torch.autograd.grad((qh * wq).sum() + (kh * wk).sum(), params)

    expected = outputs_and_grads(reference)
    def ours():
        return filt(q, k, spe.context(code, 0, T))

    for rows in (10**6, 3 * 7):
        monkeypatch.setattr(fused, "SINE_TILE_ROWS", rows)
        for a, b in zip(outputs_and_grads(ours), expected):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # under bf16 autocast the products run in bf16 (outputs bf16), the rest stays fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = outputs_and_grads(ours)
    assert got[0].dtype == torch.bfloat16
    for a, b in zip(got, expected):
        scale = b.abs().max().item()
        torch.testing.assert_close(a.float(), b, rtol=0, atol=2e-2 * scale)


def test_norm_linear_gradients_match_layer_norm_then_linear():
    """NormLinear (training: the normalised input recomputed in the backward pass) gives
    nn.LayerNorm + linear's outputs and gradients, with and without a bias, fp32 and bf16."""
    from spemusic.nn.fused import NormLinear

    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(16)
    norm.weight.data.normal_()
    norm.bias.data.normal_()
    lin = torch.nn.Linear(16, 24)
    x = torch.randn(3, 5, 16, requires_grad=True)
    w = torch.randn(3, 5, 24)
    for bias in (lin.bias, None):
        params = [x, norm.weight, norm.bias, lin.weight] + ([bias] if bias is not None else [])
        for dtype in (torch.float32, torch.bfloat16):
            results = []
            for fused in (True, False):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                    if fused:
                        y = NormLinear.apply(x, norm.weight, norm.bias, norm.eps, lin.weight, bias)
                    else:
                        y = torch.nn.functional.linear(norm(x), lin.weight, bias)
                assert y.dtype == dtype
                results.append((y.detach(),) + torch.autograd.grad((y.float() * w).sum(), params))
            tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
            for a, b in zip(*results):
                torch.testing.assert_close(a, b, **tol)


def test_gelu_linear_gradients_match_gelu_then_linear():
    """GeluLinear (training: gelu(u) recomputed in the backward pass) gives linear(gelu(u))'s
    output and gradients, fp32 and under bf16 autocast."""
    from spemusic.nn.fused import GeluLinear

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 24)
    for dtype in (torch.float32, torch.bfloat16):
        u = torch.randn(3, 50, 64, dtype=dtype, requires_grad=True)
        g = torch.randn(3, 50, 24)
        results = []
        for fused in (True, False):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                y = GeluLinear.apply(u, lin.weight, lin.bias) if fused else lin(torch.nn.functional.gelu(u))
            assert y.dtype == dtype
            results.append((y.detach(),) + torch.autograd.grad((y.float() * g).sum(), (u, lin.weight, lin.bias)))
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, **tol)


def test_sinespe_block_equals_per_position_far_away():
    torch.manual_seed(0)
    H, D, K, R = 2, 4, 5, 8
    spe = SineSPE(H, D, K, R)
    with torch.no_grad():
        spe.freqs.add_(3.0)
    code = spe.draw((0,))
    for lo in (0, 99_990, 1_000_000):
        pos = torch.arange(lo, lo + 40, dtype=torch.float64)
        qb, kb = SineSPE.materialize(spe.context(code, lo, 40))
        for i in range(40):
            q1, k1 = SineSPE.materialize(spe.context(code, lo + i, 1))
            assert torch.allclose(q1[0], qb[i], atol=1e-6) and torch.allclose(k1[0], kb[i], atol=1e-6)
        # and both are accurate: compare with an all-float64 evaluation
        f = spe.frequencies().double()
        ph = 2 * math.pi * f * pos[:, None, None, None]
        lam = spe.gains.double()[..., None]
        fk = (torch.stack((torch.cos(ph), torch.sin(ph)), -1) * lam).reshape(40, H, D, -1)
        kb64 = torch.einsum("thdj,hdjr->thdr", fk, code.z.double())
        assert (kb.double() - kb64).abs().max() < 1e-5


# ----------------------------------------------------------------------- limits


@pytest.mark.parametrize("pe", ["ape", "sinusoidal", "axial"])
def test_absolute_pe_refuses_past_max_len(pe):
    m = _model(pe=pe, max_len=32)
    with pytest.raises(SpemusicError, match="max_len"):
        m(torch.zeros(1, 33, dtype=torch.long))
    _, st = m.prime(torch.zeros(1, 32, dtype=torch.long))
    with pytest.raises(SpemusicError, match="max_len"):
        m.step(st, torch.zeros(1, dtype=torch.long))


def test_only_table_encodings_limit_generation_and_eval():
    """generate and eval refuse lengths past max_len for the encodings that stop there (sampling,
    evaluate: ModelConfig.length_limited), not for the continuous axial one."""
    from spemusic.nn.model import ModelConfig

    assert [pe for pe in ("ape", "sinusoidal", "axial", "axial-continuous", "sinespe", "convspe", "none")
            if ModelConfig(vocab_size=8, pe=pe).length_limited] == ["ape", "sinusoidal", "axial"]


@pytest.mark.parametrize("pe", ["sinespe", "convspe", "axial-continuous"])
def test_spe_and_continuous_axial_have_no_length_limit(pe):
    m = _model(pe=pe, max_len=32)
    ids = torch.randint(0, V, (1, 100))
    with torch.no_grad():
        full = m(ids)
    _, st = m.prime(ids[:, :50])
    for t in range(50, 100):
        logits, st = m.step(st, ids[:, t])
    assert (logits - full[:, -1]).abs().max() < 1e-4
    st.position = 100_000  # far beyond any training length
    logits, st = m.step(st, ids[:, 0])
    assert torch.isfinite(logits).all() and st.position == 100_001


# ----------------------------------------------------------------------- attention kernels
# (the forms of linear attention: tests/test_attention.py)


def test_orthogonal_features():
    w = orthogonal_features(40, 16, torch.Generator().manual_seed(0))
    assert w.shape == (40, 16)
    blk = w[:16] / w[:16].norm(dim=1, keepdim=True)
    assert torch.allclose(blk @ blk.T, torch.eye(16), atol=1e-5)


def test_bf16_autocast_keeps_state_fp32():
    m = _model(pe="sinespe")
    m.train()
    ids = torch.randint(0, V, (2, 150))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = m(ids)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), ids.reshape(-1))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in m.parameters())
    m.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, st = m.prime(ids)
        logits, st = m.step(st, ids[:, 0])
    assert torch.isfinite(logits).all()
    assert all(s.dtype == torch.float32 for s in st.layers)


# ----------------------------------------------------------------------- config


def test_short_conv_added_at_zero_keeps_the_function():
    from spemusic.training.train import with_short_conv

    old = _model(pe="sinespe", gated=True, short_conv=0)
    new = with_short_conv(old, 4).eval()
    assert new.cfg.short_conv == 4 and all(b.shift.abs().sum() == 0 for b in new.blocks)
    old.resample(3), new.resample(3)
    ids = torch.randint(0, V, (2, 200), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(old(ids), new(ids))
    # widened: the near taps carry over, the far ones start at zero, the function is the same
    for b in new.blocks:
        b.shift.data.normal_(0, 0.1)
    wide = with_short_conv(new, 12).eval()
    assert wide.cfg.short_conv == 12 and all(torch.equal(w.shift[:4], n.shift) and w.shift[4:].abs().sum() == 0
                                             for w, n in zip(wide.blocks, new.blocks))
    new.resample(3), wide.resample(3)
    with torch.no_grad():
        assert torch.equal(new(ids), wide(ids))
    with pytest.raises(SpemusicError, match="cannot shorten"):
        with_short_conv(wide, 4)
    # the old checkpoint format has no short_conv key: it reads as 0
    d = old.cfg.to_dict()
    del d["short_conv"]
    assert ModelConfig.from_dict(d).short_conv == 0
    with pytest.raises(SpemusicError, match="short_conv"):
        ModelConfig.preset("tiny", vocab_size=V, short_conv=-1)


def test_config_roundtrip_and_presets():
    cfg = ModelConfig.preset("tiny", vocab_size=V, pe="convspe", gated=False)
    d = cfg.to_dict()
    import json

    assert ModelConfig.from_dict(json.loads(json.dumps(d))) == cfg
    with pytest.raises(SpemusicError):
        ModelConfig.from_dict({**d, "bogus": 1})
    with pytest.raises(SpemusicError):
        ModelConfig.preset("huge", vocab_size=V)
    with pytest.raises(SpemusicError):
        ModelConfig(vocab_size=V, pe="rope")
    small = Performer(ModelConfig.preset("small", vocab_size=400))
    assert 4_000_000 <= small.num_parameters() <= 6_000_000
    paper = ModelConfig.preset("paper", vocab_size=400)
    assert (paper.n_layers, paper.d_model, paper.n_features, paper.n_realizations) == (24, 512, 128, 64)


def test_bad_ids_and_options_are_clear_errors():
    m = Performer(ModelConfig.preset("tiny", vocab_size=V)).eval()
    ok = torch.randint(0, V, (1, 8))
    for ids, message in [(torch.tensor([[1, 2, V]]), f"0 … {V - 1}"), (torch.tensor([[-1, 2]]), f"0 … {V - 1}"),
                         (ok.float(), "integer token ids"), (ok[0], "2-D")]:
        with pytest.raises(SpemusicError, match=message):
            m(ids)
    _, state = m.prime(ok)
    with pytest.raises(SpemusicError, match="batch 1"):
        m.step(state, torch.tensor([5, 6]))
    with pytest.raises(SpemusicError, match="0 …"):
        m.step(state, torch.tensor([V]))
    with pytest.raises(SpemusicError, match="weights_dtype"):
        m.prime(ok, weights_dtype=torch.int8)
    with pytest.raises(SpemusicError, match="gated"):
        ModelConfig.preset("tiny", vocab_size=V, gated="no")


def test_share_pe_false_and_batched_generation():
    m = _model(pe="sinespe", share_pe=False)
    assert len(m.spe) == m.cfg.n_layers
    ids = torch.randint(0, V, (3, 40))
    with torch.no_grad():
        full = m(ids)
    st = m.init_state(3)
    for t in range(40):
        logits, st = m.step(st, ids[:, t])
    assert (logits - full[:, -1]).abs().max() < 1e-4
    # branching a state
    st2 = st.clone()
    a, _ = m.step(st, ids[:, 0])
    b, _ = m.step(st2, ids[:, 0])
    assert torch.equal(a, b)


def test_training_memory_savers_give_the_same_gradients():
    """Training mode keeps fewer activations (FFN: gelu recomputed; attention: chunk products
    recomputed); eval mode runs the plain autograd path: same gradients, fp32 and bf16."""
    torch.manual_seed(0)
    model = Performer(ModelConfig.preset("tiny", vocab_size=50, pe="sinespe", gated=True))
    model.resample(0)
    codes = model.spe.fixed
    model._codes = lambda: codes  # the same SPE draw in both modes
    ids = torch.randint(0, 50, (2, 150))
    for dtype in (torch.float32, torch.bfloat16):
        grads = []
        for training in (True, False):
            model.train(training)
            model.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 50), ids[:, 1:].reshape(-1))
            loss.backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-3)
        for n in grads[0]:
            torch.testing.assert_close(grads[0][n], grads[1][n], **tol, msg=f"{n} {dtype}")


@pytest.mark.parametrize("pe", ["sinespe", "convspe"])
def test_activation_checkpointing_gives_the_same_gradients(pe):
    torch.manual_seed(0)
    model = Performer(ModelConfig.preset("tiny", vocab_size=50, pe=pe, gated=True)).train()
    ids = torch.randint(0, 50, (2, 97))
    grads, saved = [], []
    for recompute in (False, True):
        model.checkpoint_activations = recompute
        model.zero_grad()
        torch.manual_seed(1)  # the same SPE draw in both runs
        kept = {}

        def pack(t, kept=kept):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), ids[:, 1:].reshape(-1))
        loss.backward()
        saved.append(sum(kept.values()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert saved[1] < 0.5 * saved[0], saved  # activations inside the blocks were not kept
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-6, msg=n)


def _parts_stream() -> torch.Tensor:
    """(2, 300) random ids over a vocabulary of 160 where Programs 10 and 11 are often followed by
    a Pitch (ids 20-147)."""
    ids = torch.randint(0, 160, (2, 300), generator=torch.Generator().manual_seed(3))
    ids[:, ::7] = 10
    ids[:, 1::7] = torch.randint(20, 148, ids[:, 1::7].shape)
    ids[:, 3::11] = 11
    return ids


def _primed_then_stepped(m: Performer, ids: torch.Tensor, prompt: int = 100, chunk: int = 33) -> torch.Tensor:
    """The logits of a prompt of 100 tokens primed in chunks of 33, then one token at a time: what
    the stream features carry across chunks and into the steps (`prompt` and `chunk` to move them)."""
    lp, st = m.prime(ids[:, :prompt], chunk=chunk)
    outs = [lp]
    for t in range(prompt, ids.shape[1]):
        logits, st = m.step(st, ids[:, t])
        outs.append(logits[:, None])
    return torch.cat(outs, 1)


def test_pitch_memory_parallel_equals_recurrent_and_starts_at_zero():
    from dataclasses import replace

    from spemusic.training.train import widened

    torch.manual_seed(0)
    base = Performer(ModelConfig.preset("tiny", vocab_size=160)).eval()
    cfg = replace(base.cfg, pitch_memory=[10, 11], pitch_range=[20, 148])
    ids = _parts_stream()
    m = widened(base, cfg).eval()
    base.resample(1), m.resample(1)
    with torch.no_grad():
        assert torch.equal(m(ids), base(ids))  # added at zero: the same function
        m.pitch_memory.weight.normal_(0.0, 1.0)
        full = m(ids)
    assert (full - base(ids).detach()).abs().max() > 0.1
    assert (_primed_then_stepped(m, ids) - full).abs().max().item() <= 1e-4
    # what is remembered: the pitch right after each Program, held until the next
    from spemusic.nn.recall import pitch_memory

    rows, carry = pitch_memory(ids, None, m.memory_programs, m.cfg.pitch_range)
    last_token, last_pitch = carry[:, 0], carry[:, 1:]
    for b in range(2):
        seq = ids[b].tolist()
        for s, prog in enumerate((10, 11)):
            held = 0
            for t, tok in enumerate(seq):
                if t and seq[t - 1] == prog and 20 <= tok < 148:
                    held = tok - 20 + 1
                assert rows[b, t, s].item() == 129 * s + held
            assert last_pitch[b, s].item() == held
        assert last_token[b].item() == seq[-1]


def test_interval_head_parallel_equals_recurrent_and_scores_the_interval_from_the_part_last_pitch():
    """Added at zero it is the same function; trained, the parallel pass, a chunked prompt and the
    steps agree; the anchor is the part's last pitch and its table says whether a Bar came since."""
    from dataclasses import replace

    from spemusic.nn.recall import interval_anchor
    from spemusic.training.train import widened

    torch.manual_seed(0)
    base = Performer(ModelConfig.preset("tiny", vocab_size=160)).eval()
    cfg = replace(base.cfg, interval_head=[10, 11], pitch_range=[20, 148], bar_id=3, interval_reach=12)
    ids = _parts_stream()
    ids[:, 5::23] = 3  # bars
    m = widened(base, cfg).eval()
    base.resample(1), m.resample(1)
    with torch.no_grad():
        assert torch.equal(m(ids), base(ids))  # added at zero: the same function
        m.interval_head.weight.normal_(0.0, 1.0)
        full = m(ids)
    changed = (full - base(ids).detach()).abs().amax(-1)  # (B, T): only where a Program opens a note
    assert changed[ids == 10].max() > 0.1 and changed[(ids != 10) & (ids != 11)].max() == 0
    assert (_primed_then_stepped(m, ids) - full).abs().max().item() <= 1e-4
    anchor, table, _ = interval_anchor(ids, None, m.interval_programs, m.cfg.pitch_range, 3)
    for b in range(2):
        seq = ids[b].tolist()
        last, crossed = {10: -1, 11: -1}, {10: False, 11: False}
        for t, tok in enumerate(seq):
            if t and seq[t - 1] in last and 20 <= tok < 148:
                last[seq[t - 1]], crossed[seq[t - 1]] = tok - 20, False
            if tok == 3:
                crossed = {k: True for k in crossed}
            if tok in last:
                assert anchor[b, t].item() == last[tok]
                assert table[b, t].item() == 2 * (tok - 10) + crossed[tok]
            else:
                assert anchor[b, t].item() == -1
    # one interval's score moves exactly the pitch that far from the anchor
    t = next(t for t in range(300) if ids[0, t] == 10 and anchor[0, t] >= 0)
    with torch.no_grad():
        before = m(ids[:1, :t + 1])[0, -1]
        m.interval_head.weight[table[0, t], 12 + 2] += 5.0
        after = m(ids[:1, :t + 1])[0, -1]
    moved = (after - before).nonzero().flatten().tolist()
    assert moved == ([20 + anchor[0, t].item() + 2] if anchor[0, t] + 2 < 128 else [])


def test_interval_head_config_errors():
    with pytest.raises(SpemusicError, match="bar_id"):
        ModelConfig.preset("tiny", vocab_size=V, interval_head=[1], pitch_range=[0, 128])
    with pytest.raises(SpemusicError, match="interval_reach"):
        ModelConfig.preset("tiny", vocab_size=V, interval_head=[1], pitch_range=[0, 128], bar_id=2, interval_reach=0)
    d = ModelConfig.preset("tiny", vocab_size=V).to_dict()
    del d["interval_head"], d["interval_reach"], d["bar_id"]  # checkpoints from before it
    assert ModelConfig.from_dict(d).interval_head == []


def test_pitch_memory_config_errors():
    with pytest.raises(SpemusicError, match="pitch_memory"):
        ModelConfig.preset("tiny", vocab_size=V, pitch_memory=[V])
    with pytest.raises(SpemusicError, match="pitch_range"):
        ModelConfig.preset("tiny", vocab_size=V, pitch_memory=[1], pitch_range=[0, 10])
    d = ModelConfig.preset("tiny", vocab_size=V).to_dict()
    del d["pitch_memory"], d["pitch_range"]  # checkpoints from before it
    assert ModelConfig.from_dict(d).pitch_memory == []


def _bar_stream(batch: int, bars: int, seed: int) -> torch.Tensor:
    """Token streams in a made-up vocabulary: 0 BOS, 1 Bar, 2-49 Position_0-47, 50-149 others;
    onsets at increasing positions, each with a few other tokens, some bars repeating the last."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        seq, last = [0], None
        for _ in range(bars):
            if last is None or torch.rand(1, generator=g) < 0.5:
                poss = sorted(torch.randperm(48, generator=g)[: int(torch.randint(1, 8, (1,), generator=g))].tolist())
                last = [1] + [t for p in poss for t in [2 + p] + torch.randint(50, 150, (int(torch.randint(1, 9, (1,),
                                                                                generator=g)),), generator=g).tolist()]
            seq += last
        rows.append(seq)
    n = min(map(len, rows))
    return torch.tensor([r[:n] for r in rows])


def _echo_reference(seq: list[int], bars: int = 1, lag: int | None = None) -> list[int]:
    """bar_echo by its definition, one token at a time: -1 where no bar before is known. Over
    several bars, the echo most of them give (ties: the nearest bar's). `lag`: the echo of that
    bar back alone (the echo head's candidate)."""
    from collections import Counter

    from spemusic.nn.recall import ECHO_PLACES, ECHO_SWEEPS

    out, done, cur = [], [], None  # done: the finished bars, nearest last
    pos = since = sweep = 0
    for tok in seq:
        if tok == 1:  # what came before the first Bar is never echoed
            if cur is not None:
                done.append(cur)
            cur, pos, since, sweep = [], 0, 0, 0
        elif 2 <= tok < 50:
            if pos and tok - 2 + 1 <= pos:  # a position again: the bar's next pass (melody first)
                sweep = min(sweep + 1, ECHO_SWEEPS - 1)
            pos, since = tok - 2 + 1, 0
        else:
            since += 1
        place = (sweep, pos, min(since, ECHO_PLACES - 1))
        echoes = []
        for bar in (done[::-1][:bars] if lag is None else done[::-1][lag - 1:lag]) if cur is not None else []:
            earlier = [(p, i) for p, i in bar if p <= place]
            if earlier:
                echoes.append(seq[max(earlier)[1] + 1])
        votes = Counter(echoes)
        out.append(max(echoes, key=lambda e: votes[e]) if echoes else -1)  # max keeps the first (nearest) of a tie
        if cur is not None:
            cur.append((place, len(out) - 1))
    return out


def test_bar_echo_is_the_next_token_one_bar_back_and_the_same_one_token_at_a_time():
    from dataclasses import replace

    from spemusic.nn.recall import ECHO_CONTEXT, bar_echo
    from spemusic.training.train import widened

    ids = _bar_stream(2, 120, seed=4)
    assert ids.shape[1] > ECHO_CONTEXT  # the carried context runs out: bars echo only what it holds
    echo, tail = bar_echo(ids, None, 1, (2, 50), 150)
    for b in range(2):
        ref = _echo_reference(ids[b].tolist())
        assert [e if e != 150 else -1 for e in echo[b].tolist()] == ref
    assert (echo != 150).float().mean() > 0.8 and tail.shape == (2, ECHO_CONTEXT)
    # a bar that repeats the one before echoes each of its next tokens exactly
    torch.manual_seed(0)
    base = Performer(ModelConfig.preset("tiny", vocab_size=150)).eval()
    m = widened(base, replace(base.cfg, bar_echo=[1, 2, 50])).eval()
    base.resample(2), m.resample(2)
    with torch.no_grad():
        assert torch.equal(m(ids), base(ids))
        m.bar_echo.weight.normal_(0.0, 1.0)
        full = m(ids)
    assert (_primed_then_stepped(m, ids, prompt=700, chunk=300) - full).abs().max().item() <= 1e-4
    st, outs = m.init_state(2), []  # from scratch, one token at a time (a prompt of one token too)
    for t in range(300):
        logits, st = m.step(st, ids[:, t])
        outs.append(logits[:, None])
    assert (torch.cat(outs, 1) - full[:, :300]).abs().max().item() <= 1e-4
    assert (m.prime(ids[:, :1])[0] - full[:, :1]).abs().max().item() <= 1e-4


def test_echo_head_scores_each_lag_echo_by_how_often_it_was_right_and_the_same_one_token_at_a_time():
    """The candidates are the echoes of exactly 1, 2, 4 bars back; the agreement counts the last
    `window` tokens (the current one included) each lag named right; the head adds its row's score
    to its candidate's logit and nothing else. Added at zero it is the same function; scored, the
    parallel pass, a chunked prompt and the steps agree, past the carried context too."""
    from dataclasses import replace

    from spemusic.nn.recall import ECHO_CONTEXT, echo_features
    from spemusic.training.train import widened

    ids = _bar_stream(2, 120, seed=6)
    assert ids.shape[1] > ECHO_CONTEXT
    lags, window = (1, 2, 4), 5
    _, (cands, agree), _ = echo_features(ids, None, 1, (2, 50), 150, 1, lags, window)
    for b in range(2):
        seq = ids[b].tolist()
        for k, lag in enumerate(lags):
            ref = _echo_reference(seq, lag=lag)
            assert [c if c != 150 else -1 for c in cands[b, :, k].tolist()] == ref
            right = [0] + [int(ref[t - 1] == seq[t]) for t in range(1, len(seq))]  # the lag named token t
            assert agree[b, :, k].tolist() == [sum(right[max(t - window + 1, 0):t + 1]) for t in range(len(seq))]
    assert agree.float().mean() > 0.5 and (agree == window).any()  # the stream repeats bars
    torch.manual_seed(0)
    base = Performer(ModelConfig.preset("tiny", vocab_size=150, bar_echo=[1, 2, 50], echo_bars=2)).eval()
    m = widened(base, replace(base.cfg, echo_head=list(lags), echo_window=window)).eval()
    base.resample(2), m.resample(2)
    with torch.no_grad():
        assert torch.equal(m(ids), base(ids))
        m.echo_head.weight.normal_(0.0, 1.0)
        full = m(ids)
        moved = full - base(ids)
    expected = torch.zeros_like(moved)
    for k in range(len(lags)):
        score = m.echo_head.weight[k, agree[..., k]] * (cands[..., k] < 150)
        expected.scatter_add_(-1, cands[..., k:k + 1].clamp(max=149), score[..., None])
    assert (moved - expected).abs().max().item() <= 1e-4
    assert (_primed_then_stepped(m, ids, prompt=700, chunk=300) - full).abs().max().item() <= 1e-4
    assert (_primed_then_stepped(m, ids[:, :300]) - full[:, :300]).abs().max().item() <= 1e-4


def test_echo_kinds_score_each_kind_of_candidate_from_its_own_table():
    """With echo kinds, a candidate in kind i's id range is scored from kind i's tables (the rest
    from the first): widened from a head without them it is the same function; scored, the
    parallel pass and the steps agree."""
    from dataclasses import replace

    from spemusic.nn.recall import echo_features
    from spemusic.training.train import widened

    ids = _bar_stream(2, 120, seed=6)
    lags, window, kinds = (1, 2, 4), 5, [[2, 50], [50, 100]]
    _, (cands, agree), _ = echo_features(ids, None, 1, (2, 50), 150, 1, lags, window)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=150, bar_echo=[1, 2, 50], echo_bars=2, echo_head=list(lags),
                             echo_window=window)
    base = Performer(cfg).eval()
    with torch.no_grad():
        base.echo_head.weight.normal_(0.0, 1.0)
    m = widened(base, replace(cfg, echo_kinds=kinds)).eval()
    assert m.echo_head.weight.shape == (len(lags), 3 * (window + 1))
    base.resample(2), m.resample(2)
    with torch.no_grad():
        assert torch.equal(m(ids), base(ids))
        m.echo_head.weight.normal_(0.0, 1.0)
        full = m(ids)
        base.echo_head.weight.zero_()
        moved = full - base(ids)
    kind = torch.zeros(151, dtype=torch.long)
    kind[2:50], kind[50:100] = 1, 2
    assert {0, 1, 2} <= set(kind[cands].unique().tolist())  # every kind's table is read
    expected = torch.zeros_like(moved)
    for k in range(len(lags)):
        score = m.echo_head.weight[k, agree[..., k] + (window + 1) * kind[cands[..., k]]] * (cands[..., k] < 150)
        expected.scatter_add_(-1, cands[..., k:k + 1].clamp(max=149), score[..., None])
    assert (moved - expected).abs().max().item() <= 1e-4
    assert (_primed_then_stepped(m, ids, prompt=700, chunk=300) - full).abs().max().item() <= 1e-4
    with pytest.raises(SpemusicError, match="echo kinds need the echo head"):
        ModelConfig.preset("tiny", vocab_size=150, bar_echo=[1, 2, 50], echo_kinds=kinds)
    with pytest.raises(SpemusicError, match="echo_kinds must be"):
        replace(cfg, echo_kinds=[[50, 2]])


def test_echo_head_config_errors():
    with pytest.raises(SpemusicError, match="needs the bar echo"):
        ModelConfig.preset("tiny", vocab_size=V, echo_head=[1, 2])
    for lags in ([0], [9], [2, 1], [1, 1], "1,2"):
        with pytest.raises(SpemusicError, match="echo_head must be"):
            ModelConfig.preset("tiny", vocab_size=V, bar_echo=[1, 2, 50], echo_head=lags)
    with pytest.raises(SpemusicError, match="echo_window"):
        ModelConfig.preset("tiny", vocab_size=V, bar_echo=[1, 2, 50], echo_head=[1], echo_window=0)


def test_bar_echo_of_a_melody_first_bar_echoes_each_pass_from_its_own():
    """A melody-first bar goes through its positions twice (the melody, then the other parts):
    each pass echoes the same pass of the bar before, as the definition says, in one call or
    token by token."""
    from spemusic.nn.recall import bar_echo

    g = torch.Generator().manual_seed(5)
    seq = [0]
    for _ in range(40):
        melody = sorted(torch.randperm(48, generator=g)[:3].tolist())
        piano = [0] + sorted((1 + torch.randperm(47, generator=g)[:3]).tolist())  # opens at 0, as pop's chord
        seq += [1] + [t for p in melody for t in (2 + p, 60 + p)] + [t for p in piano for t in (2 + p, 110 + p % 40)]
    ids = torch.tensor([seq])
    echo, _ = bar_echo(ids, None, 1, (2, 50), 150)
    assert [e if e != 150 else -1 for e in echo[0].tolist()] == _echo_reference(seq)
    bar_starts = [i for i, t in enumerate(seq) if t == 1]
    for a, b in zip(bar_starts[1:], bar_starts[2:]):
        piano_pass = range(a + 1 + 2 * 3, b)  # after the melody's three onsets
        # the piano's places echo the piano of the bar before (its Positions and notes), never the melody
        assert all(not 60 <= echo[0, i].item() < 110 for i in piano_pass)
        assert any(110 <= echo[0, i].item() < 150 for i in piano_pass)
    tail, outs = None, []
    for t in range(len(seq)):  # one token at a time, carrying the tail
        e, tail = bar_echo(ids[:, t: t + 1], tail, 1, (2, 50), 150)
        outs.append(e)
    assert torch.equal(torch.cat(outs, 1), echo)


def test_bar_echo_over_several_bars_is_what_most_of_them_had_and_the_same_one_token_at_a_time():
    from dataclasses import replace

    from spemusic.nn.recall import bar_echo
    from spemusic.training.train import widened

    ids = _bar_stream(2, 60, seed=4)
    held, _ = bar_echo(ids, None, 1, (2, 50), 150, bars=4)
    last, _ = bar_echo(ids, None, 1, (2, 50), 150)
    for b in range(2):
        assert [e if e != 150 else -1 for e in held[b].tolist()] == _echo_reference(ids[b].tolist(), bars=4)
    assert (held != last).float().mean() > 0.1  # it is not the last bar's echo
    # one slip in a repeated bar: the next bar still echoes the pattern, not the slip
    bar = [1, 2, 60, 61, 62, 10, 70, 71, 72]
    slipped = bar[:6] + [80] + bar[7:]
    seq = torch.tensor([bar * 3 + slipped + bar])
    one, _ = bar_echo(seq, None, 1, (2, 50), 150)
    four, _ = bar_echo(seq, None, 1, (2, 50), 150, bars=4)
    at = 4 * len(bar) + 5  # the last bar's Position_8: what came next there
    assert one[0, at].item() == 80 and four[0, at].item() == 70
    torch.manual_seed(0)
    base = Performer(ModelConfig.preset("tiny", vocab_size=150)).eval()
    m = widened(base, replace(base.cfg, bar_echo=[1, 2, 50], echo_bars=4)).eval()
    m.resample(2)
    with torch.no_grad():
        m.bar_echo.weight.normal_(0.0, 1.0)
        full = m(ids)
    assert (_primed_then_stepped(m, ids, prompt=500, chunk=200) - full).abs().max().item() <= 1e-4


def _melody_first_tokens() -> tuple:
    """pop-piano's layout (melody first, a chord each bar) and two bars written by hand: bar 1's
    melody C5 for a quarter at beat 1 and E5 from beat 3 to the bar's end, then its other parts;
    bar 2 has no melody. Returns (tokenizer, ids (1, T), {name: index} of the tokens checked)."""
    from spemusic.tokens.tokenizer import REMITokenizer, TokenizerConfig

    tok = REMITokenizer(TokenizerConfig(chords=True, parts=True, melody_first=True, chord_every_bar=True))
    dur = {int(s): f"Duration_{i}" for i, s in enumerate(tok.duration_steps)}
    note = lambda part, pitch, steps: [f"Program_{part}", f"Pitch_{pitch}", "Velocity_20", dur[steps]]  # noqa: E731
    words = ["BOS", "Bar", "TimeSig_4/4", "Tempo_10",
             "Position_0", *note("melody", 72, 12), "Position_24", *note("melody", 76, 24),
             "Position_0", "Chord_C:maj", *note("piano", 48, 24),           # C5 begins here
             "Position_12", *note("piano", 55, 12),                           # no melody sounds
             "Position_24", *note("bridge", 67, 12),                          # E5 begins here
             "Position_36", *note("piano", 60, 12),                           # E5 still sounds
             "Bar", "Position_0", "Chord_C:maj", *note("piano", 48, 48), "EOS"]  # no melody in bar 2
    ids = torch.tensor([[tok.token_to_id[w] for w in words]])
    at = {"p0": 14, "piano0": 16, "piano12": 21, "p24": 25, "bridge24": 26, "piano36": 31, "bar2piano": 38}
    assert [words[i] for i in at.values()] == ["Position_0", "Program_piano", "Program_piano", "Position_24",
                                              "Program_bridge", "Program_piano", "Program_piano"]
    return tok, ids, at


def test_melody_reads_find_the_melody_sounding_under_each_note_of_the_other_parts():
    """The accompaniment's notes read the melody note sounding at their onset (and whether it begins
    there), the chords the melody's pitch classes from there to the bar's end; the melody itself,
    and a bar without melody, read nothing; one token at a time reads the same."""
    from spemusic.nn.recall import echo_places, melody_reads
    from spemusic.training.train import melody_head_config

    tok, ids, at = _melody_first_tokens()
    cfg = melody_head_config(True, tok)
    first, *steps = cfg["melody_durations"]
    durations = torch.zeros(len(tok), dtype=torch.long)
    durations[first:first + len(steps)] = torch.tensor(steps)
    parts = torch.tensor(cfg["melody_head"][1:])
    args = (cfg["melody_head"][0], parts, cfg["pitch_range"], tok.range("Position"), durations)
    key = echo_places(ids, tok.bar_id, tok.range("Position"))["key"]
    anchor, table, profile = melody_reads(ids, key, ids.shape[1], *args)
    # (slots: bridge 0, piano 1; table 2 * slot + 1 where the melody note begins at the onset)
    assert (anchor[0, at["piano0"]].item(), table[0, at["piano0"]].item()) == (72, 3)
    assert anchor[0, at["piano12"]].item() == -1  # C5 ended at step 12
    assert (anchor[0, at["bridge24"]].item(), table[0, at["bridge24"]].item()) == (76, 1)
    assert (anchor[0, at["piano36"]].item(), table[0, at["piano36"]].item()) == (76, 2)
    assert anchor[0, at["bar2piano"]].item() == -1
    readers = torch.zeros_like(anchor[0], dtype=torch.bool)
    readers[[at["piano0"], at["bridge24"], at["piano36"]]] = True
    assert (anchor[0, ~readers] == -1).all()
    expected = {"p0": {0: 12 / 48, 4: 24 / 48}, "p24": {4: 24 / 48}, "piano36": {4: 12 / 48}}
    for name, classes in expected.items():
        want = torch.zeros(12)
        for pc, v in classes.items():
            want[pc] = v
        assert torch.allclose(profile[0, at[name]], want), name
    assert profile[0, :at["p0"]].abs().sum() == 0 and profile[0, at["bar2piano"]].abs().sum() == 0
    # token by token over the growing stream (as the one-token step reads it, its last column)
    for t in range(ids.shape[1]):
        a, tb, p = melody_reads(ids[:, :t + 1], key[:, :t + 1], 1, *args)
        assert (a[0, 0], tb[0, 0]) == (anchor[0, t], table[0, t]) and torch.equal(p[0, 0], profile[0, t])
    # the melody's own next pitch reads its register: the mean of its last 16 pitches (from 4 on)
    dur = {int(s): f"Duration_{i}" for i, s in enumerate(tok.duration_steps)}
    pitches = [60, 62, 64, 65, 67, 69]
    words = ["BOS", "Bar", "TimeSig_4/4"] + [w for i, p in enumerate(pitches) for w in (
        f"Position_{6 * i}", "Program_melody", f"Pitch_{p}", "Velocity_20", dur[6])]
    ids = torch.tensor([[tok.token_to_id[w] for w in words]])
    key = echo_places(ids, tok.bar_id, tok.range("Position"))["key"]
    anchor, table, _ = melody_reads(ids, key, ids.shape[1], *args)
    opens = [i for i, w in enumerate(words) if w == "Program_melody"]
    assert anchor[0, opens].tolist() == [-1, -1, -1, -1, round(sum(pitches[:4]) / 4), round(sum(pitches[:5]) / 5)]
    assert table[0, opens[-1]].item() == 2 * len(parts)


def test_melody_head_scores_the_accompaniment_by_the_melody_and_the_chords_by_its_pitch_classes():
    """Added at zero it changes nothing; a score at an interval moves exactly that pitch, by the
    melody sounding there; a chord quality's score at the root moves each chord of that quality by
    how much of the melody is its root; the parallel pass and the steps agree."""
    from dataclasses import replace

    from spemusic.tokens.chords import QUALITIES
    from spemusic.training.train import melody_head_config, widened

    tok, ids, at = _melody_first_tokens()
    torch.manual_seed(0)
    base = Performer(ModelConfig.preset("tiny", vocab_size=len(tok), bar_echo=[tok.bar_id, *tok.range("Position")]))
    m = widened(base.eval(), replace(base.cfg, **melody_head_config(True, tok))).eval()
    base.resample(1), m.resample(1)
    with torch.no_grad():
        plain = m(ids)[0]
        assert torch.equal(plain, base(ids)[0])
        K = m.cfg.interval_reach
        m.melody_head.weight[2, K - 16] = 3.0  # piano, E5 held: the pitch 16 semitones under it
        m.chord_head.weight[list(QUALITIES).index("maj"), 0] = 2.0  # a major chord whose root the melody plays
        scored = m(ids)[0]
    moved = (scored - plain).abs() > 1e-6
    pitch_lo = tok.range("Pitch")[0]
    assert moved[at["piano36"], pitch_lo:pitch_lo + 128].nonzero().flatten().tolist() == [60]
    up = (scored - plain)[at["p0"]]
    assert up[tok.token_to_id["Chord_C:maj"]].item() == pytest.approx(2.0 * 12 / 48, abs=1e-5)
    assert up[tok.token_to_id["Chord_E:maj"]].item() == pytest.approx(2.0 * 24 / 48, abs=1e-5)
    assert up[tok.token_to_id["Chord_C:min"]].item() == pytest.approx(0.0, abs=1e-6)
    assert set(moved[at["p0"]].nonzero().flatten().tolist()) == {tok.token_to_id["Chord_C:maj"],
                                                                 tok.token_to_id["Chord_E:maj"]}
    assert (_primed_then_stepped(m, ids, prompt=20, chunk=7)[0] - scored).abs().max().item() <= 1e-4


def test_melody_head_config_errors():
    with pytest.raises(SpemusicError, match="melody_head must be"):
        ModelConfig.preset("tiny", vocab_size=200, melody_head=[1, 2], pitch_range=[30, 158])  # no bar echo
    ok = dict(bar_echo=[3, 10, 20], pitch_range=[30, 158], melody_head=[1, 2], melody_durations=[170, 1, 2, 3])
    ModelConfig.preset("tiny", vocab_size=200, **ok)
    with pytest.raises(SpemusicError, match="melody_durations must be"):
        ModelConfig.preset("tiny", vocab_size=200, **{**ok, "melody_durations": [199, 1, 2, 3]})  # past the vocabulary
    with pytest.raises(SpemusicError, match="melody_chords must be"):
        ModelConfig.preset("tiny", vocab_size=200, **ok, melody_chords=[180, 9])  # 108 chords past the vocabulary
    with pytest.raises(SpemusicError, match="pitch_range must be"):
        ModelConfig.preset("tiny", vocab_size=200, **{**ok, "pitch_range": [0, 0]})


def test_the_bar_clock_counts_bars_from_bos_from_the_melodys_entry_and_from_its_last_note():
    """Rows: the Bars so far from BOS, capped; the bars since the melody's first note (0 before);
    the last rows of both throughout a context that did not open on BOS; the bars since the
    melody last played (0 in a bar it plays in, capped; the last row before any melody), known
    in any context; the same over chunks carried as in one pass, and the same on the model's step."""
    from spemusic.nn.recall import bar_clock

    BOS, BAR, MEL = 1, 3, 7
    song = torch.tensor([[BOS, BAR, 8, 8, BAR, 7, BAR, 9, BAR, 7, BAR, 8, BAR, 8, BAR, 8, BAR]])
    rows, melody, rests, carry = bar_clock(song, None, BOS, BAR, 3, MEL, 2)
    assert rows.tolist() == [[0, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]]
    assert melody.tolist() == [[0, 0, 0, 0, 0, 1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3]]
    assert rests.tolist() == [[2, 2, 2, 2, 2, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]]
    assert carry.tolist() == [[1, 8, 2, 4]]
    _, _, rests, _ = bar_clock(song, None, BOS, BAR, 3, MEL, 4)
    assert rests.tolist() == [[4, 4, 4, 4, 4, 0, 1, 1, 2, 0, 1, 1, 2, 2, 3, 3, 3]]
    inside, inside_melody, inside_rests, _ = bar_clock(song[:, 4:], None, BOS, BAR, 3, MEL, 4)  # from a bar line on
    assert inside.tolist() == inside_melody.tolist() == [[3] * 13]
    assert inside_rests.tolist() == [[4, 0, 1, 1, 2, 0, 1, 1, 2, 2, 3, 3, 3]]
    first, first_melody, first_rests, carry = bar_clock(song[:, :6], None, BOS, BAR, 3, MEL, 4)
    rest, rest_melody, rest_rests, _ = bar_clock(song[:, 6:], carry, BOS, BAR, 3, MEL, 4)
    assert torch.cat([first, rest], 1).tolist() == rows.tolist()
    assert torch.cat([first_melody, rest_melody], 1).tolist() == melody.tolist()
    assert torch.cat([first_rests, rest_rests], 1).tolist() == rests.tolist()
    with pytest.raises(SpemusicError, match="bar_clock must be"):
        ModelConfig.preset("tiny", vocab_size=200, bar_clock=[1, 3, 0])
    with pytest.raises(SpemusicError, match="bar_clock must be"):
        ModelConfig.preset("tiny", vocab_size=200, bar_clock=[BOS, BAR, 3, MEL, 0])
    torch.manual_seed(0)
    m = Performer(ModelConfig.preset("tiny", vocab_size=200, bar_clock=[BOS, BAR, 3, MEL, 4])).eval()
    with torch.no_grad():
        m.bar_clock.weight.normal_(0.0, 1.0)
        m.melody_clock.weight.normal_(0.0, 1.0)
        full = m(song)
        m.rest_clock.weight.normal_(0.0, 1.0)
        assert (m(song)[:, 5:] - full[:, 5:]).abs().amax(-1).min().item() > 0.01  # the rest clock is read
        full = m(song)
    assert (full[:, 4:] - m(song[:, 4:])).abs().max().item() > 0.1  # the clock is read
    assert (_primed_then_stepped(m, song, prompt=5, chunk=3) - full).abs().max().item() <= 1e-4
