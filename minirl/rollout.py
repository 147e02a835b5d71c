"""Collecting experience from gymnasium vector envs, and evaluating a policy
(``notebooks/03_reinforce_and_baselines.ipynb``).

Shapes
    T   steps per env in one rollout, N parallel envs, D observation size, A action size (continuous)

Autoreset: the envs run in gymnasium's SAME_STEP mode. The step that ends an episode returns the first observation
of the next episode, and the final observation of the old one arrives in ``info["final_obs"]``. Every row of a
batch is therefore a real transition; no row spans two episodes. (In the default NEXT_STEP mode the step after an
episode end is a no-op reset whose action is ignored; it would have to be masked out of every loss.)
"""

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from minirl.policies import Policy


def make_envs(env_id: str, num_envs: int, seed: int, asynchronous: bool = False) -> gym.vector.VectorEnv:
    """N copies of ``env_id`` in SAME_STEP autoreset mode, seeded ``seed, seed + 1, ...`` on the first reset."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    mode = "async" if asynchronous else "sync"
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode=mode,
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )


def env_name(env: gym.Env | gym.vector.VectorEnv) -> str:
    """The id ``env`` was made from, for error messages."""
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(env).__name__


def check_env_output(env: gym.Env | gym.vector.VectorEnv, obs: np.ndarray, rew: np.ndarray | float | None) -> None:
    """Raise if the env returned a NaN or inf observation or reward, naming the env.

    Caught here, a bad number names its source; caught later, it surfaces as a NaN loss or as torch's
    "probability tensor contains inf, nan" from sampling, far from its cause.
    """
    for what, value in (("observation", obs), ("reward", rew)):
        if value is not None and not np.isfinite(np.asarray(value, dtype=np.float64)).all():
            raise ValueError(
                f"{env_name(env)} returned a non-finite {what} ({value!r}); minirl cannot learn from NaN or inf. "
                f"Fix the env, or wrap it to replace or clip such values (gymnasium.wrappers.TransformReward, "
                f"TransformObservation)"
            )


def to_obs_tensor(obs: np.ndarray, space: gym.Space) -> torch.Tensor:
    """A batch of observations (N, ...) as a float tensor (N, D): Box flattened, Discrete one-hot."""
    if isinstance(space, gym.spaces.Discrete):
        return torch.nn.functional.one_hot(torch.as_tensor(obs, dtype=torch.long) - space.start, int(space.n)).float()
    return torch.as_tensor(obs, dtype=torch.float32).reshape(obs.shape[0], -1)


@dataclass
class Batch:
    """One rollout, time-major. ``next_val[t]`` is V of the observation that followed step t (the true final
    observation where an episode was truncated), ready for ``returns.gae``.

    ``obs`` holds the observations as the policy saw them: normalised with the statistics of the step they were
    seen at when the policy normalises (``obs_norm``), so an update passes them with ``normalized=True`` and its
    ratio is exactly 1 before the first gradient step (as SB3's VecNormalize and CleanRL store them).
    """

    obs: torch.Tensor  # (T, N, D), normalised when the policy normalises
    act: torch.Tensor  # (T, N) or (T, N, A)
    rew: torch.Tensor  # (T, N)
    terminated: torch.Tensor  # (T, N) bool
    truncated: torch.Tensor  # (T, N) bool
    logp: torch.Tensor  # (T, N), log pi_old(a|s) of the acting policy
    val: torch.Tensor  # (T, N), V(s_t)
    next_val: torch.Tensor  # (T, N)
    episode_returns: list[float] = field(default_factory=list)  # undiscounted, of episodes that ended in this batch
    episode_lengths: list[int] = field(default_factory=list)

    @property
    def done(self) -> torch.Tensor:
        return self.terminated | self.truncated


class NumpyActor:
    """pi(.|s) for choosing actions, computed in NumPy on a snapshot of a policy's actor weights.

    Why: a rollout runs the actor on one small batch (N observations) per env step. At that size each torch call
    costs more in dispatch than in arithmetic (several microseconds, a dozen calls per step); a NumPy call costs
    about one. The arrays are the policy's own weights, read when the actor is made (once per rollout: they do not
    change during one), and ``tests/test_rollout.py`` checks that the logits and Gaussian means equal the policy's.
    Only the action is taken from here: log pi(a|s) and V(s) of the whole rollout are computed afterwards by the
    policy itself, in one batched call.
    """

    def __init__(self, policy: Policy, rng: np.random.Generator):
        spec = policy.spec
        linears = [m for m in policy.actor if isinstance(m, torch.nn.Linear)]
        # (in, out) weight matrices and (out,) biases, float32 like the policy's
        self.layers = [(m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy()) for m in linears]
        self.activation = np.tanh if spec.activation == "tanh" else (lambda h: np.maximum(h, 0))
        self.discrete = spec.discrete
        self.std = None if spec.discrete else np.exp(policy.log_std.detach().numpy())  # (A,)
        self.rng = rng

    def forward(self, obs: np.ndarray) -> np.ndarray:
        """(N, D) normalised observations -> (N, A) logits, or Gaussian means."""
        h = obs
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = self.activation(h)
        return h

    def sample(self, obs: np.ndarray) -> np.ndarray:
        """One action per row: (N,) integers drawn from softmax(logits), or (N, A) draws of N(mean, std^2)."""
        out = self.forward(obs)
        if not self.discrete:
            return (out + self.std * self.rng.standard_normal(out.shape)).astype(np.float32)
        z = out.astype(np.float64)
        probs = np.exp(z - z.max(axis=1, keepdims=True))  # (N, A), softmax in float64
        cdf = np.cumsum(probs / probs.sum(axis=1, keepdims=True), axis=1)
        u = self.rng.random((len(cdf), 1))  # inverse-CDF sampling: the first action whose cdf exceeds u
        return np.minimum((cdf <= u).sum(axis=1), cdf.shape[1] - 1)


class Collector:
    """Steps N envs with a policy, T steps at a time; an episode in progress continues into the next batch.

    Actions are drawn by a ``NumpyActor`` (with its own generator, seeded by ``seed``); log pi(a|s) and V(s) come
    from the policy, once per rollout, on the observations as they were acted on.
    """

    def __init__(self, envs: gym.vector.VectorEnv, seed: int):
        self.envs = envs
        self.space = envs.single_observation_space
        obs, _ = envs.reset(seed=seed)
        check_env_output(envs, obs, None)
        self.obs = to_obs_tensor(obs, self.space)  # (N, D)
        self.ep_return = np.zeros(envs.num_envs)
        self.ep_length = np.zeros(envs.num_envs, dtype=int)
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        """Start fresh episodes in every env (REINFORCE wants whole episodes in each batch)."""
        obs, _ = self.envs.reset()
        check_env_output(self.envs, obs, None)
        self.obs = to_obs_tensor(obs, self.space)
        self.ep_return[:] = 0
        self.ep_length[:] = 0

    def collect(self, policy: Policy, n_steps: int, update_obs_stats: bool = True) -> Batch:
        """Run ``n_steps`` steps in every env with ``policy`` sampling its actions."""
        actor = NumpyActor(policy, self.rng)
        obs_b, act_b, rew_b, term_b, trunc_b = ([] for _ in range(5))
        final_obs_b = []  # (t, env indices, final observation normalised then) for every step where an episode ended
        ep_returns, ep_lengths = [], []
        for t in range(n_steps):
            if update_obs_stats:
                policy.update_obs_stats(self.obs)
            norm_obs = policy.normalize(self.obs)  # (N, D), with this step's statistics: stored as acted on
            act = torch.from_numpy(actor.sample(norm_obs.numpy()))  # (N,) or (N, A)
            obs, rew, terminated, truncated, info = self.envs.step(policy.env_action(act))
            check_env_output(self.envs, obs, rew)
            done = terminated | truncated
            if done.any():  # the env has reset: keep the old episode's final observation, for truncation
                idx = np.flatnonzero(done)
                final_obs = np.stack(info["final_obs"][idx])
                check_env_output(self.envs, final_obs, None)
                final_obs_b.append((t, idx, policy.normalize(to_obs_tensor(final_obs, self.space))))  # (n_done, D)

            obs_b.append(norm_obs)
            act_b.append(act)
            rew_b.append(np.array(rew, dtype=np.float32))  # (N,) copies (an env may reuse its arrays), made
            term_b.append(np.array(terminated, dtype=bool))  # tensors once at the end of the rollout
            trunc_b.append(np.array(truncated, dtype=bool))

            self.ep_return += rew
            self.ep_length += 1
            for i in np.flatnonzero(done):
                ep_returns.append(float(self.ep_return[i]))
                ep_lengths.append(int(self.ep_length[i]))
                self.ep_return[i], self.ep_length[i] = 0.0, 0
            self.obs = to_obs_tensor(obs, self.space)  # (N, D), already reset where an episode ended

        obs, act = torch.stack(obs_b), torch.stack(act_b)  # (T, N, D); (T, N) or (T, N, A)
        T, N = obs.shape[:2]
        with torch.no_grad():  # log pi_old(a|s) and V(s) of the whole rollout, in one batched call each
            flat_obs = obs.reshape(T * N, -1)  # (T*N, D)
            logp = policy.log_prob(policy.distribution(flat_obs, normalized=True), act.reshape(T * N, *act.shape[2:]))
            val = policy.value(flat_obs, normalized=True).reshape(T, N)
            # V of the true next observation: the next row's V inside an episode, the final observation's at an end
            next_val = torch.cat([val[1:], policy.value(self.obs)[None]])  # (T, N)
            if final_obs_b:
                steps = np.concatenate([np.full(len(idx), t) for t, idx, _ in final_obs_b])  # (n_ends,) rows t
                cols = np.concatenate([idx for _, idx, _ in final_obs_b])  # (n_ends,) env columns
                final_obs = torch.cat([o for _, _, o in final_obs_b])  # (n_ends, D)
                next_val[steps, cols] = policy.value(final_obs, normalized=True)
        return Batch(
            obs=obs,
            act=act,
            rew=torch.from_numpy(np.stack(rew_b)),  # (T, N)
            terminated=torch.from_numpy(np.stack(term_b)),
            truncated=torch.from_numpy(np.stack(trunc_b)),
            logp=logp.reshape(T, N),
            val=val,
            next_val=next_val,
            episode_returns=ep_returns,
            episode_lengths=ep_lengths,
        )


def evaluate(policy: Policy, env_id: str, episodes: int = 20, seed: int = 0) -> tuple[float, float]:
    """Mean and std of the undiscounted return of ``episodes`` deterministic episodes (argmax action, or the
    Gaussian mean), episode i reset with seed ``seed + i``. Observation statistics are used, never updated.

    Raises if ``env_id``'s spaces are not the ones the policy was built for, or if it returns NaN or inf."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    env = gym.make(env_id)
    returns = []
    try:
        policy.check_env(env, env_id)
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            check_env_output(env, obs, None)
            total, done = 0.0, False
            while not done:
                act, _, _ = policy.act(to_obs_tensor(np.asarray(obs)[None], env.observation_space), deterministic=True)
                obs, rew, terminated, truncated, _ = env.step(policy.env_action(act)[0])
                check_env_output(env, obs, rew)
                total += float(rew)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return float(np.mean(returns)), float(np.std(returns))
