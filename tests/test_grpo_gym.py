"""GRPO on gymnasium: groups share their start state, masks mark real steps, smoke runs, determinism, bad input,
the step cap, and a learning test on CartPole-v1 with its sabotaged twin."""

import dataclasses
import warnings

import numpy as np
import pytest
import torch
from _envs import register
from _helpers import flat_params

import minirl.algos.grpo as grpo
from minirl.cli import main
from minirl.policies import Policy, spec_for
from minirl.rollout import evaluate, make_envs

pytestmark = pytest.mark.usefixtures("one_thread")
register()  # the test envs of _envs.py


def collect(group_size=4, n_groups=3, same_start=True, env_id="CartPole-v1", seed=0):
    torch.manual_seed(seed)
    envs = make_envs(env_id, group_size * n_groups, seed)
    policy = Policy(spec_for(envs, critic=False))
    seeds = grpo.reset_seeds(np.random.default_rng(seed), n_groups, group_size, same_start)
    batch = grpo.collect_groups(envs, policy, seeds)
    envs.close()
    return batch


# --- groups and masks ---


def test_one_group_shares_its_start_state_and_groups_differ():
    G = 4
    batch = collect(group_size=G, n_groups=3)
    start = batch.obs[:, 0].view(3, G, -1)  # (n_groups, G, D)
    assert (start == start[:, :1]).all()  # every episode of a group starts where the group's first one does
    assert not torch.equal(start[0, 0], start[1, 0]) and not torch.equal(start[1, 0], start[2, 0])
    assert len(set(batch.ret.view(3, G)[0].tolist())) > 1 or len(set(batch.ret.view(3, G)[1].tolist())) > 1


def test_without_same_start_every_episode_starts_elsewhere():
    batch = collect(group_size=4, n_groups=2, same_start=False)
    start = batch.obs[:, 0]  # (B, D)
    assert len({tuple(row.tolist()) for row in start}) == start.shape[0]


def test_training_batches_share_start_states(monkeypatch):
    starts = []
    real = grpo.collect_groups

    def spy(envs, policy, seeds, *args):
        batch = real(envs, policy, seeds, *args)
        starts.append(batch.obs[:, 0].clone())
        return batch

    monkeypatch.setattr(grpo, "collect_groups", spy)
    cfg = grpo.GRPOConfig(total_steps=1500, group_size=3, n_groups=2)
    grpo.train(cfg)
    assert len(starts) >= 2
    for start in starts:
        groups = start.view(cfg.n_groups, cfg.group_size, -1)
        assert (groups == groups[:, :1]).all()
    assert not torch.equal(starts[0], starts[1])  # fresh start states at every update


def test_mask_marks_exactly_the_real_steps():
    batch = collect(group_size=4, n_groups=2)
    lengths = batch.mask.sum(1)  # (B,)
    assert torch.equal(lengths.float(), batch.ret)  # CartPole pays 1 per step: a return is an episode's length
    assert batch.mask.shape[1] == int(lengths.max())  # padded to the longest episode, no further
    for row, n in zip(batch.mask, lengths):
        assert row[:n].all() and not row[n:].any()  # a prefix: real steps first, padding after
    assert (batch.logp[~batch.mask] == 0).all() and (batch.logp[batch.mask] < 0).all()
    assert batch.steps == int(lengths.sum())


# --- training runs ---


@pytest.mark.parametrize(
    "cfg",
    [
        grpo.GRPOConfig(total_steps=2000, group_size=4, n_groups=2),
        grpo.GRPOConfig(total_steps=2000, group_size=4, n_groups=2, beta=0.1, scale="none", clip_high=0.28),
        grpo.GRPOConfig(env_id="Pendulum-v1", total_steps=800, group_size=2, n_groups=1, loss_agg="token-mean"),
    ],
    ids=["cartpole", "cartpole-kl-none-cliphigh", "pendulum"],
)
def test_smoke_run_changes_parameters_and_logs(cfg):
    result = grpo.train(cfg)
    assert len(result.history) >= 2
    steps = result.history["step"]
    assert steps[-1] >= cfg.total_steps and steps[-2] < cfg.total_steps  # stops at the update that reaches it
    for key in ("return_mean", "pg_loss", "entropy", "approx_kl", "clip_frac", "group_std", "rollout_s"):
        assert np.isfinite(result.history[key]).all(), key
    if cfg.beta > 0:
        assert all(k >= 0 for k in result.history["kl_ref"])
    torch.manual_seed(cfg.seed)
    untrained = Policy(result.policy.spec)  # same seed and spec: the initial parameters
    for name, value in result.policy.named_parameters():
        assert not torch.equal(value, dict(untrained.named_parameters())[name]), f"{name} did not change"
    assert result.policy.critic is None  # no critic: the group is the baseline


def test_one_iteration_is_on_policy_so_nothing_is_clipped():
    result = grpo.train(grpo.GRPOConfig(total_steps=1500, group_size=4, n_groups=2, iterations=1))
    assert result.history["clip_frac"] == [0.0] * len(result.history)
    # measured before the step, so 0 up to rounding: the old log-probs came from batches of another shape (B envs
    # while acting, all real steps at once here), which round differently on some CPUs (3.5e-17 on an Intel Xeon)
    assert np.abs(result.history["approx_kl"]).max() < 1e-6


def test_same_seed_same_run():
    cfg = grpo.GRPOConfig(total_steps=1500, group_size=4, n_groups=2)
    a, b = grpo.train(cfg), grpo.train(cfg)
    assert torch.equal(flat_params(a.policy), flat_params(b.policy))
    for key in a.history.keys():
        if key not in ("rollout_s", "update_s"):  # wall times differ; NaN (nothing logged yet) equals NaN
            np.testing.assert_array_equal(a.history[key], b.history[key], err_msg=key)
    c = grpo.train(dataclasses.replace(cfg, seed=1))
    assert not torch.equal(flat_params(a.policy), flat_params(c.policy))


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(group_size=1), ValueError, "group_size must be an int >= 2"),
        (dict(n_groups=0), ValueError, "n_groups"),
        (dict(scale="std"), ValueError, "scale must be one of"),
        (dict(loss_agg="mean"), ValueError, "loss_agg must be one of"),
        (dict(beta=-0.1), ValueError, "beta"),
        (dict(clip_low=1.5), ValueError, "clip_low"),
        (dict(env_id="Blackjack-v1"), TypeError, "observation space"),
        (dict(total_steps=0), ValueError, "total_steps must be > 0"),
        (dict(lr=0.0), ValueError, "lr must be > 0"),
        (dict(lr=float("inf")), ValueError, "lr must be a finite number"),
        (dict(max_grad_norm=-0.5), ValueError, "max_grad_norm must be > 0"),
        (dict(iterations=0), ValueError, "iterations must be > 0"),
        (dict(max_episode_steps=0), ValueError, "max_episode_steps must be > 0"),
        (dict(hidden=(0,)), ValueError, "hidden must be a non-empty sequence"),
        (dict(group_size=True), TypeError, "group_size must be a number"),
        (dict(clip_high=-0.1), ValueError, "clip_high must be > 0"),
    ],
)
def test_bad_config_names_the_problem(change, error, match):
    with pytest.raises(error, match=match):
        grpo.train(grpo.GRPOConfig(**{"total_steps": 200, "group_size": 2, "n_groups": 1, **change}))


def test_numpy_numbers_are_numbers():
    cfg = grpo.GRPOConfig(total_steps=np.int64(200), group_size=np.int64(2), n_groups=1, lr=np.float32(3e-3))
    grpo.train(cfg)
    assert type(cfg.group_size) is int and type(cfg.lr) is float


# --- the step cap ---


def test_an_env_without_time_limit_is_cut_at_the_step_cap():
    cfg = grpo.GRPOConfig(env_id="minirl-test/Endless-v0", total_steps=100, group_size=2, n_groups=1)
    with pytest.warns(UserWarning, match="no time limit.*max_episode_steps=20"):
        result = grpo.train(dataclasses.replace(cfg, max_episode_steps=20))  # without the cap: never returns
    assert result.history["capped"] == [1.0] * len(result.history)  # every episode was cut, none ended
    assert result.history["batch_return"][0] == 20.0  # 1 per step, for the 20 steps before the cap


def test_the_env_time_limit_applies_and_needs_no_warning():
    envs = make_envs("CartPole-v1", 2, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert grpo.episode_cap(envs, 1000) == 500 and grpo.episode_cap(envs, 30) == 30
    envs.close()


def test_sum_norm_divides_by_the_step_cap_not_the_longest_episode(monkeypatch):
    seen = []
    real = grpo.aggregate

    def spy(loss, mask, mode, max_len=None):
        if mode == "seq-mean-token-sum-norm":  # the logged approx_kl and clip_frac are token means
            seen.append((loss.shape[1], max_len))
        return real(loss, mask, mode, max_len)

    monkeypatch.setattr(grpo, "aggregate", spy)
    grpo.train(grpo.GRPOConfig(total_steps=300, group_size=2, n_groups=2, loss_agg="seq-mean-token-sum-norm"))
    assert seen and all(max_len == 500 for _, max_len in seen)  # CartPole-v1's time limit, whatever the batch's length
    assert any(length < 500 for length, _ in seen)  # the early batches are much shorter than the cap


# --- bad numbers from the env, and divergence ---


@pytest.mark.parametrize("env_id, what", [("minirl-test/NaNReward-v0", "reward"), ("minirl-test/NaNObs-v0", "obs")])
def test_a_nan_from_the_env_names_the_env(env_id, what):
    with pytest.raises(ValueError, match=f"{env_id} returned a non-finite {what}"):
        grpo.train(grpo.GRPOConfig(env_id=env_id, total_steps=100, group_size=2, n_groups=1))


def test_divergence_stops_training_with_the_step_and_causes(monkeypatch):
    real = grpo.aggregate
    monkeypatch.setattr(grpo, "aggregate", lambda *a, **k: real(*a, **k) * float("nan"))  # a loss gone NaN
    with pytest.raises(FloatingPointError, match=r"grad_norm is not finite .* at step \d+.*learning rate"):
        grpo.train(grpo.GRPOConfig(total_steps=300, group_size=2, n_groups=1))


def test_cli_train_then_eval(tmp_path, capsys):
    out = tmp_path / "run"
    main(
        [
            "train",
            "grpo",
            "--steps",
            "600",
            "--group-size",
            "3",
            "--n-groups",
            "2",
            "--out",
            str(out),
            "--eval-episodes",
            "2",
            "--loss-agg",
            "token-mean",
        ]
    )
    assert (out / "policy" / "model.safetensors").exists()
    main(["eval", str(out / "policy"), "--episodes", "2"])
    assert "CartPole-v1" in capsys.readouterr().out


# --- learning test and its sabotaged twin ---

BUDGET = 100_000  # env steps, the default; measured on one thread: about 5 s, and seeds 0-4 all evaluate >= 475


def grpo_cartpole() -> float:
    result = grpo.train(grpo.GRPOConfig(total_steps=BUDGET, seed=0))
    score = evaluate(result.policy, "CartPole-v1", episodes=20, seed=1000)[0]
    print(f"GRPO CartPole-v1, {BUDGET} steps, seed 0: evaluation {score:.1f}")
    return score


@pytest.mark.learning
def test_grpo_solves_cartpole():
    assert grpo_cartpole() >= 475


@pytest.mark.slow
def test_sabotaged_grpo_misses_cartpole(monkeypatch):
    """Sabotage: an episode's return keeps adding what its env pays after the episode ended (``ret += rew`` without
    the ``alive`` mask: a vector env resets a finished env and plays on while the others finish). CartPole pays 1 per
    step, so every episode of a batch returns L, the length of the longest, and no episode beats its group."""
    real = grpo.collect_groups

    def buggy(*args):
        batch = real(*args)
        batch.ret = torch.full_like(batch.ret, float(batch.mask.shape[1]))  # the sum over all L steps, padding too
        return batch

    monkeypatch.setattr(grpo, "collect_groups", buggy)
    assert grpo_cartpole() < 475
