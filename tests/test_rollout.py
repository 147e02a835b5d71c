"""Rollouts, policies, evaluation and checkpoints on gymnasium envs, checked against envs whose dynamics we know."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import minirl.policies as policies
from minirl.policies import Policy, PolicySpec, SoftmaxCategorical, spec_for
from minirl.rollout import Collector, NumpyActor, evaluate, make_envs


class CounterEnv(gym.Env):
    """obs = [episode number, step in episode]; episode k of an env terminates after 3 + k % 5 steps, unless the
    time limit (6 steps) truncates it first. Reward 1 per step."""

    observation_space = gym.spaces.Box(0.0, 1e6, shape=(2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode = getattr(self, "episode", -1) + 1
        self.t = 0
        return np.array([self.episode, 0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        terminated = self.t >= 3 + self.episode % 5
        return np.array([self.episode, self.t], dtype=np.float32), 1.0, terminated, False, {}


gym.register(id="minirl-test/Counter-v0", entry_point=CounterEnv, max_episode_steps=6)


def counter_policy() -> Policy:
    """A policy whose critic reports the step counter, so next_val shows which observation it was computed on."""
    policy = Policy(PolicySpec(obs_dim=2, act_dim=2, discrete=True))
    policy.value = lambda obs, normalized=False: obs[:, 1].clone()
    return policy


@pytest.mark.parametrize("asynchronous", [False, True])
def test_no_transition_crosses_an_episode_boundary(asynchronous):
    envs = make_envs("minirl-test/Counter-v0", 3, seed=0, asynchronous=asynchronous)
    batch = Collector(envs, seed=0).collect(counter_policy(), n_steps=40)
    envs.close()
    episode, step = batch.obs[..., 0], batch.obs[..., 1]  # (T, N)
    assert batch.terminated.any() and batch.truncated.any()
    for t in range(39):
        same = ~batch.done[t]
        # within an episode the counter advances by one; after an end the next row starts a new episode at 0
        assert torch.all(step[t + 1][same] == step[t][same] + 1) and torch.all(episode[t + 1][same] == episode[t][same])
        assert torch.all(step[t + 1][~same] == 0) and torch.all(episode[t + 1][~same] == episode[t][~same] + 1)
    # next_val is V of the true next observation: the final one (step + 1) even where the env reset
    torch.testing.assert_close(batch.next_val, step + 1)
    # truncation happens exactly at the time limit, termination exactly at 3 + k % 5 steps
    assert torch.all(step[batch.truncated] + 1 == 6)
    assert torch.all(step[batch.terminated] + 1 == 3 + episode[batch.terminated] % 5)
    assert batch.episode_lengths == [int(s) + 1 for s in step[batch.done].tolist()]  # row-major: t, then env


def test_episode_statistics_count_whole_episodes():
    envs = make_envs("minirl-test/Counter-v0", 2, seed=0)
    collector = Collector(envs, seed=0)
    lengths = (
        collector.collect(counter_policy(), 5).episode_lengths + collector.collect(counter_policy(), 20).episode_lengths
    )
    envs.close()
    # env 0 and env 1 both play episodes 0, 1, 2, ... of lengths 3, 4, 5, 6, 6 (capped by the time limit)
    assert sorted(lengths)[:6] == [3, 3, 4, 4, 5, 5]
    assert all(length <= 6 for length in lengths)


def test_spaces_supported_and_rejected():
    cart = gym.make("CartPole-v1")
    spec = spec_for(cart)
    assert (spec.obs_dim, spec.act_dim, spec.discrete) == (4, 2, True)
    pend = gym.make("Pendulum-v1")
    spec = spec_for(pend)
    assert (spec.obs_dim, spec.act_dim, spec.discrete, spec.act_low, spec.act_high) == (3, 1, False, (-2.0,), (2.0,))
    lake = gym.make("FrozenLake-v1")
    assert spec_for(lake).obs_dim == 16  # Discrete observations are one-hot

    class MultiEnv(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (3,))
        action_space = gym.spaces.MultiDiscrete([2, 3])

    with pytest.raises(TypeError, match="action space MultiDiscrete"):
        spec_for(MultiEnv())

    class DictObsEnv(gym.Env):
        observation_space = gym.spaces.Dict({"a": gym.spaces.Discrete(2)})
        action_space = gym.spaces.Discrete(2)

    with pytest.raises(TypeError, match="observation space Dict"):
        spec_for(DictObsEnv())


def test_gaussian_policy_logp_and_clipped_env_actions():
    policy = Policy(spec_for(gym.make("Pendulum-v1"), log_std_init=1.0))
    obs = torch.randn(64, 3)
    act, logp, _ = policy.act(obs)
    dist = policy.distribution(obs)
    by_hand = (-0.5 * ((act - dist.mean) / dist.stddev) ** 2 - dist.stddev.log() - 0.5 * np.log(2 * np.pi)).sum(-1)
    torch.testing.assert_close(logp, by_hand)
    env_act = policy.env_action(act)
    assert env_act.min() >= -2.0 and env_act.max() <= 2.0 and (np.abs(act.numpy()) > 2).any()


def test_discrete_observation_env_collects():
    envs = make_envs("FrozenLake-v1", 2, seed=0)
    batch = Collector(envs, seed=0).collect(Policy(spec_for(envs)), 10)
    envs.close()
    assert batch.obs.shape == (10, 2, 16) and torch.all(batch.obs.sum(-1) == 1)


def test_obs_norm_statistics_match_numpy_and_are_saved(tmp_path):
    policy = Policy(PolicySpec(obs_dim=3, act_dim=2, discrete=True, obs_norm=True))
    data = torch.randn(500, 3) * torch.tensor([1.0, 10.0, 0.1]) + torch.tensor([5.0, -2.0, 0.0])
    for chunk in data.split(37):
        policy.update_obs_stats(chunk)
    torch.testing.assert_close(policy.obs_mean, data.mean(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(policy.obs_var, data.var(0, unbiased=False), rtol=1e-3, atol=1e-4)
    loaded = Policy.load(policy.save(tmp_path / "p"))
    torch.testing.assert_close(loaded.obs_mean, policy.obs_mean)
    obs = torch.randn(8, 3)
    torch.testing.assert_close(loaded.distribution(obs).logits, policy.distribution(obs).logits)


def test_evaluate_uses_but_never_updates_obs_statistics():
    policy = Policy(spec_for(gym.make("CartPole-v1"), obs_norm=True))
    policy.update_obs_stats(torch.randn(100, 4) * 3 + 1)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    first = evaluate(policy, "CartPole-v1", episodes=3, seed=5)
    assert evaluate(policy, "CartPole-v1", episodes=3, seed=5) == first
    for k, v in policy.state_dict().items():
        assert torch.equal(v, before[k])
    # the statistics are applied: resetting them changes what the actor sees
    obs = torch.randn(16, 4)
    logits = policy.distribution(obs).logits
    policy.obs_mean.zero_()
    policy.obs_var.fill_(1.0)
    assert not torch.allclose(policy.distribution(obs).logits, logits)


def test_save_crash_keeps_previous_checkpoint(tmp_path, monkeypatch):
    policy = Policy(spec_for(gym.make("CartPole-v1")))
    path = policy.save(tmp_path / "policy")
    saved = (path / "model.safetensors").read_bytes()

    def crash(tensors, filename):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(policies, "save_file", crash)
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        policy.save(path)
    assert (path / "model.safetensors").read_bytes() == saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]  # no temporary folders left behind
    Policy.load(path)


def test_load_rejects_a_folder_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a minirl policy checkpoint"):
        Policy.load(tmp_path)


# --- the NumPy actor that picks actions during a rollout computes the policy's own function ---


@pytest.mark.parametrize(
    "spec",
    [
        PolicySpec(obs_dim=4, act_dim=3, discrete=True),
        PolicySpec(obs_dim=3, act_dim=2, discrete=False, log_std_init=-0.5),
        PolicySpec(obs_dim=4, act_dim=2, discrete=True, hidden=(32, 16, 8), activation="relu"),
    ],
)
def test_numpy_actor_computes_the_policys_logits_and_means(spec):
    torch.manual_seed(0)
    policy = Policy(spec)
    for p in policy.actor.parameters():  # away from the near-zero last layer, so differences would show
        p.data.normal_()
    obs = torch.randn(64, spec.obs_dim)
    actor = NumpyActor(policy, np.random.default_rng(0))
    with torch.no_grad():
        dist = policy.distribution(obs)
        expected = dist.logits if spec.discrete else dist.mean  # Categorical's logits are log-probabilities
    got = torch.from_numpy(actor.forward(obs.numpy()))
    if spec.discrete:
        got = torch.log_softmax(got, dim=-1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_numpy_actor_samples_from_pi():
    torch.manual_seed(0)
    policy = Policy(PolicySpec(obs_dim=2, act_dim=3, discrete=True))
    with torch.no_grad():
        policy.actor[-1].bias.copy_(torch.tensor([0.0, 1.0, -1.0]))  # pi = softmax([0, 1, -1]) at every s (w ~ 0)
        policy.actor[-1].weight.zero_()
    draws = NumpyActor(policy, np.random.default_rng(0)).sample(np.zeros((100_000, 2), dtype=np.float32))
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, torch.softmax(torch.tensor([0.0, 1.0, -1.0]), 0).numpy(), atol=0.005)

    gauss = Policy(PolicySpec(obs_dim=2, act_dim=2, discrete=False, log_std_init=np.log(0.5)))
    with torch.no_grad():
        gauss.actor[-1].bias.copy_(torch.tensor([1.0, -2.0]))
        gauss.actor[-1].weight.zero_()
    draws = NumpyActor(gauss, np.random.default_rng(0)).sample(np.zeros((100_000, 2), dtype=np.float32))
    assert draws.dtype == np.float32
    np.testing.assert_allclose(draws.mean(0), [1.0, -2.0], atol=0.01)
    np.testing.assert_allclose(draws.std(0), [0.5, 0.5], atol=0.01)


def test_batch_logp_and_values_are_the_policys_on_the_stored_rows():
    envs = make_envs("Pendulum-v1", 2, seed=0)
    policy = Policy(spec_for(envs, obs_norm=True))
    batch = Collector(envs, seed=0).collect(policy, 30)
    envs.close()
    with torch.no_grad():
        for t in (0, 17, 29):  # row by row, as a step-by-step rollout would compute them
            dist = policy.distribution(batch.obs[t], normalized=True)
            torch.testing.assert_close(batch.logp[t], policy.log_prob(dist, batch.act[t]), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(batch.val[t], policy.value(batch.obs[t], normalized=True), rtol=1e-5, atol=1e-5)


def test_softmax_categorical_is_torchs_categorical():
    torch.manual_seed(0)
    logits = (torch.randn(50, 4) * 5).requires_grad_()
    ours, theirs = SoftmaxCategorical(logits), torch.distributions.Categorical(logits=logits)
    act = torch.randint(0, 4, (50,))
    for a, b in [(ours.logits, theirs.logits), (ours.probs, theirs.probs), (ours.entropy(), theirs.entropy()),
                 (ours.log_prob(act), theirs.log_prob(act))]:  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    grads = [torch.autograd.grad((d.log_prob(act) + d.entropy()).sum(), logits)[0] for d in (ours, theirs)]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-6)
    assert grads[0].abs().max() > 0.1
    torch.manual_seed(1)
    drawn = ours.sample((3,))
    torch.manual_seed(1)
    assert torch.equal(drawn, theirs.sample((3,)))
    assert ours.batch_shape == (50,) and ours.sample().shape == (50,)


def test_discrete_log_prob_is_categoricals():
    policy = Policy(PolicySpec(obs_dim=3, act_dim=4, discrete=True))
    obs = torch.randn(50, 3) * 3
    act = torch.randint(0, 4, (50,))
    dist = policy.distribution(obs)
    torch.testing.assert_close(policy.log_prob(dist, act), dist.log_prob(act), rtol=0, atol=0)
    logp = policy.log_prob(dist, act)  # and the gradient: the same graph up to the last gather
    grad = torch.autograd.grad(logp.sum(), list(policy.actor.parameters()))
    expected = torch.autograd.grad(policy.distribution(obs).log_prob(act).sum(), list(policy.actor.parameters()))
    for g, e in zip(grad, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
