"""losses.py against independent computations: scalar loops, torch.distributions, exact KL, Monte Carlo."""

import math

import pytest
import torch

from minirl.losses import (
    aggregate,
    clip_fraction,
    entropy,
    entropy_grad,
    kl,
    policy_gradient_loss,
    ppo_clip_loss,
    ppo_clip_loss_and_grad,
    value_loss,
    value_loss_and_grad,
)


def scalar_clip_objective(ratio: float, adv: float, low: float, high: float) -> float:
    """L_CLIP at one sample, written out case by case from Schulman et al. 2017 Fig. 1."""
    if adv >= 0:
        return min(ratio, 1 + high) * adv
    return max(ratio, 1 - low) * adv


@pytest.mark.parametrize(("clip_low", "clip_high"), [(0.2, None), (0.1, 0.3), (0.2, 0.28)])
def test_ppo_clip_loss_matches_case_by_case_definition(clip_low, clip_high):
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(200, generator=g, dtype=torch.float64) * 0.3 - 1.0
    old_logp = logp + torch.randn(200, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(200, generator=g, dtype=torch.float64)
    loss = ppo_clip_loss(logp, old_logp, adv, clip_low, clip_high)
    high = clip_low if clip_high is None else clip_high
    ratio = torch.exp(logp - old_logp)
    expected = [-scalar_clip_objective(r, a, clip_low, high) for r, a in zip(ratio.tolist(), adv.tolist(), strict=True)]
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    # L_CLIP <= L_CPI: the clipped objective is a pessimistic bound of the unclipped one
    assert torch.all(-loss <= ratio * adv + 1e-12)
    assert clip_fraction(logp, old_logp, clip_low, clip_high).mean() > 0  # the data do leave the band


def test_ppo_clip_gradient_vanishes_outside_band_in_helpful_direction():
    old_logp = torch.zeros(4, dtype=torch.float64)
    # ratios 1.5 (A>0, beyond 1+eps), 0.5 (A<0, below 1-eps), 1.5 (A<0), 0.5 (A>0)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.5, 0.5], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    ppo_clip_loss(logp, old_logp, adv, 0.2).sum().backward()
    # helpful direction already past the band: no gradient; harmful direction: the full gradient -A * ratio
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.0, 1.5, -0.5], dtype=torch.float64))
    torch.testing.assert_close(clip_fraction(logp, old_logp, 0.2), torch.ones(4, dtype=torch.float64))


def test_ppo_clip_equals_policy_gradient_at_ratio_one():
    """At theta = theta_old the clipped loss has the policy-gradient loss's gradient."""
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(10, generator=g, dtype=torch.float64, requires_grad=True)
    adv = torch.randn(10, generator=g, dtype=torch.float64)
    (g1,) = torch.autograd.grad(ppo_clip_loss(logp, logp.detach(), adv).sum(), logp)
    (g2,) = torch.autograd.grad(policy_gradient_loss(logp, adv).sum(), logp)
    torch.testing.assert_close(g1, g2)
    torch.testing.assert_close(g2, -adv)


def test_value_loss_plain_and_clipped():
    val = torch.tensor([1.0, 3.0, -2.0])
    ret = torch.tensor([0.0, 0.0, 0.0])
    old_val = torch.tensor([0.9, 1.0, -1.0])
    torch.testing.assert_close(value_loss(val, ret), torch.tensor([0.5, 4.5, 2.0]))
    # clipped prediction: old + clip(val - old, -0.5, 0.5) = [1.0, 1.5, -1.5]; max of squared errors, halved
    expected = 0.5 * torch.maximum(val**2, torch.tensor([1.0, 1.5, -1.5]) ** 2)
    torch.testing.assert_close(value_loss(val, ret, old_val, clip=0.5), expected)
    with pytest.raises(ValueError, match="old_val"):
        value_loss(val, ret, clip=0.5)


def autograd_of(loss, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """d loss(x, ...).sum() / dx by autograd: the per-element derivative of a per-element loss."""
    x = x.detach().clone().requires_grad_()
    loss(x, *args, **kwargs).sum().backward()
    return x.grad


def exact_log(r: torch.Tensor) -> torch.Tensor:
    """A float x with exp(x) == r exactly: log(r), moved by a few float steps where rounding misses."""
    x = torch.log(r)
    for _ in range(8):
        if torch.exp(x) == r:
            return x
        x = torch.nextafter(x, torch.tensor(float("inf")) if torch.exp(x) < r else torch.tensor(float("-inf")))
    raise AssertionError(f"no float x has exp(x) == {r.item()}")


@pytest.mark.parametrize(("clip_low", "clip_high"), [(0.25, None), (0.125, 0.375), (0.2, 0.28)])
def test_ppo_clip_loss_and_grad_is_autograds(clip_low, clip_high):
    """Every case of the clip: inside the range, exactly on its bounds, beyond them, with A > 0, A < 0 and A = 0."""
    high = clip_low if clip_high is None else clip_high
    ratio = torch.tensor([1.0, 1.0 - clip_low, 1.0 + high, 0.5, 1.5, 0.9, 1.1])
    logp = torch.stack([exact_log(r) for r in ratio]).repeat(3)  # (21,) each ratio with each sign of A
    adv = torch.tensor([1.5, -0.7, 0.0]).repeat_interleave(7)
    old_logp = torch.zeros(21)
    assert torch.equal(torch.exp(logp - old_logp), ratio.repeat(3))  # the bounds are hit exactly
    want = autograd_of(lambda x: ppo_clip_loss(x, old_logp, adv, clip_low, clip_high), logp)
    loss, got = ppo_clip_loss_and_grad(logp, old_logp, adv, clip_low, clip_high)
    assert torch.equal(loss, ppo_clip_loss(logp, old_logp, adv, clip_low, clip_high))
    torch.testing.assert_close(got, want)
    assert (got == 0).sum() > 6 and (got != 0).sum() > 6  # both branches of the clip were taken


@pytest.mark.parametrize("clip", [None, 0.5])
def test_value_loss_and_grad_is_autograds(clip):
    """Inside and outside the value clip, and on its ties (V = V_old, and V_clipped - R = -(V - R))."""
    old_val = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 2.0])
    val = torch.tensor([0.2, 1.5, -1.5, 0.0, 3.0, -2.0, 0.75, 2.5])
    ret = torch.tensor([1.0, 0.0, -2.0, 0.3, 0.5, -3.0, 0.625, 2.0])
    want = autograd_of(lambda x: value_loss(x, ret, old_val, clip), val)
    loss, got = value_loss_and_grad(val, ret, old_val, clip)
    assert torch.equal(loss, value_loss(val, ret, old_val, clip))
    torch.testing.assert_close(got, want)


def test_entropy_grad_is_autograds():
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(1)) * 3
    torch.testing.assert_close(entropy_grad(logits), autograd_of(entropy, logits))


def test_entropy_matches_torch_distributions():
    logits = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy(logits), expected)
    assert entropy(torch.zeros(4, dtype=torch.float64)).item() == pytest.approx(math.log(4))


def categoricals(seed: int, A: int = 6):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(A, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(A, generator=g, dtype=torch.float64), 0)
    return p, q


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_estimators_unbiased_and_k3_nonnegative(seed):
    p, q = categoricals(seed)
    exact = torch.distributions.kl_divergence(
        torch.distributions.Categorical(probs=p), torch.distributions.Categorical(probs=q)
    ).item()
    # exact expectation over a ~ p: k1 and k3 are unbiased
    for kind in ("k1", "k3"):
        est = kl(p.log(), q.log(), kind)  # one estimate per action
        assert (p * est).sum().item() == pytest.approx(exact, rel=1e-10)
    assert (p * kl(p.log(), q.log(), "k2")).sum().item() != pytest.approx(exact, rel=1e-3)  # k2 is biased
    # the sample mean over draws from p converges to the exact KL
    a = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(seed))
    sample_mean = kl(p.log()[a], q.log()[a], "k3").mean().item()
    assert sample_mean == pytest.approx(exact, rel=0.03)
    # k3 >= 0 everywhere, zero only where the log-probs agree
    grid = torch.linspace(-8, 8, 401, dtype=torch.float64)
    k3 = kl(torch.zeros_like(grid), grid, "k3")
    assert torch.all(k3 >= 0)
    assert k3[200].item() == 0.0 and torch.all(k3[torch.arange(401) != 200] > 0)
    assert torch.all(kl(torch.zeros_like(grid), grid, "k2") >= 0)


def test_kl_is_zero_between_equal_distributions():
    logp = torch.log_softmax(torch.randn(10, dtype=torch.float64), 0)
    for kind in ("k1", "k2", "k3"):
        assert torch.all(kl(logp, logp, kind) == 0)


def aggregate_by_loop(loss, mask, mode, max_len=None):
    B, L = loss.shape
    max_len = L if max_len is None else max_len
    rows = []
    for i in range(B):
        toks = [loss[i, t].item() for t in range(L) if mask[i, t]]
        rows.append(toks)
    if mode == "token-mean":
        flat = [x for r in rows for x in r]
        return sum(flat) / len(flat)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / B
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / B
    return sum(sum(r) for r in rows) / (B * max_len)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("max_len", [None, 20])
def test_aggregate_against_loop(mode, max_len):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(5, 9, generator=g, dtype=torch.float64)
    lengths = torch.tensor([1, 9, 4, 6, 2])
    mask = torch.arange(9)[None, :] < lengths[:, None]  # (B, L), completions of unequal length
    got = aggregate(loss, mask, mode, max_len=max_len)
    assert got.item() == pytest.approx(aggregate_by_loop(loss, mask, mode, max_len), rel=1e-12)
    # padded positions never matter
    garbage = torch.where(mask, loss, torch.full_like(loss, 1e6))
    assert aggregate(garbage, mask.float(), mode, max_len=max_len).item() == pytest.approx(got.item(), rel=1e-12)


def test_aggregate_modes_weigh_long_completions_differently():
    """One long and one short completion, every token loss 1: per-token vs per-sequence weighting (Dr. GRPO)."""
    loss = torch.ones(2, 10)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, :10] = True
    mask[1, :2] = True
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(1.0)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(1.0)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx(6.0)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(12 / 20)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: aggregate(torch.ones(2, 3), torch.zeros(2, 3), "token-mean"), "selects no tokens"),
        (
            lambda: aggregate(torch.ones(2, 3), torch.tensor([[1, 1, 0], [0, 0, 0]]), "seq-mean-token-mean"),
            r"rows \[1\]",
        ),
        (lambda: aggregate(torch.ones(2, 3), torch.ones(2, 3), "mean"), "mode must be one of"),
        (lambda: aggregate(torch.ones(6), torch.ones(6), "token-mean"), "loss must have 2 dimensions"),
        (lambda: aggregate(torch.ones(2, 3), torch.ones(2, 3), "seq-mean-token-sum-norm", max_len=2), "max_len"),
        (lambda: kl(torch.zeros(3), torch.zeros(3), kind="k4"), "kind must be one of"),
        (lambda: kl(torch.zeros(3), torch.tensor([0.0, float("inf"), 0.0])), "ref_logp contains NaN or inf"),
        (lambda: ppo_clip_loss(torch.zeros(3), torch.zeros(4), torch.zeros(3)), "shapes must match"),
        (lambda: ppo_clip_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), clip_low=1.5), "clip_low"),
        (lambda: policy_gradient_loss(torch.zeros(3), torch.tensor([0.0, float("nan"), 0.0])), "adv contains NaN"),
        (lambda: entropy(torch.tensor(1.0)), "last dimension"),
        (lambda: ppo_clip_loss_and_grad(torch.zeros(3), torch.zeros(4), torch.zeros(3)), "shapes must match"),
        (lambda: value_loss_and_grad(torch.zeros(3), torch.zeros(3), clip=0.2), "clip needs old_val"),
        (lambda: entropy_grad(torch.tensor(1.0)), "last dimension"),
    ],
)
def test_bad_input_names_the_problem(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
