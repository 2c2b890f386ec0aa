"""The training step's compiled regions compute what their plain functions compute, a machine
where compiling fails trains uncompiled, and bf16 chunk products keep the attention state fp32."""

from __future__ import annotations

import warnings

import pytest
import torch

from spemusic.nn import compiled
from spemusic.nn.attention import chunked_linear_attention, favor_attention, favor_attention_training
from spemusic.nn.model import short_conv


def test_compiled_short_conv_equals_the_plain_one(compiling):
    torch.manual_seed(0)
    x = torch.randn(2, 50, 16, requires_grad=True)
    w = torch.randn(6, 16, requires_grad=True)
    g = torch.randn(2, 50, 16)
    plain = short_conv(x, w)
    plain_grads = torch.autograd.grad((plain * g).sum(), (x, w))
    region = compiled.compiled(short_conv)
    fast = region(x, w)
    fast_grads = torch.autograd.grad((fast * g).sum(), (x, w))
    assert compiled.unavailable() is None  # it really ran compiled, not the fallback
    torch.testing.assert_close(fast, plain)
    for a, b in zip(fast_grads, plain_grads):
        torch.testing.assert_close(a, b)


def _favor_training_against_autograd(mm_dtype, T, out_dtype=torch.float32, backward_autocast=False):
    """The training step's FAVOR+ attention (its own backward pass) against favor_attention under
    autograd: the same output and gradients, in fp32 and with bf16 chunk products."""
    torch.manual_seed(0)
    B, H, dk, Dv, M = 2, 3, 8, 6, 16
    q, k = torch.randn(B, H, T, dk, requires_grad=True), torch.randn(B, H, T, dk, requires_grad=True)
    v = torch.randn(B, H, T, Dv, requires_grad=True)
    omega = torch.randn(M, dk) * dk ** -0.25
    g = torch.randn(B, H, T, Dv)
    kw = dict(omega=omega, scale2=dk ** -0.5, chunk_size=32, mm_dtype=mm_dtype)
    plain = favor_attention(q, k, v, **kw)[0].to(out_dtype)
    plain_grads = torch.autograd.grad((plain.float() * g).sum(), (q, k, v))
    fast, none = favor_attention_training(q, k, v, **kw, out_dtype=out_dtype)
    assert none is None  # a training sequence keeps no state
    assert fast.dtype == out_dtype and fast.transpose(1, 2).is_contiguous()  # the heads' concatenation: a view
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=backward_autocast):  # as the trainer calls it
        fast_grads = torch.autograd.grad((fast.float() * g).sum(), (q, k, v))
    tol = {} if mm_dtype is None else dict(rtol=2e-2, atol=2e-2 if out_dtype == torch.float32 else 5e-2)
    torch.testing.assert_close(fast, plain, **tol)
    for a, b in zip(fast_grads, plain_grads):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("mm_dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("T", [96, 100, 20, 1])  # whole chunks of 32, a padded last one, less than a chunk
def test_compiled_favor_attention_equals_the_plain_one(compiling, mm_dtype, T):
    _favor_training_against_autograd(mm_dtype, T)
    assert compiled.unavailable() is None  # it really ran compiled, not the fallback


@pytest.mark.parametrize("mm_dtype", [None, torch.bfloat16])
def test_uncompiled_favor_attention_training_equals_the_plain_one(mm_dtype):
    _favor_training_against_autograd(mm_dtype, 100)


def test_favor_attention_training_in_bf16_and_under_autocast(compiling):
    """Its output in bf16 (what the output projection reads under autocast), and its backward pass
    under autocast (the trainer's) still fp32 where the products' dtype is fp32."""
    _favor_training_against_autograd(torch.bfloat16, 100, out_dtype=torch.bfloat16)
    _favor_training_against_autograd(None, 100, backward_autocast=True)


def test_a_failed_compile_runs_uncompiled_and_says_so_once(compiling):
    def double(x):
        return 2 * x

    region = compiled.compiled(double)

    def broken(*args):
        raise RuntimeError("Compiler: cc not found\nmore detail")

    region.compiled = broken
    assert compiled.unavailable() is None
    with pytest.warns(UserWarning, match=r"torch.compile failed \(RuntimeError: Compiler: cc not found\); the step"):
        assert torch.equal(region(torch.ones(3)), torch.full((3,), 2.0))
    assert "Compiler: cc not found" in compiled.unavailable()
    other = compiled.compiled(short_conv)  # every region now runs uncompiled, without a second warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(region(torch.ones(2)), torch.full((2,), 2.0))
        x, w = torch.randn(1, 5, 3), torch.randn(2, 3)
        torch.testing.assert_close(other(x, w), short_conv(x, w))


def test_bf16_chunk_products_keep_the_attention_state_fp32():
    torch.manual_seed(0)
    B, H, T, M, Dv = 2, 3, 200, 16, 8
    qf, kf = torch.rand(B, H, T, M) + 0.1, torch.rand(B, H, T, M) + 0.1
    v = torch.randn(B, H, T, Dv)
    o32, s32 = chunked_linear_attention(qf, kf, v, None, True, chunk_size=32)
    o16, s16 = chunked_linear_attention(qf, kf, v, None, True, chunk_size=32, mm_dtype=torch.bfloat16)
    assert o16.dtype == torch.float32 and s16.dtype == torch.float32
    torch.testing.assert_close(o16, o32, rtol=0, atol=2e-2)
    # bf16 inputs (8-bit mantissas) to sums of 200 terms: within 2% of the state's scale
    torch.testing.assert_close(s16, s32, rtol=0, atol=0.02 * float(s32.abs().max()))


def test_a_compiled_training_step_has_autograds_gradients(compiling, monkeypatch):
    """The whole model's training step, its regions compiled and FAVOR+ with its own backward pass,
    against the same step uncompiled with FAVOR+ differentiated by autograd (favor_attention)."""
    import torch._dynamo

    import spemusic.nn.model
    from spemusic import ModelConfig, Performer

    def gradients():
        torch.manual_seed(0)  # the same weights and the same SPE draw in both
        model = Performer(ModelConfig.preset("tiny", vocab_size=40, short_conv=4, chunk_size=16)).train()
        ids = torch.randint(0, 40, (2, 71))
        logits = model(ids[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, 40), ids[:, 1:].reshape(-1)).backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    fast = gradients()
    assert compiled.unavailable() is None
    monkeypatch.setattr(spemusic.nn.model, "favor_attention_training",
                        lambda *args, out_dtype, **kw: (favor_attention(*args, **kw)[0].to(out_dtype), None))
    with torch._dynamo.config.patch(disable=True):
        assert compiled.unavailable() is not None
        plain = gradients()
    assert fast.keys() == plain.keys() and len(fast) > 10
    for name in fast:
        torch.testing.assert_close(fast[name], plain[name], rtol=1e-4, atol=1e-5, msg=name)
