"""GRPO on gymnasium tasks: group-relative advantages instead of a critic, Shao et al. 2024
(``notebooks/07_grpo_on_cartpole.ipynb``).

Each update draws ``n_groups`` reset seeds and runs a group of G episodes from each seed. The G episodes of a group
start in the same state (same seed) and differ only by the actions the policy samples, so the group's mean return is
a Monte Carlo estimate of V(s_0) for that start state: the baseline a critic would otherwise have to learn. Each
episode's return, compared with its group, gives one advantage A_i that every step of the episode shares; the
policy then takes ``iterations`` clipped-ratio steps on the batch, as in PPO:

    A_i       = (R_i - mean(R_group)) / (std(R_group) + eps)                 Shao et al. 2024, Sec. 4.1.2
    loss_i,t  = -min(ratio_i,t A_i, clip(ratio_i,t, 1 - clip_low, 1 + clip_high) A_i) + beta * k3_i,t
    loss      = aggregate(loss, mask, loss_agg)              Shao et al. 2024 Eq. 3 with loss_agg="seq-mean-token-mean"

It is the LM trainer's math on a control task: an episode plays the part of a completion, a step that of a token.

Shapes
    G   episodes per group (``group_size``); B = n_groups * G episodes per update, each group's G consecutive
    L   steps of the longest episode in the batch; shorter episodes are padded, ``mask`` (B, L) marks real steps

A batch ends only when every episode has, so an env without a time limit would never end one: each episode is cut
after ``max_episode_steps`` steps (the env's own time limit applies when it is shorter).
    D   observation size; A action size of a continuous action
"""

import copy
import time
import warnings
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from minirl import _validate
from minirl.algos.common import (
    History,
    TrainResult,
    check_gradient,
    check_update,
    progress_bar,
    running_mean,
    seed_everything,
)
from minirl.losses import LOSS_AGGS, aggregate, clip_fraction, kl, ppo_clip_loss
from minirl.policies import Policy, spec_for
from minirl.returns import GROUP_SCALES, group_advantages
from minirl.rollout import check_env_output, make_envs, to_obs_tensor


@dataclass
class GRPOConfig:
    env_id: str = "CartPole-v1"  # any gymnasium task with Discrete or 1-D Box actions
    total_steps: int = 100_000  # environment steps (real ones, padding not counted); the last update may overshoot
    seed: int = 0  # seeds torch, numpy and the stream of reset seeds
    group_size: int = 16  # G episodes from one start state (Shao et al. 2024 used 64 answers per question); >= 2
    n_groups: int = 2  # start states (reset seeds) per update; B = n_groups * G episodes per batch
    clip_low: float = 0.2  # epsilon of the clipped ratio, Schulman et al. 2017 Eq. 7; usually 0.1-0.3
    clip_high: float | None = None  # upper clip 1 + clip_high (DAPO's clip-higher, Yu et al. 2025); None: symmetric
    beta: float = 0.0  # coefficient of the k3 KL to the frozen initial policy, Shao et al. 2024 Eq. 3; 0: no reference
    scale: str = "group"  # advantage denominator: "group" std (GRPO), "batch" std, or "none" (Dr. GRPO)
    loss_agg: str = "seq-mean-token-mean"  # step losses -> one number (losses.aggregate); GRPO: episodes weigh alike
    iterations: int = 4  # mu, gradient steps on each batch (Shao et al. 2024 Alg. 1); 1 makes the ratio always 1
    lr: float = 3e-3  # Adam learning rate; usually 1e-4-3e-3
    max_grad_norm: float = 0.5  # global gradient-norm clip
    same_start: bool = True  # False gives every episode its own reset seed: the ablation of notebook 07
    hidden: tuple[int, ...] = (64, 64)  # hidden sizes of the actor MLP (there is no critic)
    log_std_init: float = 0.0  # initial log std of a Gaussian policy
    max_episode_steps: int = 1000  # cut episodes here (a batch waits for all); the env's own time limit if shorter


@dataclass
class GroupBatch:
    """The episodes of one update, episode-major and padded to the longest (L steps)."""

    obs: torch.Tensor  # (B, L, D)
    act: torch.Tensor  # (B, L) or (B, L, A)
    logp: torch.Tensor  # (B, L) log pi_old(a|s) of the acting policy; 0 on padding
    mask: torch.Tensor  # (B, L) bool, True on real steps
    ret: torch.Tensor  # (B,) undiscounted episode returns (up to the step cap for an episode it cut)
    seeds: list[int]  # (B,) the reset seed of each episode
    capped: int = 0  # episodes cut by the step cap rather than ended by the env

    @property
    def steps(self) -> int:
        return int(self.mask.sum())


def check_config(cfg: GRPOConfig) -> None:
    """Raise a ValueError that names the field and what it allows (numbers from NumPy are fine)."""
    _validate.check_config(
        cfg,
        positive=(
            "total_steps",
            "group_size",
            "n_groups",
            "clip_low",
            "clip_high",
            "iterations",
            "lr",
            "max_grad_norm",
            "max_episode_steps",
        ),
        nonneg=("seed", "beta"),
        unit=("clip_low",),
        choices={"scale": GROUP_SCALES, "loss_agg": LOSS_AGGS},
    )
    if cfg.group_size < 2:
        raise ValueError(
            f"group_size must be an int >= 2, got {cfg.group_size!r}: a group of one episode has no other episode "
            "from its start state to compare with, so its advantage would always be 0"
        )


def reset_seeds(rng: np.random.Generator, n_groups: int, group_size: int, same_start: bool) -> list[int]:
    """B = n_groups * G reset seeds: each group's G episodes share one seed, or (``same_start=False``) none do."""
    if same_start:
        return [int(s) for s in rng.integers(2**31, size=n_groups) for _ in range(group_size)]
    return [int(s) for s in rng.integers(2**31, size=n_groups * group_size)]


def episode_cap(envs: gym.vector.VectorEnv, max_episode_steps: int) -> int:
    """The steps after which ``collect_groups`` cuts an episode: ``max_episode_steps``, or the env's own time limit
    when it is shorter. Warns when the env has no time limit, as the cap is then what ends its long episodes."""
    limit = envs.spec.max_episode_steps if envs.spec is not None else None
    if limit is None:
        warnings.warn(
            f"{envs.spec.id if envs.spec else 'the env'} has no time limit; GRPO waits for every episode of a batch "
            f"to end, so each is cut after max_episode_steps={max_episode_steps} steps (--max-episode-steps)",
            stacklevel=2,
        )
        return max_episode_steps
    return min(limit, max_episode_steps)


def collect_groups(
    envs: gym.vector.VectorEnv, policy: Policy, seeds: list[int], max_steps: int | None = None
) -> GroupBatch:
    """Run one episode in each of the B envs, env i reset with ``seeds[i]``, until every episode has ended or
    ``max_steps`` steps have passed (an episode cut there keeps the return of its steps so far).

    An env whose episode has ended is still stepped (a vector env steps all its envs) but those steps are padding:
    ``mask`` is False there and they count neither in the loss nor in the step budget.
    """
    if envs.num_envs != len(seeds):
        raise ValueError(f"need one env per episode: {envs.num_envs} envs for {len(seeds)} seeds")
    space = envs.single_observation_space
    obs_np, _ = envs.reset(seed=seeds)
    check_env_output(envs, obs_np, None)
    obs = to_obs_tensor(obs_np, space)  # (B, D)
    alive = np.ones(len(seeds), dtype=bool)
    ret = np.zeros(len(seeds))
    obs_b, act_b, logp_b, mask_b = [], [], [], []
    while alive.any() and (max_steps is None or len(obs_b) < max_steps):
        act, logp, _ = policy.act(obs)  # (B,) or (B, A); (B,)
        obs_np, rew, terminated, truncated, _ = envs.step(policy.env_action(act))
        check_env_output(envs, obs_np, rew)
        obs_b.append(obs)
        act_b.append(act)
        logp_b.append(torch.where(torch.tensor(alive), logp, 0.0))
        mask_b.append(torch.tensor(alive))  # a copy: alive changes in place below
        ret += np.where(alive, rew, 0.0)
        alive &= ~(terminated | truncated)
        obs = to_obs_tensor(obs_np, space)  # (B, D); envs that finished have reset, their steps become padding
    return GroupBatch(
        obs=torch.stack(obs_b, 1),  # (B, L, D)
        act=torch.stack(act_b, 1),  # (B, L) or (B, L, A)
        logp=torch.stack(logp_b, 1),  # (B, L)
        mask=torch.stack(mask_b, 1),  # (B, L)
        ret=torch.as_tensor(ret, dtype=torch.float32),  # (B,)
        seeds=list(seeds),
        capped=int(alive.sum()),
    )


def step_logp(policy: Policy, batch: GroupBatch) -> torch.Tensor:
    """log pi(a_t|s_t) of the current policy at the real steps, 0 on padding, (B, L)."""
    mask = batch.mask
    dist = policy.distribution(batch.obs[mask])  # over the real steps only, (n_real, ...)
    logp = torch.zeros(mask.shape)  # (B, L)
    logp[mask] = policy.log_prob(dist, batch.act[mask])
    return logp


def train(cfg: GRPOConfig, progress: bool = False) -> TrainResult:
    """Train GRPO; returns ``.policy``, ``.history`` (one row per update) and ``.config``."""
    check_config(cfg)
    seed_everything(cfg.seed)
    n_episodes = cfg.n_groups * cfg.group_size  # B
    envs = make_envs(cfg.env_id, n_episodes, cfg.seed)
    policy = Policy(spec_for(envs, hidden=tuple(cfg.hidden), critic=False, log_std_init=cfg.log_std_init))
    cap = episode_cap(envs, cfg.max_episode_steps)  # also the constant of "seq-mean-token-sum-norm"
    ref_policy = copy.deepcopy(policy).requires_grad_(False) if cfg.beta > 0 else None  # frozen pi_ref
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    seed_rng = np.random.default_rng(cfg.seed)
    history, returns, steps = History(), [], 0
    bar = progress_bar(cfg.total_steps, progress, f"GRPO {cfg.env_id}")

    while steps < cfg.total_steps:
        # --- rollout: G episodes from each of n_groups start states ---
        t0 = time.perf_counter()
        seeds = reset_seeds(seed_rng, cfg.n_groups, cfg.group_size, cfg.same_start)
        batch = collect_groups(envs, policy, seeds, cap)
        steps += batch.steps
        returns += batch.ret.tolist()

        # --- advantages: one per episode, compared within its group, shared by all its steps ---
        adv = group_advantages(batch.ret, cfg.group_size, cfg.scale)  # (B,)
        step_adv = adv[:, None].expand_as(batch.logp)  # (B, L)
        ref_logp = None
        if ref_policy is not None:
            with torch.no_grad():
                ref_logp = step_logp(ref_policy, batch)  # (B, L)
        t1 = time.perf_counter()

        # --- update: mu clipped-ratio steps on the whole batch ---
        stats = {"pg_loss": [], "kl_ref": [], "approx_kl": [], "clip_frac": [], "grad_norm": []}
        for _ in range(cfg.iterations):
            logp = step_logp(policy, batch)  # (B, L)
            pg = ppo_clip_loss(logp, batch.logp, step_adv, cfg.clip_low, cfg.clip_high)  # (B, L)
            # Dr. GRPO's constant normaliser is the step cap, the same for every batch, not this batch's longest episode
            pg_loss = aggregate(pg, batch.mask, cfg.loss_agg, max_len=cap)
            loss = pg_loss
            if ref_logp is not None:  # GRPO puts the KL in the loss, not in the reward (Shao et al. 2024 Eq. 3)
                kl_ref = aggregate(kl(logp, ref_logp, "k3"), batch.mask, cfg.loss_agg, max_len=cap)
                loss = loss + cfg.beta * kl_ref
                stats["kl_ref"].append(kl_ref.item())
            optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)  # before clipping
            check_gradient(steps, grad_norm)  # stop before a NaN reaches the parameters
            optimizer.step()
            check_update(steps, policy)  # each iteration is a full-batch update: check it before the next
            with torch.no_grad():
                stats["pg_loss"].append(pg_loss.item())
                stats["grad_norm"].append(grad_norm.item())
                # KL(old || new) with k3 on samples from the old policy, as PPO logs it
                stats["approx_kl"].append(aggregate(kl(batch.logp, logp, "k3"), batch.mask, "token-mean").item())
                frac = clip_fraction(logp, batch.logp, cfg.clip_low, cfg.clip_high)
                stats["clip_frac"].append(aggregate(frac, batch.mask, "token-mean").item())
        t2 = time.perf_counter()

        # --- log ---
        with torch.no_grad():
            ent = policy.entropy(policy.distribution(batch.obs[batch.mask]))  # (n_real,)
        grouped = batch.ret.view(-1, cfg.group_size)  # (n_groups, G)
        history.log(
            step=steps,
            return_mean=running_mean(returns),  # of the last 20 episodes, as the other trainers log it
            batch_return=batch.ret.mean().item(),
            episodes=len(returns),
            group_std=grouped.std(dim=1).mean().item(),  # spread of returns within a group
            zero_adv_groups=(grouped.std(dim=1) == 0).float().mean().item(),  # groups with no signal
            capped=batch.capped / n_episodes,  # share of episodes cut by the step cap
            entropy=ent.mean().item(),
            rollout_s=t1 - t0,
            update_s=t2 - t1,
            **{k: float(np.mean(v)) if v else float("nan") for k, v in stats.items()},
        )
        bar.update(batch.steps)
        bar.set_postfix(ret=f"{batch.ret.mean().item():.1f}")
    bar.close()
    envs.close()
    return TrainResult(policy=policy, history=history, config=cfg)
