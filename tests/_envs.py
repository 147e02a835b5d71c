"""Tiny gymnasium envs registered for the tests: bad numbers, no time limit, other spaces."""

import gymnasium as gym
import numpy as np


class ToyEnv(gym.Env):
    """Observations of size ``obs_dim`` (the step count, repeated), ``n_actions`` discrete actions or a Box of size
    ``act_dim``; pays 1 per step and terminates after ``length`` steps (never, if None). ``nan_reward_at`` /
    ``nan_obs_at`` make that step's reward / observation NaN."""

    def __init__(self, obs_dim=4, n_actions=2, act_dim=None, length=10, nan_reward_at=None, nan_obs_at=None):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        if act_dim is None:
            self.action_space = gym.spaces.Discrete(n_actions)
        else:
            self.action_space = gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)
        self.length, self.nan_reward_at, self.nan_obs_at = length, nan_reward_at, nan_obs_at
        self.t = 0

    def _obs(self):
        value = np.nan if self.t == self.nan_obs_at else self.t / 10
        return np.full(self.observation_space.shape, value, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        reward = np.nan if self.t == self.nan_reward_at else 1.0
        terminated = self.length is not None and self.t >= self.length
        return self._obs(), reward, terminated, False, {}


ENVS = {
    "minirl-test/NaNReward-v0": dict(nan_reward_at=3),
    "minirl-test/NaNObs-v0": dict(nan_obs_at=3),
    "minirl-test/Endless-v0": dict(length=None),
    "minirl-test/ThreeActions-v0": dict(n_actions=3),
    "minirl-test/ObsSix-v0": dict(obs_dim=6),
    "minirl-test/Box2-v0": dict(act_dim=2),
}


def register() -> None:
    """Register the test envs once; all have a time limit of 50 steps except Endless, which has none."""
    for env_id, kwargs in ENVS.items():
        if env_id not in gym.registry:
            limit = None if "Endless" in env_id else 50
            gym.register(env_id, entry_point=ToyEnv, kwargs=kwargs, max_episode_steps=limit)
