"""Linear attention: every form, with its one signature (q, k, v, initial_state, output_final_state)
-> (o, final_state or None), against the naive O(T²) one: outputs and final states, from no state
and from a state of earlier positions, in fp32."""
from functools import partial

import pytest
import torch

from spemusic.nn.attention import (
    chunked_linear_attention,
    favor_attention,
    favor_attention_training,
    favor_key,
    favor_query,
    naive_linear_attention,
    orthogonal_features,
    recurrent_linear_attention,
)

B, H, T, DK, M, DV = 2, 3, 203, 12, 16, 8

FORMS = {
    "chunked, C=1": partial(chunked_linear_attention, chunk_size=1),
    "chunked, C=16": partial(chunked_linear_attention, chunk_size=16),  # a padded last chunk
    "chunked, C=64": partial(chunked_linear_attention, chunk_size=64),
    "chunked, C > T": partial(chunked_linear_attention, chunk_size=256),
    "recurrent": recurrent_linear_attention,
}


def _inputs(seed=0):
    """FAVOR+ feature maps of large q, k (the stabiliser at work) and v, and a state of 57 earlier
    positions."""
    g = torch.Generator().manual_seed(seed)
    omega = orthogonal_features(M, DK, g) * DK ** -0.25
    q, k = 2 * torch.randn(B, H, T, DK, generator=g), 2 * torch.randn(B, H, T, DK, generator=g)
    v = torch.randn(B, H, T, DV, generator=g)
    qf, kf = favor_query(q, omega), favor_key(k, omega, DK ** -0.5)
    earlier_k = favor_key(2 * torch.randn(B, H, 57, DK, generator=g), omega, DK ** -0.5)
    earlier_v = torch.randn(B, H, 57, DV, generator=g)
    _, state = naive_linear_attention(earlier_k, earlier_k, earlier_v, output_final_state=True)
    return (q, k, omega), (qf, kf, v), state.float()


def _close(got, want):
    """fp32 against the float64 reference, relative to the reference's scale."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("with_state", [False, True], ids=["from no state", "from a state"])
@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_every_form_equals_the_naive_one(form, with_state):
    _, (qf, kf, v), state = _inputs()
    s0 = state if with_state else None
    want_o, want_state = naive_linear_attention(qf, kf, v, s0, True)
    before = state.clone()
    o, final = form(qf, kf, v, s0, True)
    _close(o, want_o)
    _close(final, want_state)
    assert torch.equal(state, before)  # initial_state is left as it was
    o2, none = form(qf, kf, v, s0)  # no final state asked for: none returned, the same output
    assert none is None and torch.equal(o2, o)


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_every_form_continues_its_own_final_state(form):
    """Two calls, the second from the first's final state, give what one call gives."""
    _, (qf, kf, v), _ = _inputs(1)
    want_o, want_state = naive_linear_attention(qf, kf, v, None, True)
    o1, s1 = form(qf[:, :, :100], kf[:, :, :100], v[:, :, :100], None, True)
    o2, s2 = form(qf[:, :, 100:], kf[:, :, 100:], v[:, :, 100:], s1, True)
    _close(torch.cat((o1, o2), 2), want_o)
    _close(s2, want_state)


def test_the_state_is_the_keys_outer_products_with_the_normaliser_last():
    """The layout checkpoints and the sampler's states hold: S = Σ φ(k) [v, 1]ᵀ (B, H, M, Dv+1)."""
    _, (qf, kf, v), _ = _inputs()
    _, S = naive_linear_attention(qf, kf, v, None, True)
    assert S.shape == (B, H, M, DV + 1)
    torch.testing.assert_close(S[..., :DV], torch.einsum("bhtm,bhtd->bhmd", kf.double(), v.double()))
    torch.testing.assert_close(S[..., DV], kf.double().sum(2))


@pytest.mark.parametrize("with_state", [False, True], ids=["from no state", "from a state"])
def test_favor_attention_is_phi_then_the_chunked_form(with_state):
    (q, k, omega), (qf, kf, v), state = _inputs()
    s0 = state if with_state else None
    want_o, want_state = naive_linear_attention(qf, kf, v, s0, True)
    o, final = favor_attention(q, k, v, s0, True, omega=omega, scale2=DK ** -0.5, chunk_size=16)
    _close(o, want_o)
    _close(final, want_state)


def test_the_training_form_has_the_same_signature_and_keeps_no_state():
    (q, k, omega), (qf, kf, v), state = _inputs()
    kw = dict(omega=omega, scale2=DK ** -0.5, chunk_size=16)
    o, none = favor_attention_training(q, k, v, **kw)
    assert none is None
    _close(o, naive_linear_attention(qf, kf, v)[0])
    with pytest.raises(ValueError, match="state"):
        favor_attention_training(q, k, v, state, **kw)
    with pytest.raises(ValueError, match="state"):
        favor_attention_training(q, k, v, None, True, **kw)
