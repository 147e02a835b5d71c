"""DQN, Mnih et al. 2015: Q-learning with a neural network, a replay buffer and a target network
(``notebooks/01_value_vs_policy.ipynb``).

The course's one value-based algorithm, there as the contrast to policy methods. It learns Q(s, a) by regressing
onto the one-step Bellman optimality target and acts greedily with respect to it:

    y   = r + gamma * (1 - terminated) * max_a' Q_target(s', a')       bootstrap on truncation, not on termination
    loss = Huber(Q(s, a) - y)                                           Mnih et al. 2015, "Methods"
    act  = argmax_a Q(s, a), or a uniformly random action with probability epsilon

The max and the argmax over actions are what tie it to small discrete action spaces; notebook 01 explains why that
motivates learning the policy directly. The trained Q-network is returned as a ``minirl.policies.Policy`` whose
actor outputs Q(s, .) as its logits: the deterministic action of ``Policy.act`` (the argmax of the softmax) is then
argmax_a Q(s, a), so ``minirl.evaluate``, ``save`` and ``load`` work unchanged. (``Policy.act`` without
``deterministic`` samples from softmax(Q), a Boltzmann policy, not the epsilon-greedy one used in training.)

Shapes: B transitions in a minibatch, C the buffer capacity, D observation size, A number of actions.
"""

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch

from minirl import _validate
from minirl.algos.common import (
    History,
    TrainResult,
    check_gradient,
    check_update,
    clip_grad_norm,
    progress_bar,
    running_mean,
    seed_everything,
)
from minirl.policies import Policy, spec_for
from minirl.rollout import check_env_output, make_envs, to_obs_tensor


@dataclass
class DQNConfig:
    """The defaults are the rl-baselines3-zoo CartPole-v1 settings (hyperparams/dqn.yml): bursts of 128 gradient
    steps every 256 env steps, a target network refreshed before every burst, a 256-256 network."""

    env_id: str = "CartPole-v1"  # a gymnasium task with a Discrete action space (DQN takes a max over actions)
    total_steps: int = 50_000  # environment steps
    seed: int = 0  # seeds torch, numpy (exploration, replay sampling) and the env
    buffer_size: int = 100_000  # replay capacity C in transitions; Mnih et al. 2015 used 1M
    learning_starts: int = 1_000  # steps of pure exploration that fill the buffer before the first update
    batch_size: int = 64  # B transitions per gradient step; usually 32-256
    gamma: float = 0.99  # discount gamma
    lr: float = 2.3e-3  # Adam learning rate; usually 1e-4-3e-3
    train_freq: int = 256  # environment steps between bursts of gradient steps (Mnih et al. 2015: 4)
    gradient_steps: int = 128  # gradient steps in each burst (Mnih et al. 2015: 1)
    target_update: int = 10  # environment steps between copies of the online network into the target network
    eps_start: float = 1.0  # epsilon of epsilon-greedy at the start
    eps_end: float = 0.04  # epsilon after the decay; usually 0.01-0.1
    exploration_fraction: float = 0.16  # fraction of total_steps over which epsilon decays linearly
    max_grad_norm: float = 10.0  # global gradient-norm clip
    hidden: tuple[int, ...] = (256, 256)  # hidden sizes of the Q-network MLP
    log_every: int = 1_000  # environment steps between rows of the history


class ReplayBuffer:
    """A ring buffer of transitions (s, a, r, s', terminated); the oldest are overwritten when it is full.

    Sampling uniformly from it breaks the correlation between consecutive steps, and reuses each transition in
    many updates (Mnih et al. 2015).
    """

    def __init__(self, capacity: int, obs_dim: int):
        if capacity < 1:
            raise ValueError(f"buffer_size must be >= 1, got {capacity}")
        self.obs = torch.zeros(capacity, obs_dim)  # (C, D)
        self.next_obs = torch.zeros(capacity, obs_dim)  # (C, D), the true next observation (final_obs at an end)
        self.act = torch.zeros(capacity, dtype=torch.long)  # (C,)
        self.rew = torch.zeros(capacity)  # (C,)
        self.terminated = torch.zeros(capacity, dtype=torch.bool)  # (C,)
        self.capacity, self.size, self.pos = capacity, 0, 0

    def add(self, obs: torch.Tensor, act: int, rew: float, next_obs: torch.Tensor, terminated: bool) -> None:
        i = self.pos
        self.obs[i], self.act[i], self.rew[i], self.next_obs[i], self.terminated[i] = (
            obs,
            act,
            rew,
            next_obs,
            terminated,
        )
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> tuple[torch.Tensor, ...]:
        """B transitions drawn uniformly with replacement: obs, act, rew, next_obs, terminated ((B, D) or (B,))."""
        idx = torch.as_tensor(rng.integers(self.size, size=batch_size))
        return self.obs[idx], self.act[idx], self.rew[idx], self.next_obs[idx], self.terminated[idx]


def q_values(net: Policy, obs: torch.Tensor) -> torch.Tensor:
    """Q(s, .) for a batch of observations, (B, D) -> (B, A): the actor's output read as action values."""
    return net.actor(net.normalize(obs))


def td_target(rew: torch.Tensor, next_q: torch.Tensor, terminated: torch.Tensor, gamma: float) -> torch.Tensor:
    """y = r + gamma * (1 - terminated) * max_a' Q(s', a'), (B,): the Bellman optimality backup on samples.

    ``next_q`` (B, A) comes from the target network. A terminated episode has no future (y = r); a truncated one
    (a time limit) does, so it bootstraps from its true final observation like any other step.
    """
    return rew + gamma * (~terminated).to(rew.dtype) * next_q.max(dim=-1).values


def epsilon(cfg: DQNConfig, step: int) -> float:
    """Linear decay from eps_start to eps_end over the first exploration_fraction * total_steps steps."""
    decay_steps = max(1, int(cfg.exploration_fraction * cfg.total_steps))
    frac = min(1.0, step / decay_steps)
    return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)


def gradient_step(q_net: Policy, target_net: Policy, optimizer, batch: tuple, cfg: DQNConfig, step: int):
    """One Adam step on the Huber loss of Q(s, a) against the TD target of a replayed minibatch; returns the loss and
    the mean Q(s, a) as 0-d tensors (for the log)."""
    b_obs, b_act, b_rew, b_next, b_term = batch
    with torch.no_grad():
        y = td_target(b_rew, q_values(target_net, b_next), b_term, cfg.gamma)  # (B,)
    q = q_values(q_net, b_obs).gather(1, b_act[:, None]).squeeze(1)  # (B,) Q(s, a) of the taken actions
    loss = torch.nn.functional.huber_loss(q, y, delta=1.0)  # quadratic near 0, linear beyond: bounded grads
    optimizer.zero_grad()
    loss.backward()
    grad_norm = clip_grad_norm(optimizer.param_groups[0]["params"], cfg.max_grad_norm)  # the norm before clipping
    check_gradient(step, grad_norm)  # stop before a NaN reaches the parameters (and the target network)
    optimizer.step()
    return loss.detach(), q.detach().mean()


def check_config(cfg: DQNConfig) -> None:
    """Raise on a setting DQN cannot run with, naming the field and what it allows (numbers from NumPy are fine)."""
    _validate.check_config(
        cfg,
        positive=(
            "total_steps",
            "buffer_size",
            "batch_size",
            "lr",
            "train_freq",
            "gradient_steps",
            "target_update",
            "max_grad_norm",
            "log_every",
        ),
        nonneg=("seed", "learning_starts"),
        unit=("gamma", "eps_start", "eps_end", "exploration_fraction"),
    )


def train(cfg: DQNConfig, progress: bool = False) -> TrainResult:
    """Train a DQN agent; returns ``.policy`` (the Q-network as a Policy), ``.history`` and ``.config``."""
    check_config(cfg)
    seed_everything(cfg.seed)
    envs = make_envs(cfg.env_id, 1, cfg.seed)
    spec = spec_for(envs, hidden=tuple(cfg.hidden), critic=False, activation="relu")
    if not spec.discrete:
        envs.close()
        raise TypeError(
            f"DQN needs a Discrete action space, {cfg.env_id} has {envs.single_action_space}: the target and the "
            "greedy action take a max over actions, which a continuous space does not allow; use ppo or grpo"
        )
    q_net = Policy(spec)  # the actor's outputs are Q(s, .)
    target_net = copy.deepcopy(q_net).requires_grad_(False)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=cfg.lr, fused=True)  # one kernel for all parameters
    buffer = ReplayBuffer(cfg.buffer_size, spec.obs_dim)
    rng = np.random.default_rng(cfg.seed)
    space = envs.single_observation_space

    obs_np, _ = envs.reset(seed=cfg.seed)
    check_env_output(envs, obs_np, None)
    obs = to_obs_tensor(obs_np, space)  # (1, D)
    history, returns, ep_return = History(), [], 0.0
    losses, q_means, n_updates, t_act, t_learn = [], [], 0, 0.0, 0.0
    bar = progress_bar(cfg.total_steps, progress, f"DQN {cfg.env_id}")

    for step in range(1, cfg.total_steps + 1):
        # --- act: epsilon-greedy on Q ---
        t0 = time.perf_counter()
        eps = epsilon(cfg, step - 1)
        if step <= cfg.learning_starts or rng.random() < eps:
            act = int(rng.integers(spec.act_dim))
        else:
            with torch.no_grad():
                act = int(q_values(q_net, obs).argmax(-1))
        obs_np, rew, terminated, truncated, info = envs.step(np.array([act]))
        check_env_output(envs, obs_np, rew)  # before it enters the buffer, where it would poison many updates
        next_obs = to_obs_tensor(obs_np, space)  # (1, D), the reset observation if the episode ended
        if terminated[0] or truncated[0]:  # SAME_STEP autoreset: the true last observation is in final_obs
            check_env_output(envs, np.stack(info["final_obs"]), None)
            final = to_obs_tensor(np.stack(info["final_obs"]), space)
            buffer.add(obs[0], act, float(rew[0]), final[0], bool(terminated[0]))
            returns.append(ep_return + float(rew[0]))
            ep_return = 0.0
        else:
            buffer.add(obs[0], act, float(rew[0]), next_obs[0], False)
            ep_return += float(rew[0])
        obs = next_obs
        t1 = time.perf_counter()

        # --- learn: a burst of gradient steps on replayed minibatches ---
        if step % cfg.target_update == 0:  # hard update of the target network: copy every weight
            with torch.no_grad():
                for target, online in zip(target_net.parameters(), q_net.parameters()):
                    target.copy_(online)
        if step > cfg.learning_starts and step % cfg.train_freq == 0:
            for _ in range(cfg.gradient_steps):
                loss, q = gradient_step(q_net, target_net, optimizer, buffer.sample(cfg.batch_size, rng), cfg, step)
                losses.append(loss)
                q_means.append(q)
            n_updates += cfg.gradient_steps
        t_learn += time.perf_counter() - t1
        t_act += t1 - t0

        # --- log ---
        if step % cfg.log_every == 0 or step == cfg.total_steps:
            check_update(step, q_net)  # the parameters, once per row of the history
            history.log(
                step=step,
                return_mean=running_mean(returns),
                episodes=len(returns),
                epsilon=eps,
                td_loss=torch.stack(losses).mean().item() if losses else float("nan"),
                q_mean=torch.stack(q_means).mean().item() if q_means else float("nan"),
                updates=n_updates,
                rollout_s=t_act,
                update_s=t_learn,
            )
            losses, q_means, t_act, t_learn = [], [], 0.0, 0.0
            bar.update(step - bar.n)
            bar.set_postfix(ret=f"{running_mean(returns):.1f}", eps=f"{eps:.2f}")
    bar.close()
    envs.close()
    return TrainResult(policy=q_net, history=history, config=cfg)
