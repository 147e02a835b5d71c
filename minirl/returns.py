"""Returns and advantages: pure functions on tensors, shared by the gymnasium algorithms and the LM trainers.

Shapes
    T   time steps of a rollout (the leading dimension)
    N   parallel environments (optional second dimension)
    B   completions in a GRPO batch, G per group

Every function here takes ``(T,)`` or ``(T, N)`` time-major tensors (or ``(B,)`` for groups) and documents which
equation of the course it implements.
"""

import torch

from minirl._validate import as_tensor, in_range, one_of, same_shape

GROUP_SCALES = ("group", "batch", "none")


def discounted_returns(rew: torch.Tensor, done: torch.Tensor, gamma: float, reward_to_go: bool = True) -> torch.Tensor:
    """Discounted returns within each episode, restarting after every ``done``.

    With ``reward_to_go=True``:  G_t = r_t + gamma * (1 - done_t) * G_{t+1}   (the return from step t on).
    With ``reward_to_go=False``: every step of an episode gets G_0, the return of the whole episode, as in the
    original REINFORCE estimator; the course compares the two in ``notebooks/03_reinforce_and_baselines.ipynb``.

    Args:
        rew: (T,) or (T, N) rewards r_t.
        done: same shape, True where the episode ended at step t (terminated or truncated).
            An episode still running at t = T - 1 is cut there: its return counts only the rewards seen.
        gamma: discount factor in [0, 1].

    Returns:
        (T,) or (T, N) returns.
    """
    rew = as_tensor("rew", rew, ndims=(1, 2))
    done = as_tensor("done", done, ndims=(1, 2), dtype="bool")
    same_shape(rew=rew, done=done)
    gamma = in_range("gamma", gamma, 0.0, 1.0)

    not_done = (~done).to(rew.dtype)
    ret = torch.zeros_like(rew)
    running = torch.zeros_like(rew[0])
    for t in reversed(range(rew.shape[0])):
        running = rew[t] + gamma * not_done[t] * running  # reset at episode ends
        ret[t] = running
    if reward_to_go:
        return ret

    # Spread each episode's G_0 over its steps: an episode starts at t = 0 or right after a done.
    full = torch.empty_like(rew)
    start_ret = ret[0].clone()
    for t in range(rew.shape[0]):
        if t > 0:
            start_ret = torch.where(done[t - 1], ret[t], start_ret)
        full[t] = start_ret
    return full


def gae(
    rew: torch.Tensor,
    val: torch.Tensor,
    next_val: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation, Schulman et al. 2016 Eq. 16 (``notebooks/06_gae.ipynb``).

        delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},   done_t = terminated_t or truncated_t

    so A_t = sum_l (gamma lam)^l delta_{t+l} within one episode. Truncation (a time limit) bootstraps from the value
    of the true final observation; termination does not (the future is worth 0). Either way the recursion stops at
    the episode end, because the next row belongs to a new episode.

    Args:
        rew: (T,) or (T, N) rewards r_t.
        val: same shape, V(s_t).
        next_val: same shape, V of the observation that followed step t; at a truncation this is the value of the
            final observation of the old episode, not of the reset observation.
        terminated, truncated: same shape, bool.
        gamma: discount in [0, 1]; lam: the GAE lambda in [0, 1] (0: one-step TD, 1: Monte Carlo return minus V).

    Returns:
        adv: A_t, same shape; ret: A_t + V(s_t), the critic's regression target.
    """
    rew = as_tensor("rew", rew, ndims=(1, 2))
    val = as_tensor("val", val, ndims=(1, 2))
    next_val = as_tensor("next_val", next_val, ndims=(1, 2))
    terminated = as_tensor("terminated", terminated, ndims=(1, 2), dtype="bool")
    truncated = as_tensor("truncated", truncated, ndims=(1, 2), dtype="bool")
    same_shape(rew=rew, val=val, next_val=next_val, terminated=terminated, truncated=truncated)
    gamma = in_range("gamma", gamma, 0.0, 1.0)
    lam = in_range("lam", lam, 0.0, 1.0)

    not_term = (~terminated).to(rew.dtype)
    not_done = (~(terminated | truncated)).to(rew.dtype)
    delta = rew + gamma * not_term * next_val - val  # TD residual, 0 bootstrap on termination
    adv = torch.zeros_like(rew)
    running = torch.zeros_like(rew[0])
    for t in reversed(range(rew.shape[0])):
        running = delta[t] + gamma * lam * not_done[t] * running  # stop at every episode end
        adv[t] = running
    return adv, adv + val


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """Group-relative advantages of GRPO, Shao et al. 2024 Sec. 4.1 (``notebooks/07_grpo_on_cartpole.ipynb``).

        A_i = (r_i - mean(r_group)) / (std(r_group) + eps)

    ``rewards`` holds B = n_groups * G rewards, each group's G completions (or episodes) consecutive.
    ``scale`` chooses the denominator:
        "group": the unbiased std of the group (the GRPO paper);
        "batch": the unbiased std of all B raw rewards;
        "none":  no division, the centred reward only (Dr. GRPO, Liu et al. 2025).
    A group whose rewards are all equal gets zero advantage (never NaN): it carries no signal about which answer
    was better.

    Returns:
        (B,) advantages.
    """
    rewards = as_tensor("rewards", rewards, ndims=(1,))
    one_of("scale", scale, GROUP_SCALES)
    if not isinstance(group_size, int) or group_size < 2:
        raise ValueError(
            f"group_size must be an int >= 2 (a group of one has no baseline to compare with), got {group_size!r}"
        )
    if rewards.shape[0] % group_size != 0:
        raise ValueError(
            f"rewards has {rewards.shape[0]} entries, not a multiple of group_size={group_size}; "
            "each group's rewards must be consecutive and complete"
        )
    if eps <= 0:
        raise ValueError(f"eps must be > 0 to keep all-equal groups finite, got {eps!r}")

    grouped = rewards.view(-1, group_size)  # (n_groups, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (n_groups, G)
    if scale == "group":
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        centred = centred / (rewards.std() + eps)
    return centred.reshape(-1)  # (B,)
