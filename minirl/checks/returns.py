"""Checks of returns, TD targets and advantages: ``minirl.returns`` and ``minirl.algos.dqn.td_target``.

Shapes
    T   time steps (the leading dimension), N environments, B samples or completions, G per group, A actions
"""

import torch

from minirl import returns
from minirl.algos import dqn
from minirl.checks.core import Case, generator, run


def _flags(T: int, N: int, p: float, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(T, N, generator=gen) < p  # (T, N) bool, True with probability p


def check_discounted_returns(fn) -> None:
    """Check ``fn(rew, done, gamma, reward_to_go=True)`` against ``minirl.returns.discounted_returns``
    (``notebooks/03_reinforce_and_baselines.ipynb``): G_t = r_t + gamma * (1 - done_t) * G_{t+1}."""
    gen = generator(3)
    rew = torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0])  # (T,)
    no_end = torch.zeros(5, dtype=torch.bool)
    mid = torch.tensor([False, True, False, False, False])
    backward = "G_t = r_t + gamma * G_{t+1}, computed backwards from the last step (the batch cuts the episode there)"
    reset = ("after done_t a new episode begins: G_t = r_t + gamma * (1 - done_t) * G_{t+1}, so no reward of the next "
             "episode leaks into this one")
    total = ("with reward_to_go=False every step of an episode gets G_0, the return from the episode's first step "
             "(the step at t = 0 or right after a done)")
    cases = [
        Case("one episode, no ends", dict(rew=rew, done=no_end, gamma=0.9, reward_to_go=True), backward),
        Case("gamma = 1: plain sums of the rewards still to come", dict(rew=rew, done=no_end, gamma=1.0,
                                                                        reward_to_go=True), backward),
        Case("gamma = 0: G_t = r_t", dict(rew=rew, done=no_end, gamma=0.0, reward_to_go=True), backward),
        Case("an episode ends at t = 1", dict(rew=rew, done=mid, gamma=0.9, reward_to_go=True), reset),
        Case("episodes of one step each", dict(rew=rew, done=~no_end, gamma=0.9, reward_to_go=True), reset),
        Case("several environments (T, N)", dict(rew=torch.randn(6, 3, generator=gen), done=_flags(6, 3, 0.3, gen),
                                                 gamma=0.8, reward_to_go=True),
             "time is the first dimension: loop t from T - 1 down to 0 and update all N environments at once"),
        Case("reward_to_go=False, one episode", dict(rew=rew, done=no_end, gamma=0.9, reward_to_go=False), total),
        Case("reward_to_go=False, an episode ends at t = 1", dict(rew=rew, done=mid, gamma=0.9, reward_to_go=False),
             total),
    ]
    for i, (T, N, dtype) in enumerate([(12, 3, torch.float32), (9, 2, torch.float64), (15, 4, torch.float32)]):
        args = dict(rew=torch.randn(T, N, generator=gen, dtype=dtype), done=_flags(T, N, 0.25, gen),
                    gamma=round(0.5 + 0.5 * torch.rand(1, generator=gen).item(), 3), reward_to_go=i != 1)
        cases.append(Case(f"random batch {i + 1}", args, f"{reset}; {total}"))
    run("check_discounted_returns", fn, returns.discounted_returns, cases)


def check_td_target(fn) -> None:
    """Check ``fn(rew, next_q, terminated, gamma)`` against ``minirl.algos.dqn.td_target``
    (``notebooks/01_value_vs_policy.ipynb``): y = r + gamma * (1 - terminated) * max_a' Q(s', a')."""
    gen = generator(1)
    rew = torch.tensor([1.0, 0.0, -1.0, 0.5])  # (B,)
    next_q = torch.tensor([[1.0, 3.0], [-2.0, -0.5], [0.2, 0.1], [-1.0, 4.0]])  # (B, A)
    running = torch.zeros(4, dtype=torch.bool)
    maximum = ("y = r + gamma * max_a' Q(s', a'): the max over each row's actions, next_q.max(dim=-1).values "
               "(not the max of the whole batch, not a mean)")
    no_future = ("after a termination there is no next state: y = r. Multiply the bootstrap by (1 - terminated). "
                 "A time limit (truncation) is not a termination: it arrives as terminated=False and bootstraps")
    cases = [
        Case("no episode ends", dict(rew=rew, next_q=next_q, terminated=running, gamma=0.9), maximum),
        Case("gamma = 0: y = r", dict(rew=rew, next_q=next_q, terminated=running, gamma=0.0), maximum),
        Case("one action", dict(rew=rew, next_q=next_q[:, :1], terminated=running, gamma=0.9), maximum),
        Case("one terminated step", dict(rew=rew, next_q=next_q, terminated=torch.tensor([False, True, False, False]),
                                         gamma=0.9), no_future),
        Case("every step terminated", dict(rew=rew, next_q=next_q, terminated=~running, gamma=0.99), no_future),
    ]
    for i in range(3):
        B, A = 8, 3 + i
        args = dict(rew=torch.randn(B, generator=gen), next_q=torch.randn(B, A, generator=gen),
                    terminated=torch.rand(B, generator=gen) < 0.3, gamma=0.99)
        cases.append(Case(f"random batch {i + 1}", args, f"{maximum}; {no_future}"))
    run("check_td_target", fn, dqn.td_target, cases)


def check_gae(fn) -> None:
    """Check ``fn(rew, val, next_val, terminated, truncated, gamma, lam) -> (adv, ret)`` against
    ``minirl.returns.gae`` (``notebooks/06_gae.ipynb``), Schulman et al. 2016 Eq. 16:

        delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}
    """
    gen = generator(6)
    T = 5
    rew = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5])  # (T,)
    val = torch.tensor([0.5, 1.0, -0.5, 2.0, 1.5])  # (T,) V(s_t)
    next_val = torch.tensor([1.0, -0.5, 9.0, 1.5, 3.0])  # (T,) V(s_{t+1}); 9.0 is the final observation at t = 2
    none = torch.zeros(T, dtype=torch.bool)
    at2 = torch.tensor([False, False, True, False, False])

    def args(terminated=none, truncated=none, gamma=0.9, lam=0.95, **kw):
        base = dict(rew=rew, val=val, next_val=next_val, terminated=terminated, truncated=truncated)
        return {**base, **kw, "gamma": gamma, "lam": lam}

    residual = "with lam = 0, A_t = delta_t = r_t + gamma * V(s_{t+1}) - V(s_t), and V(s_{t+1}) is next_val[t]"
    backward = ("A_t = delta_t + gamma * lam * A_{t+1}, computed backwards from the last step; the batch ends there, "
                "so A_{T-1} = delta_{T-1}")
    terminate = ("after a termination the future is worth 0: delta_t = r_t - V(s_t), so multiply gamma * next_val by "
                 "(1 - terminated); and the sum stops there: A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}")
    truncate = ("a truncation (time limit) is not a termination: delta_t still bootstraps from next_val (the value of "
                "the final observation), but the sum stops there: multiply A_{t+1} by (1 - done_t), with "
                "done_t = terminated_t or truncated_t")
    both = f"{terminate}. And {truncate}"
    cases = [
        Case("one episode, lam = 0", args(lam=0.0), residual),
        Case("one episode", args(), backward),
        Case("one episode, lam = 1: the Monte Carlo return minus V", args(lam=1.0), backward),
        Case("gamma = 0", args(gamma=0.0), backward),
        Case("termination at t = 2 (next_val there must not be used)", args(terminated=at2), terminate),
        Case("termination at the last step", args(terminated=torch.arange(T) == T - 1), terminate),
        Case("truncation at t = 2 (bootstrap from next_val, then stop)", args(truncated=at2), truncate),
        Case("one step, T = 1", args(rew=rew[:1], val=val[:1], next_val=next_val[:1], terminated=none[:1],
                                     truncated=none[:1]), backward),
    ]
    for i, (N, dtype) in enumerate([(3, torch.float32), (4, torch.float64), (2, torch.float32)]):
        rew, val, next_val = torch.randn(3, 12, N, generator=gen, dtype=dtype)  # (T, N) each, T = 12
        terminated = _flags(12, N, 0.15, gen)
        random = dict(rew=rew, val=val, next_val=next_val, terminated=terminated,
                      truncated=_flags(12, N, 0.15, gen) & ~terminated, gamma=0.99, lam=0.9 - 0.2 * i)
        cases.append(Case(f"random (T, N) batch {i + 1} with terminations and truncations", random,
                          f"time is the first dimension; {both}"))
    ret_hint = "ret is the critic's regression target: ret = adv + val"
    run("check_gae", fn, returns.gae, cases, outputs=("adv", "ret"), output_hints={"ret": ret_hint})


def check_group_advantages(fn) -> None:
    """Check ``fn(rewards, group_size, scale="group", eps=1e-4)`` against ``minirl.returns.group_advantages``
    (``notebooks/07_grpo_on_cartpole.ipynb``): A_i = (r_i - mean(r_group)) / (std(r_group) + eps)."""
    gen = generator(7)
    one = torch.tensor([1.0, 0.0, 3.0, 2.0])  # (B,) one group of G = 4
    two = torch.tensor([1.0, 0.0, 3.0, 2.0, 10.0, 20.0, 40.0, 10.0])  # two groups of 4
    group = ("A_i = (r_i - mean of its group) / (std of its group + eps), with the unbiased std (torch.std's "
             "default); eps is added to the std, outside the square root")
    own = ("each group is compared only with itself: view the rewards as (n_groups, G) and take the mean and std "
           "along dim=1, keepdim=True")
    equal = ("an all-equal group carries no signal: r_i - mean = 0 and std = 0, so (0) / (0 + eps) = 0, never NaN. "
             "Divide by (std + eps)")
    batch = "scale='batch' divides each group-centred reward by the std of all B raw rewards (plus eps)"
    none = "scale='none' does not divide at all (Dr. GRPO): A_i = r_i - mean(r_group)"
    cases = [
        Case("one group of 4", dict(rewards=one, group_size=4, scale="group", eps=1e-4), group),
        Case("two groups of 4 on different scales", dict(rewards=two, group_size=4, scale="group", eps=1e-4), own),
        Case("an all-equal group next to a mixed one", dict(rewards=torch.tensor([5.0, 5.0, 5.0, 1.0, 0.0, 3.0]),
                                                            group_size=3, scale="group", eps=1e-4), equal),
        Case("two groups of 2", dict(rewards=torch.tensor([4.0, 0.0, 30.0, 20.0]), group_size=2, scale="group",
                                     eps=1e-4), own),
        Case("right/wrong rewards, G = 8, one right answer", dict(rewards=torch.tensor([1.0] + [0.0] * 7),
                                                                  group_size=8, scale="group", eps=1e-4), group),
        Case("eps = 0.5 (use the argument)", dict(rewards=one, group_size=4, scale="group", eps=0.5),
             "use the eps argument, added to the std, not a constant of your own"),
        Case("scale='batch'", dict(rewards=two, group_size=4, scale="batch", eps=1e-4), batch),
        Case("scale='none'", dict(rewards=two, group_size=4, scale="none", eps=1e-4), none),
        Case("scale='batch', all rewards equal", dict(rewards=torch.full((6,), 2.0), group_size=3, scale="batch",
                                                      eps=1e-4), equal),
    ]
    for i, (scale, hint) in enumerate((("group", group), ("batch", batch), ("none", none))):
        rewards = torch.randn(12, generator=gen) * 10**i  # (B,) 3 groups of 4
        cases.append(Case(f"random, 3 groups of 4, scale='{scale}'",
                          dict(rewards=rewards, group_size=4, scale=scale, eps=1e-4), f"{own}; {hint}"))
    run("check_group_advantages", fn, returns.group_advantages, cases)
