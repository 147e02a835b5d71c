"""REINFORCE (Williams 1992) with reward-to-go and baselines, and its actor-critic form
(``notebooks/03_reinforce_and_baselines.ipynb``).

    grad J ~ 1/|batch| sum_t grad log pi(a_t|s_t) (G_t - b(s_t))

Shapes: T steps per env, N envs, D observation size. Each batch starts fresh episodes in every env and keeps only
the episodes that finished inside it, so every return is a true Monte Carlo return.
"""

import time
from dataclasses import dataclass

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
from minirl.losses import policy_gradient_loss, value_loss
from minirl.policies import Policy, spec_for
from minirl.returns import discounted_returns
from minirl.rollout import Collector, make_envs

RETURNS = ("reward_to_go", "total")
BASELINES = ("none", "mean", "value")


@dataclass
class REINFORCEConfig:
    env_id: str = "CartPole-v1"  # any gymnasium task with Discrete or 1-D Box actions
    total_steps: int = 100_000  # environment steps, summed over all envs (discarded unfinished episodes count too)
    seed: int = 0  # seeds torch, numpy and the envs (env i gets seed + i)
    num_envs: int = 2  # N parallel envs
    n_steps: int = 500  # T steps per env per batch; must exceed the longest episode (CartPole-v1: 500)
    gamma: float = 0.99  # discount gamma
    returns: str = "reward_to_go"  # "reward_to_go": G_t from step t on; "total": G_0 at every step (Williams 1992)
    baseline: str = "value"  # "none", "mean" (batch mean of the returns) or "value" (a learned V(s): actor-critic)
    scale_adv: bool = True  # divide advantages by their batch std (a step-size choice; it does not centre them)
    lr: float = 3e-3  # Adam learning rate of the actor
    value_lr: float = 3e-3  # Adam learning rate of the critic (baseline "value")
    value_epochs: int = 10  # critic gradient steps per batch (full batch)
    hidden: tuple[int, ...] = (64, 64)  # hidden sizes of the actor and critic MLPs
    async_envs: bool = False  # step the envs in subprocesses (AsyncVectorEnv) instead of in turn


def advantages(cfg: REINFORCEConfig, ret: torch.Tensor, val: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The weight of grad log pi at each step, (T, N): the return minus the chosen baseline, optionally scaled."""
    if cfg.baseline == "none":
        adv = ret
    elif cfg.baseline == "mean":
        adv = ret - ret[valid].mean()
    else:
        adv = ret - val
    if cfg.scale_adv and valid.sum() > 1:
        adv = adv / (adv[valid].std() + 1e-8)
    return adv


def check_config(cfg: REINFORCEConfig) -> None:
    """Raise on a setting REINFORCE cannot run with, naming the field and what it allows."""
    _validate.check_config(
        cfg,
        positive=("total_steps", "num_envs", "n_steps", "lr", "value_lr", "value_epochs"),
        nonneg=("seed",),
        unit=("gamma",),
        choices={"returns": RETURNS, "baseline": BASELINES},
    )


def train(cfg: REINFORCEConfig, progress: bool = False) -> TrainResult:
    """Train REINFORCE; returns ``.policy``, ``.history`` (one row per batch) and ``.config``."""
    check_config(cfg)
    seed_everything(cfg.seed)
    envs = make_envs(cfg.env_id, cfg.num_envs, cfg.seed, asynchronous=cfg.async_envs)
    policy = Policy(spec_for(envs, hidden=tuple(cfg.hidden), critic=cfg.baseline == "value"))
    actor_params = [p for name, p in policy.named_parameters() if not name.startswith("critic.")]  # incl. log_std
    actor_opt = torch.optim.Adam(actor_params, lr=cfg.lr)
    critic_opt = torch.optim.Adam(policy.critic.parameters(), lr=cfg.value_lr) if policy.critic else None
    collector = Collector(envs, cfg.seed)
    batch_size = cfg.num_envs * cfg.n_steps
    n_updates = max(1, cfg.total_steps // batch_size)
    history, returns = History(), []
    bar = progress_bar(n_updates * batch_size, progress, f"REINFORCE {cfg.env_id}")

    for update in range(n_updates):
        # --- rollout: fresh episodes, keep those that finished ---
        t0 = time.perf_counter()
        step = (update + 1) * batch_size  # env steps so far, for the history and for errors
        if update > 0:
            collector.reset()
        batch = collector.collect(policy, cfg.n_steps)
        done = batch.done  # (T, N)
        if not done.any():
            raise RuntimeError(
                f"no episode of {cfg.env_id} finished within n_steps={cfg.n_steps}; "
                "raise n_steps above the longest episode"
            )
        steps = torch.arange(cfg.n_steps)[:, None]  # (T, 1)
        last_end = torch.where(done, steps, -1).max(dim=0).values  # (N,) index of each env's last episode end
        valid = steps <= last_end[None, :]  # (T, N): steps of finished episodes
        returns += batch.episode_returns

        # --- advantages ---
        ret = discounted_returns(batch.rew, done, cfg.gamma, reward_to_go=cfg.returns == "reward_to_go")  # (T, N)
        adv = advantages(cfg, ret, batch.val, valid)  # (T, N)
        t1 = time.perf_counter()

        # --- update ---
        obs, act = batch.obs[valid], batch.act[valid]  # (B, D), (B,) or (B, A) with B valid steps
        dist = policy.distribution(obs)
        pg_loss = policy_gradient_loss(policy.log_prob(dist, act), adv[valid]).mean()
        actor_opt.zero_grad()
        pg_loss.backward()
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in actor_params])  # no clip: logged and checked
        check_gradient(step, grad_norm)  # stop before a NaN reaches the parameters
        actor_opt.step()
        v_loss = torch.tensor(float("nan"))
        if critic_opt is not None:
            for _ in range(cfg.value_epochs):  # fit V(s) to the Monte Carlo returns
                v_loss = value_loss(policy.value(obs), ret[valid]).mean()
                critic_opt.zero_grad()
                v_loss.backward()
                check_gradient(step, torch.nn.utils.get_total_norm([p.grad for p in policy.critic.parameters()]))
                critic_opt.step()
        t2 = time.perf_counter()
        check_update(step, policy)

        # --- log ---
        history.log(
            step=step,
            return_mean=running_mean(returns),
            episodes=len(returns),
            used_steps=int(valid.sum()),
            pg_loss=pg_loss.item(),
            v_loss=v_loss.item(),
            grad_norm=grad_norm.item(),
            entropy=policy.entropy(dist).mean().item(),  # of pi before this update, summed over action dimensions
            rollout_s=t1 - t0,
            update_s=t2 - t1,
        )
        bar.update(batch_size)
        bar.set_postfix(ret=f"{running_mean(returns):.1f}")
    bar.close()
    envs.close()
    return TrainResult(policy=policy, history=history, config=cfg)
