"""MLP policies for gymnasium tasks: a categorical or diagonal-Gaussian actor, an optional critic, and the
observation-normalisation statistics that travel with them (``notebooks/03_reinforce_and_baselines.ipynb``).

Shapes
    B   observations in a batch (B = N environments while acting, a minibatch while learning)
    D   flattened observation size, A number of discrete actions or size of a continuous action

A checkpoint is a folder with ``model.safetensors`` (the weights and normalisation statistics) and ``config.json``
(what is needed to rebuild the network, plus whatever the trainer adds, e.g. its config).
"""

import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn


@dataclass(frozen=True)
class PolicySpec:
    """What a policy network needs to be rebuilt: sizes, action kind, options."""

    obs_dim: int  # D
    act_dim: int  # A: number of actions (discrete) or action size (continuous)
    discrete: bool
    hidden: tuple[int, ...] = (64, 64)
    critic: bool = True
    obs_norm: bool = False
    act_low: tuple[float, ...] | None = None  # Box bounds, used to clip actions sent to the env
    act_high: tuple[float, ...] | None = None
    log_std_init: float = 0.0


def spec_for(env: gym.Env | gym.vector.VectorEnv, **options) -> PolicySpec:
    """A PolicySpec that fits ``env``'s observation and action spaces; any space other than Discrete/Box raises."""
    obs_space = getattr(env, "single_observation_space", env.observation_space)
    act_space = getattr(env, "single_action_space", env.action_space)
    obs_dim = obs_size(obs_space)
    if isinstance(act_space, gym.spaces.Discrete):
        return PolicySpec(obs_dim, int(act_space.n), True, **options)
    if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        low, high = act_space.low.astype(float).tolist(), act_space.high.astype(float).tolist()
        return PolicySpec(obs_dim, act_space.shape[0], False, act_low=tuple(low), act_high=tuple(high), **options)
    raise TypeError(
        f"action space {act_space} is not supported: minirl policies act in Discrete(n) or a 1-D Box; "
        "wrap the env (e.g. gymnasium.wrappers.FlattenObservation does this for observations) or pick another task"
    )


def obs_size(space: gym.Space) -> int:
    """Size D of a flattened observation: Box (any shape) or Discrete (one-hot); other spaces raise."""
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    raise TypeError(f"observation space {space} is not supported: use a Box or Discrete observation space")


def mlp(sizes: list[int], out_gain: float) -> nn.Sequential:
    """tanh MLP with orthogonal init: gain sqrt(2) inside, ``out_gain`` on the last layer, zero biases
    (detail 2 of "The 37 Implementation Details of PPO", Huang et al. 2022)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layer = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(layer.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(layer.bias)
        layers += [layer] if last else [layer, nn.Tanh()]
    return nn.Sequential(*layers)


class Policy(nn.Module):
    """Actor pi(a|s) (and critic V(s) when ``spec.critic``) on normalised observations.

    The actor's last layer starts with gain 0.01 so that the first policy is close to uniform (or to a zero-mean
    Gaussian); the critic's with gain 1.
    """

    def __init__(self, spec: PolicySpec):
        super().__init__()
        self.spec = spec
        sizes = [spec.obs_dim, *spec.hidden]
        self.actor = mlp([*sizes, spec.act_dim], out_gain=0.01)
        self.critic = mlp([*sizes, 1], out_gain=1.0) if spec.critic else None
        if not spec.discrete:
            # a diagonal Gaussian with a state-independent log std (continuous-action details 1-3)
            self.log_std = nn.Parameter(torch.full((spec.act_dim,), spec.log_std_init))
        # running statistics of observations (continuous-action details 6-7); saved with the weights
        self.register_buffer("obs_mean", torch.zeros(spec.obs_dim))
        self.register_buffer("obs_var", torch.ones(spec.obs_dim))
        self.register_buffer("obs_count", torch.tensor(1e-4))

    # --- observations ---
    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, D) -> (B, D): standardised by the running statistics and clipped to [-10, 10] when obs_norm is on."""
        if not self.spec.obs_norm:
            return obs
        return torch.clamp((obs - self.obs_mean) / torch.sqrt(self.obs_var + 1e-8), -10.0, 10.0)

    @torch.no_grad()
    def update_obs_stats(self, obs: torch.Tensor) -> None:
        """Fold a batch (B, D) of raw observations into the running mean and variance (parallel Welford update)."""
        if not self.spec.obs_norm:
            return
        b_mean, b_var, b_count = obs.mean(0), obs.var(0, unbiased=False), obs.shape[0]
        total = self.obs_count + b_count
        delta = b_mean - self.obs_mean
        m2 = self.obs_var * self.obs_count + b_var * b_count + delta**2 * self.obs_count * b_count / total
        self.obs_mean += delta * b_count / total
        self.obs_var.copy_(m2 / total)
        self.obs_count.fill_(total)

    # --- acting and evaluating ---
    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        """pi(.|s) for a batch of raw observations (B, D)."""
        out = self.actor(self.normalize(obs))  # (B, A)
        if self.spec.discrete:
            return torch.distributions.Categorical(logits=out, validate_args=False)
        return torch.distributions.Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    def log_prob(self, dist: torch.distributions.Distribution, act: torch.Tensor) -> torch.Tensor:
        """log pi(a|s), (B,): a Gaussian's log-density sums over action dimensions."""
        logp = dist.log_prob(act)
        return logp if self.spec.discrete else logp.sum(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(s), (B,); zeros when the policy has no critic."""
        if self.critic is None:
            return torch.zeros(obs.shape[0], dtype=obs.dtype)
        return self.critic(self.normalize(obs)).squeeze(-1)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False):
        """Sample (or take the mode of) pi(.|s): returns act (B,) or (B, A), logp (B,), val (B,)."""
        dist = self.distribution(obs)
        if deterministic:
            act = dist.probs.argmax(-1) if self.spec.discrete else dist.mean
        else:
            act = dist.sample()
        return act, self.log_prob(dist, act), self.value(obs)

    def env_action(self, act: torch.Tensor) -> np.ndarray:
        """The action to send to the env: integers, or the Gaussian sample clipped to the Box bounds
        (the unclipped sample is what log pi refers to: continuous-action detail 5)."""
        if self.spec.discrete:
            return act.numpy()
        return np.clip(act.numpy(), self.spec.act_low, self.spec.act_high)

    # --- checkpoints ---
    def save(self, path: str | Path, extra: dict | None = None) -> Path:
        """Write ``path/model.safetensors`` and ``path/config.json``; a crash mid-save keeps the previous folder."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
        try:
            save_file({k: v.contiguous() for k, v in self.state_dict().items()}, tmp / "model.safetensors")
            config = {"policy": asdict(self.spec), **(extra or {})}
            (tmp / "config.json").write_text(json.dumps(config, indent=2))
            _swap_in(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Policy":
        """Rebuild a policy saved by ``save``."""
        path = Path(path)
        if not (path / "model.safetensors").exists() or not (path / "config.json").exists():
            raise FileNotFoundError(
                f"{path} is not a minirl policy checkpoint (expected model.safetensors and config.json in it)"
            )
        raw = json.loads((path / "config.json").read_text())["policy"]
        for key in ("hidden", "act_low", "act_high"):
            raw[key] = tuple(raw[key]) if raw[key] is not None else None
        policy = cls(PolicySpec(**raw))
        policy.load_state_dict(load_file(path / "model.safetensors"))
        return policy


def _swap_in(tmp: Path, path: Path) -> None:
    """Replace folder ``path`` by the finished folder ``tmp``: the old one is moved aside first, removed last."""
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}-old-{os.getpid()}")
        os.replace(path, old)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
