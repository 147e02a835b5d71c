"""returns.py against independent computations: explicit k-step sums, closed forms, per-episode loops."""

import statistics

import pytest
import torch

from minirl.returns import discounted_returns, gae, group_advantages

GAMMAS = [0.0, 0.5, 0.9, 0.99, 1.0]
LAMS = [0.0, 0.3, 0.95, 1.0]


def rollout(T: int, seed: int, p_term: float = 0.15, p_trunc: float = 0.1):
    """Random (T,) rollout whose values are consistent: next_val[t] == val[t + 1] inside an episode."""
    g = torch.Generator().manual_seed(seed)
    rew = torch.randn(T, generator=g, dtype=torch.float64)
    val = torch.randn(T, generator=g, dtype=torch.float64)
    u = torch.rand(T, generator=g, dtype=torch.float64)
    terminated = u < p_term
    truncated = (u >= p_term) & (u < p_term + p_trunc)
    final_val = torch.randn(T, generator=g, dtype=torch.float64)  # V of a final observation (before reset)
    next_val = torch.cat([val[1:], torch.randn(1, generator=g, dtype=torch.float64)])
    next_val = torch.where(terminated | truncated, final_val, next_val)
    return rew, val, next_val, terminated, truncated


def k_step_advantage(t, k, rew, val, next_val, terminated, truncated, gamma):
    """A^(k)_t = sum_{l<k} gamma^l r_{t+l} + gamma^k V(s_{t+k}) - V(s_t), stopped at the episode or rollout end."""
    total = 0.0
    for step in range(k):
        i = t + step
        total += gamma**step * rew[i].item()
        end = terminated[i] or truncated[i] or i == len(rew) - 1
        if step == k - 1 or end:
            bootstrap = 0.0 if terminated[i] else next_val[i].item()
            return total + gamma ** (step + 1) * bootstrap - val[t].item(), end
    raise AssertionError("unreachable")


def gae_reference(rew, val, next_val, terminated, truncated, gamma, lam):
    """GAE as the (1 - lambda)-weighted average of k-step advantages (Schulman et al. 2016 Eq. 15)."""
    out = []
    for t in range(len(rew)):
        total, k, weight = 0.0, 1, 1.0 - lam
        while True:
            a_k, reached_end = k_step_advantage(t, k, rew, val, next_val, terminated, truncated, gamma)
            if reached_end:  # every longer estimator equals this one: the tail weight is lam^(k-1)
                total += lam ** (k - 1) * a_k
                break
            total += weight * lam ** (k - 1) * a_k
            k += 1
        out.append(total)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("lam", LAMS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_equals_weighted_sum_of_k_step_advantages(gamma, lam, seed):
    data = rollout(T=25, seed=seed)
    adv, ret = gae(*data, gamma=gamma, lam=lam)
    expected = gae_reference(*data, gamma=gamma, lam=lam)
    torch.testing.assert_close(adv, expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, adv + data[1])


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("lam", LAMS)
def test_gae_constant_value_closed_form(gamma, lam):
    """r = 1 and V = c everywhere, no episode end: A_t = delta (1 - (gamma lam)^(T - t)) / (1 - gamma lam)."""
    T, c = 12, 2.5
    ones = torch.ones(T, dtype=torch.float64)
    no = torch.zeros(T, dtype=torch.bool)
    adv, _ = gae(ones, c * ones, c * ones, no, no, gamma=gamma, lam=lam)
    delta = 1.0 + gamma * c - c
    gl = gamma * lam
    expected = [delta * (T - t if gl == 1 else (1 - gl ** (T - t)) / (1 - gl)) for t in range(T)]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("gamma", GAMMAS)
def test_gae_lambda_zero_is_td_residual_and_lambda_one_is_monte_carlo(gamma):
    rew, val, next_val, terminated, truncated = rollout(T=30, seed=3)
    adv0, _ = gae(rew, val, next_val, terminated, truncated, gamma=gamma, lam=0.0)
    delta = rew + gamma * (~terminated) * next_val - val
    torch.testing.assert_close(adv0, delta)

    adv1, ret1 = gae(rew, val, next_val, terminated, truncated, gamma=gamma, lam=1.0)
    # Monte Carlo return, bootstrapped only where the episode was cut (truncation or rollout end).
    end = terminated | truncated
    boot = torch.where(terminated, 0.0, next_val)
    mc = torch.zeros_like(rew)
    for t in range(len(rew)):
        g, i = 0.0, t
        while True:
            g += gamma ** (i - t) * rew[i].item()
            if end[i] or i == len(rew) - 1:
                g += gamma ** (i - t + 1) * boot[i].item()
                break
            i += 1
        mc[t] = g
    torch.testing.assert_close(ret1, mc)
    torch.testing.assert_close(adv1, mc - val)


def test_gae_truncation_bootstraps_and_termination_does_not():
    """Two one-step episodes by hand: same reward 1, same final value 10, gamma 0.5."""
    rew = torch.tensor([1.0, 1.0])
    val = torch.tensor([0.0, 0.0])
    next_val = torch.tensor([10.0, 10.0])
    terminated = torch.tensor([True, False])
    truncated = torch.tensor([False, True])
    adv, _ = gae(rew, val, next_val, terminated, truncated, gamma=0.5, lam=0.9)
    torch.testing.assert_close(adv, torch.tensor([1.0, 1.0 + 0.5 * 10.0]))


@pytest.mark.parametrize("lam", [0.0, 0.9, 1.0])
def test_gae_batched_columns_match_single_runs(lam):
    cols = [rollout(T=20, seed=s) for s in range(4)]
    batched = [torch.stack([c[i] for c in cols], dim=1) for i in range(5)]  # each (T, N)
    adv, ret = gae(*batched, gamma=0.97, lam=lam)
    assert adv.shape == (20, 4)
    for n, c in enumerate(cols):
        a, r = gae(*c, gamma=0.97, lam=lam)
        torch.testing.assert_close(adv[:, n], a)
        torch.testing.assert_close(ret[:, n], r)


def episode_returns_by_hand(rew, done, gamma):
    """Split the rollout into episodes and compute sum_k gamma^k r_{t+k} inside each."""
    rtg, full, start = [], [], 0
    for t in range(len(rew) + 1):
        if t == len(rew) or (t > 0 and done[t - 1]):
            ep = rew[start:t].tolist()
            ep_rtg = [sum(gamma**k * r for k, r in enumerate(ep[i:])) for i in range(len(ep))]
            rtg += ep_rtg
            full += [ep_rtg[0]] * len(ep)
            start = t
    return torch.tensor(rtg, dtype=torch.float64), torch.tensor(full, dtype=torch.float64)


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("seed", [0, 1])
def test_discounted_returns_per_episode(gamma, seed):
    rew, _, _, terminated, truncated = rollout(T=40, seed=seed)
    done = terminated | truncated
    rtg, full = episode_returns_by_hand(rew, done, gamma)
    torch.testing.assert_close(discounted_returns(rew, done, gamma), rtg)
    torch.testing.assert_close(discounted_returns(rew, done, gamma, reward_to_go=False), full)
    # (T, N) gives the columns' answers
    stacked = discounted_returns(torch.stack([rew, rew.flip(0)], 1), torch.stack([done, done.flip(0)], 1), gamma)
    torch.testing.assert_close(stacked[:, 1], discounted_returns(rew.flip(0), done.flip(0), gamma))


def reference_group_advantages(rewards, G, scale, eps):
    r = rewards.tolist()
    batch_std = statistics.stdev(r)
    out = []
    for i in range(0, len(r), G):
        grp = r[i : i + G]
        mean = statistics.fmean(grp)
        denom = {"group": statistics.stdev(grp) + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        out += [(x - mean) / denom for x in grp]
    return torch.tensor(out, dtype=rewards.dtype)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("G", [2, 4, 8])
def test_group_advantages_against_reference(scale, G):
    g = torch.Generator().manual_seed(G)
    rewards = torch.randn(5 * G, generator=g, dtype=torch.float64)
    rewards[:G] = 0.7  # one all-equal group
    adv = group_advantages(rewards, G, scale=scale)
    torch.testing.assert_close(adv, reference_group_advantages(rewards, G, scale, 1e-4))
    assert torch.all(adv[:G] == 0), "an all-equal group must give exactly zero advantage"
    torch.testing.assert_close(adv.view(-1, G).sum(1), torch.zeros(5, dtype=torch.float64), atol=1e-12, rtol=0)
    # adding a constant changes nothing
    torch.testing.assert_close(group_advantages(rewards + 3.0, G, scale=scale), adv)


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_group_advantages_scale_invariant(scale):
    rewards = torch.randn(32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a1 = group_advantages(rewards, 8, scale=scale)
    a2 = group_advantages(5.0 * rewards, 8, scale=scale)
    torch.testing.assert_close(a1, a2, rtol=1e-3, atol=1e-3)  # equal up to eps


def test_group_advantages_none_is_linear():
    g = torch.Generator().manual_seed(1)
    r1 = torch.randn(24, generator=g, dtype=torch.float64)
    r2 = torch.randn(24, generator=g, dtype=torch.float64)
    a = lambda r: group_advantages(r, 6, scale="none")  # noqa: E731
    torch.testing.assert_close(a(2.0 * r1 - 3.0 * r2), 2.0 * a(r1) - 3.0 * a(r2))


def test_group_advantages_binary_rewards_stay_finite():
    rewards = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    adv = group_advantages(rewards, 4)
    assert torch.isfinite(adv).all()
    assert torch.all(adv[:8] == 0)
    assert adv[9] > 0 > adv[8]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: group_advantages(torch.ones(8), 1), "group_size"),
        (lambda: group_advantages(torch.ones(10), 4), "multiple of group_size"),
        (lambda: group_advantages(torch.tensor([1.0, float("nan")]), 2), "rewards contains NaN"),
        (lambda: group_advantages(torch.ones(4), 2, scale="std"), "scale must be one of"),
        (lambda: group_advantages(torch.ones(2, 2), 2), "rewards must have 1 dimensions"),
        (lambda: gae(*rollout(5, 0)[:4], torch.zeros(6, dtype=torch.bool), 0.9, 0.9), "shapes must match"),
        (lambda: gae(*rollout(5, 0), gamma=1.5, lam=0.9), "gamma must be"),
        (lambda: gae(*rollout(5, 0), gamma=0.9, lam=-0.1), "lam must be"),
        (lambda: discounted_returns(torch.arange(3), torch.zeros(3), 0.9), "rew must be a floating-point"),
        (lambda: discounted_returns(torch.ones(3), torch.tensor([0.0, 2.0, 0.0]), 0.9), "done must be boolean"),
        (lambda: discounted_returns([1.0, 2.0], torch.zeros(2), 0.9), "rew must be a torch.Tensor"),
    ],
)
def test_bad_input_names_the_problem(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
