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
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from minirl._io import recover_folder, write_folder


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
    activation: str = "tanh"  # between hidden layers: "tanh" (the policy-gradient default) or "relu" (DQN's)


ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


class SoftmaxCategorical(torch.distributions.Categorical):
    """``Categorical(logits=z)``, normalised by one ``log_softmax``.

    Torch's constructor normalises with ``z - z.logsumexp(-1)``: half a dozen operations, each recorded for backward.
    One ``log_softmax`` gives the same log-probabilities in one, about 3% of a PPO minibatch update on 64-64 MLPs.
    Everything else (sampling, entropy, KL) is Categorical's own; ``tests/test_rollout.py`` checks them equal.
    """

    def __init__(self, logits: torch.Tensor):
        self.logits = torch.log_softmax(logits, dim=-1)  # (B, A) log pi(a|s)
        self._param = self.logits  # what Categorical's methods read
        self._num_events = logits.shape[-1]
        torch.distributions.Distribution.__init__(self, logits.shape[:-1], validate_args=False)


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


def describe(spec: PolicySpec) -> str:
    """The spaces a spec fits, in words: ``observations of size 4 and 2 discrete actions``."""
    kind = f"{spec.act_dim} discrete actions" if spec.discrete else f"continuous actions of size {spec.act_dim}"
    return f"observations of size {spec.obs_dim} and {kind}"


def obs_size(space: gym.Space) -> int:
    """Size D of a flattened observation: Box (any shape) or Discrete (one-hot); other spaces raise."""
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    raise TypeError(f"observation space {space} is not supported: use a Box or Discrete observation space")


def mlp(sizes: list[int], out_gain: float, activation: str = "tanh") -> nn.Sequential:
    """MLP (tanh or ReLU between layers) with orthogonal init: gain sqrt(2) inside, ``out_gain`` on the last layer,
    zero biases (detail 2 of "The 37 Implementation Details of PPO", Huang et al. 2022)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layer = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(layer.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(layer.bias)
        layers += [layer] if last else [layer, ACTIVATIONS[activation]()]
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
        self.actor = mlp([*sizes, spec.act_dim], out_gain=0.01, activation=spec.activation)
        self.critic = mlp([*sizes, 1], out_gain=1.0, activation=spec.activation) if spec.critic else None
        if not spec.discrete:
            # a diagonal Gaussian with a state-independent log std (continuous-action details 1-3)
            self.log_std = nn.Parameter(torch.full((spec.act_dim,), spec.log_std_init))
        # running statistics of observations (continuous-action details 6-7); saved with the weights
        self.register_buffer("obs_mean", torch.zeros(spec.obs_dim))
        self.register_buffer("obs_var", torch.ones(spec.obs_dim))
        self.register_buffer("obs_count", torch.tensor(1e-4))

    # --- observations ---
    def check_env(self, env: gym.Env | gym.vector.VectorEnv, env_id: str = "the env") -> None:
        """Raise unless ``env``'s spaces are the ones this policy was built for, naming both."""
        theirs, ours = spec_for(env), self.spec
        if (theirs.obs_dim, theirs.act_dim, theirs.discrete) != (ours.obs_dim, ours.act_dim, ours.discrete):
            raise ValueError(
                f"this policy was built for {describe(self.spec)}, but {env_id} has {describe(theirs)}; "
                "evaluate it on the env it was trained on (its config.json records env_id) or train one for this env"
            )

    def check_obs(self, obs: torch.Tensor) -> None:
        """Raise unless ``obs`` is a batch (B, D) of this policy's observation size D."""
        if obs.dim() != 2 or obs.shape[1] != self.spec.obs_dim:
            raise ValueError(
                f"this policy takes a batch of observations of shape (B, {self.spec.obs_dim}), got "
                f"{tuple(obs.shape)}: is the env the one it was trained on? (minirl.rollout.to_obs_tensor batches "
                "and flattens an env's observations)"
            )

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
    # ``normalized=True`` takes observations already passed through ``normalize``: a rollout stores them so, with the
    # statistics of the step they were seen at, and the update then evaluates exactly the policy that acted.
    def distribution(self, obs: torch.Tensor, normalized: bool = False) -> torch.distributions.Distribution:
        """pi(.|s) for a batch of observations (B, D), raw unless ``normalized``."""
        out = self.actor(obs if normalized else self.normalize(obs))  # (B, A)
        if self.spec.discrete:
            return SoftmaxCategorical(out)
        return torch.distributions.Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    def log_prob(self, dist: torch.distributions.Distribution, act: torch.Tensor) -> torch.Tensor:
        """log pi(a|s), (B,): a Gaussian's log-density sums over action dimensions."""
        if self.spec.discrete:
            # Categorical stores its logits normalised (log-probabilities): the action's entry is its log_prob.
            # Gathering it directly skips Categorical.log_prob's broadcasting, a few percent of a PPO minibatch update
            # on 64-64 MLPs (tests/test_rollout.py checks the two equal, values and gradients)
            return dist.logits.gather(-1, act.long().unsqueeze(-1)).squeeze(-1)
        return dist.log_prob(act).sum(-1)

    def entropy(self, dist: torch.distributions.Distribution) -> torch.Tensor:
        """H(pi(.|s)), (B,): a diagonal Gaussian's entropy sums over action dimensions, like its log-density."""
        ent = dist.entropy()
        return ent if self.spec.discrete else ent.sum(-1)

    def value(self, obs: torch.Tensor, normalized: bool = False) -> torch.Tensor:
        """V(s), (B,), for observations (B, D), raw unless ``normalized``; zeros when the policy has no critic."""
        if self.critic is None:
            return torch.zeros(obs.shape[0], dtype=obs.dtype)
        return self.critic(obs if normalized else self.normalize(obs)).squeeze(-1)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False, normalized: bool = False):
        """Sample (or take the mode of) pi(.|s) for observations (B, D): returns act (B,) or (B, A), logp (B,),
        val (B,)."""
        self.check_obs(obs)
        dist = self.distribution(obs, normalized)
        if deterministic:
            act = dist.probs.argmax(-1) if self.spec.discrete else dist.mean
        else:
            act = dist.sample()
        return act, self.log_prob(dist, act), self.value(obs, normalized)

    def env_action(self, act: torch.Tensor) -> np.ndarray:
        """The action to send to the env: integers, or the Gaussian sample clipped to the Box bounds
        (the unclipped sample is what log pi refers to: continuous-action detail 5)."""
        if self.spec.discrete:
            return act.numpy()
        return np.clip(act.numpy(), self.spec.act_low, self.spec.act_high)

    # --- checkpoints ---
    def save(self, path: str | Path, extra: dict | None = None) -> Path:
        """Write ``path/model.safetensors`` and ``path/config.json`` whole (``minirl._io.write_folder``): a crash
        mid-save keeps the previous folder. Refuses non-finite weights, and a non-empty folder that is not a
        minirl policy (nothing of the user's is replaced)."""
        path = recover_folder(path)
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        bad = [k for k, v in state.items() if not torch.isfinite(v).all()]
        if bad:
            raise FloatingPointError(
                f"not saving a policy with NaN or inf in {', '.join(bad)}: it would act at random or crash. "
                "Training diverged; lower the learning rate, scale the rewards, or check the env's observations"
            )
        if path.is_dir() and any(path.iterdir()) and not _is_policy_folder(path):
            raise FileExistsError(
                f"{path} is not empty and is not a minirl policy (no config.json with a policy in it), so minirl "
                "will not replace it: nothing of yours is deleted. Choose a new or empty folder"
            )

        def fill(tmp: Path) -> None:
            save_file(state, tmp / "model.safetensors")
            config = {"policy": asdict(self.spec), **(extra or {})}
            (tmp / "config.json").write_text(json.dumps(config, indent=2))

        return write_folder(path, fill, marker="config.json")

    @classmethod
    def load(cls, path: str | Path) -> "Policy":
        """Rebuild a policy saved by ``save``: whole or not at all (a missing or unexpected tensor raises)."""
        path = recover_folder(path)  # finish a save that a crash interrupted
        if not (path / "model.safetensors").exists() or not _is_policy_folder(path):
            raise FileNotFoundError(
                f"{path} is not a minirl policy checkpoint (expected model.safetensors and a config.json with a "
                "policy in it, as Policy.save and `minirl train` write them)"
            )
        raw = json.loads((path / "config.json").read_text())["policy"]
        for key in ("hidden", "act_low", "act_high"):
            raw[key] = tuple(raw[key]) if raw[key] is not None else None
        policy = cls(PolicySpec(**raw))
        state = load_file(path / "model.safetensors")
        expected = policy.state_dict()
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        wrong = sorted(k for k in set(state) & set(expected) if state[k].shape != expected[k].shape)
        if missing or unexpected or wrong:
            raise ValueError(
                f"{path / 'model.safetensors'} does not match its config.json: missing {missing}, unexpected "
                f"{unexpected}, wrong shape {wrong}. The checkpoint was changed or mixed with another; save it again "
                "from the trained policy"
            )
        policy.load_state_dict(state)
        return policy


def _is_policy_folder(path: Path) -> bool:
    """True when ``path/config.json`` is a JSON object with a ``policy`` entry: a folder ``Policy.save`` wrote."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "policy" in config
