"""DQN: the target by hand, the schedule, the replay buffer, truncation vs termination, the returned Policy, smoke
runs, determinism, bad input, and a learning test on CartPole-v1 with its sabotaged twin."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import flat_params

import minirl.algos.dqn as dqn
from minirl.cli import main
from minirl.policies import Policy
from minirl.rollout import evaluate

SMOKE = dict(total_steps=1200, learning_starts=400, batch_size=32, log_every=400, train_freq=4, gradient_steps=2)
SMOKE["target_update"] = 50


pytestmark = pytest.mark.usefixtures("one_thread")


def test_td_target_by_hand():
    rew = torch.tensor([1.0, 1.0, 0.5])
    next_q = torch.tensor([[2.0, 3.0], [4.0, -1.0], [10.0, 20.0]])  # (B, A)
    terminated = torch.tensor([False, False, True])
    y = dqn.td_target(rew, next_q, terminated, gamma=0.9)
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.9 * 3.0, 1.0 + 0.9 * 4.0, 0.5]))  # no future after the end


def test_epsilon_decays_linearly_then_stays():
    cfg = dqn.DQNConfig(total_steps=1000, eps_start=1.0, eps_end=0.1, exploration_fraction=0.5)
    assert dqn.epsilon(cfg, 0) == 1.0
    assert dqn.epsilon(cfg, 250) == pytest.approx(0.55)
    assert dqn.epsilon(cfg, 500) == pytest.approx(0.1) and dqn.epsilon(cfg, 999) == pytest.approx(0.1)


def test_replay_buffer_overwrites_the_oldest():
    buf = dqn.ReplayBuffer(capacity=3, obs_dim=2)
    for i in range(5):
        buf.add(torch.full((2,), float(i)), i % 2, float(i), torch.full((2,), i + 0.5), i == 4)
    assert buf.size == 3 and sorted(buf.rew.tolist()) == [2.0, 3.0, 4.0]
    obs, act, rew, next_obs, term = buf.sample(64, np.random.default_rng(0))
    assert set(rew.tolist()) == {2.0, 3.0, 4.0}  # only what is stored, each drawn
    assert torch.equal(obs[:, 0], rew) and torch.equal(next_obs[:, 0], rew + 0.5) and torch.equal(term, rew == 4.0)


def test_truncation_bootstraps_from_the_final_observation(monkeypatch):
    if "CartPoleShort-v1" not in gym.registry:  # CartPole cut by a time limit after 5 steps
        gym.register(
            "CartPoleShort-v1", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=5
        )
    stored = []  # (obs, next_obs, terminated) of every transition, in order
    real_add = dqn.ReplayBuffer.add

    def spy(self, obs, act, rew, next_obs, terminated):
        stored.append((obs.clone(), next_obs.clone(), terminated))
        real_add(self, obs, act, rew, next_obs, terminated)

    monkeypatch.setattr(dqn.ReplayBuffer, "add", spy)
    dqn.train(dqn.DQNConfig(env_id="CartPoleShort-v1", total_steps=41, learning_starts=41))
    for i in range(40):
        obs, next_obs, terminated = stored[i]
        if i % 5 == 4:  # the last step before the time limit: truncated, not terminated (5 steps cannot drop it)
            assert not terminated
            assert not torch.equal(next_obs, stored[i + 1][0])  # s' is the true final state, not the reset one
            # CartPole's Euler step: x' = x + tau x_dot, theta' = theta + tau theta_dot with tau = 0.02
            torch.testing.assert_close(next_obs[[0, 2]], obs[[0, 2]] + 0.02 * obs[[1, 3]], rtol=0, atol=1e-6)
        else:
            assert torch.equal(next_obs, stored[i + 1][0])  # inside an episode s' is the next step's s


def test_smoke_run_changes_parameters_and_logs():
    cfg = dqn.DQNConfig(**SMOKE)
    result = dqn.train(cfg)
    assert result.history["step"] == [400, 800, 1200]
    assert result.history["updates"][-1] == (1200 - 400) // cfg.train_freq * cfg.gradient_steps
    for key in ("return_mean", "epsilon", "td_loss", "q_mean", "rollout_s", "update_s"):
        assert key in result.history.keys()
    assert np.isfinite(result.history["td_loss"][1:]).all()
    torch.manual_seed(cfg.seed)
    untrained = Policy(result.policy.spec)
    for name, value in result.policy.named_parameters():
        assert not torch.equal(value, dict(untrained.named_parameters())[name]), f"{name} did not change"


def test_policy_acts_greedily_on_q_and_saves(tmp_path):
    result = dqn.train(dqn.DQNConfig(**SMOKE))
    policy = result.policy
    obs = torch.randn(16, 4)
    act, logp, val = policy.act(obs, deterministic=True)
    assert torch.equal(act, dqn.q_values(policy, obs).argmax(-1))  # the deterministic action is argmax_a Q(s, a)
    assert torch.isfinite(logp).all() and (val == 0).all()  # no critic: Policy.value is 0
    loaded = Policy.load(result.save(tmp_path / "policy"))
    assert torch.equal(flat_params(loaded), flat_params(policy))
    assert evaluate(loaded, "CartPole-v1", episodes=2) == evaluate(policy, "CartPole-v1", episodes=2)


def test_same_seed_same_run():
    cfg = dqn.DQNConfig(**SMOKE)
    a, b = dqn.train(cfg), dqn.train(cfg)
    assert torch.equal(flat_params(a.policy), flat_params(b.policy))
    for key in a.history.keys():
        if key not in ("rollout_s", "update_s"):  # wall times differ; NaN (nothing logged yet) equals NaN
            np.testing.assert_array_equal(a.history[key], b.history[key], err_msg=key)
    c = dqn.train(dataclasses.replace(cfg, seed=1))
    assert not torch.equal(flat_params(a.policy), flat_params(c.policy))


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(env_id="Pendulum-v1"), TypeError, "DQN needs a Discrete action space"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(eps_end=1.5), ValueError, "eps_end"),
    ],
)
def test_bad_config_names_the_problem(change, error, match):
    with pytest.raises(error, match=match):
        dqn.train(dqn.DQNConfig(total_steps=10, **change))


def test_cli_train_then_eval(tmp_path, capsys):
    out = tmp_path / "run"
    main(["train", "dqn", "--steps", "600", "--learning-starts", "300", "--out", str(out), "--eval-episodes", "2"])
    main(["eval", str(out / "policy"), "--episodes", "2"])
    assert "CartPole-v1" in capsys.readouterr().out


# --- learning test and its sabotaged twin ---


def dqn_cartpole() -> float:
    """The best running mean of 20 training episodes over a run of the defaults (50k env steps, zoo settings).

    DQN on CartPole learns and then often forgets for a while (the replay buffer fills with good play, the target
    overshoots): its final greedy score swings between about 20 and 500 from seed to seed and from one CPU's
    rounding to another's, SB3's as much as minirl's (``benchmarks/results/dqn_cartpole.md``). The best running
    mean shows whether it learned at all: 181 and 143 for seeds 0 and 1, about 22 (random play) for the sabotaged twin.
    """
    result = dqn.train(dqn.DQNConfig(seed=0))
    return max(r for r in result.history["return_mean"] if r == r)  # NaN before the first episode ends


@pytest.mark.learning
def test_dqn_clearly_beats_random_on_cartpole():
    assert dqn_cartpole() >= 100  # random play scores about 22


@pytest.mark.slow
def test_sabotaged_dqn_misses_cartpole(monkeypatch):
    # sabotage: bootstrap through termination, as if falling over had a future like any other step
    monkeypatch.setattr(dqn, "td_target", lambda rew, next_q, terminated, gamma: rew + gamma * next_q.max(-1).values)
    assert dqn_cartpole() < 100
