"""TRPO on gymnasium: the trust region holds on real CartPole batches (measured independently), smoke runs,
determinism, the natural-policy-gradient option, the CLI, and a learning test with its sabotaged twin."""

import copy
import csv
import dataclasses

import pytest
import torch
from _helpers import flat_params

import minirl.algos.trpo as trpo
from minirl.cli import main
from minirl.policies import Policy, spec_for
from minirl.returns import gae
from minirl.rollout import Collector, evaluate, make_envs

pytestmark = pytest.mark.usefixtures("one_thread")


def cartpole_batches(cfg: trpo.TRPOConfig, n_batches: int):
    """Real CartPole batches (b_obs, b_act, b_adv) from a policy that ``policy_step`` keeps updating."""
    torch.manual_seed(cfg.seed)
    envs = make_envs(cfg.env_id, cfg.num_envs, cfg.seed)
    policy = Policy(spec_for(envs))
    collector = Collector(envs, cfg.seed)
    for _ in range(n_batches):
        batch = collector.collect(policy, cfg.n_steps)
        adv, _ = gae(batch.rew, batch.val, batch.next_val, batch.terminated, batch.truncated, cfg.gamma, cfg.lam)
        adv = adv.reshape(-1)
        yield policy, batch.obs.reshape(-1, batch.obs.shape[-1]), batch.act.reshape(-1), (adv - adv.mean()) / adv.std()
    envs.close()


def test_every_accepted_update_on_cartpole_keeps_kl_within_delta_and_improves_the_surrogate():
    cfg = trpo.TRPOConfig()
    accepted, backtracked = 0, 0
    for policy, obs, act, adv in cartpole_batches(cfg, 8):
        old = copy.deepcopy(policy)
        step = trpo.policy_step(policy, obs, act, adv, cfg)
        with torch.no_grad():  # independent measurement: the two policies' action probabilities, by hand
            old_logp = torch.log_softmax(old.actor(obs), -1)  # (B, A)
            new_logp = torch.log_softmax(policy.actor(obs), -1)
            kl = (old_logp.exp() * (old_logp - new_logp)).sum(-1).mean().item()
            ratio = torch.exp(new_logp.gather(1, act[:, None]) - old_logp.gather(1, act[:, None]))[:, 0]
            gain = (ratio * adv).mean().item() - adv.mean().item()
        assert abs(kl - step.kl) < 1e-6 and abs(gain - (step.new_surrogate - step.old_surrogate)) < 1e-6
        if step.accepted:
            assert kl <= cfg.delta + 1e-6
            assert gain > 0
            accepted += 1
            backtracked += len(step.tries) > 1
        else:
            assert torch.equal(flat_params(policy.actor), flat_params(old.actor))
        assert torch.equal(flat_params(policy.critic), flat_params(old.critic))  # the policy step leaves V alone
    assert accepted >= 6  # the check is not vacuous
    assert backtracked >= 1  # and the line search did have to shrink a step


def test_natural_policy_gradient_takes_the_full_step_the_line_search_starts_from():
    cfg = trpo.TRPOConfig()
    policy, obs, act, adv = next(cartpole_batches(cfg, 1))
    npg_policy = copy.deepcopy(policy)
    step = trpo.policy_step(policy, obs, act, adv, cfg)
    npg = trpo.policy_step(npg_policy, obs, act, adv, dataclasses.replace(cfg, line_search=False))
    assert npg.accepted and npg.fraction == 1.0 and npg.tries == []
    assert npg.beta == pytest.approx(step.beta, rel=1e-5)
    assert npg.kl == pytest.approx(step.tries[0].kl, rel=1e-4)  # the same candidate, theta_old + beta s
    assert npg.new_surrogate == pytest.approx(step.tries[0].surrogate, rel=1e-4)
    assert npg.kl == pytest.approx(cfg.delta, rel=0.5)  # the quadratic model puts it near delta, not on it


@pytest.mark.parametrize(
    "cfg",
    [
        trpo.TRPOConfig(total_steps=2048),
        trpo.TRPOConfig(total_steps=2048, line_search=False),
        trpo.TRPOConfig(env_id="Pendulum-v1", total_steps=2048, n_steps=512, obs_norm=True, value_epochs=2),
    ],
    ids=["cartpole", "cartpole-npg", "pendulum-gaussian"],
)
def test_smoke_run_changes_parameters_and_logs(cfg):
    result = trpo.train(cfg)
    assert len(result.history) == cfg.total_steps // (cfg.num_envs * cfg.n_steps)
    for key in (
        "return_mean",
        "kl",
        "surrogate_gain",
        "accepted",
        "step_fraction",
        "v_loss",
        "entropy",
        "rollout_s",
        "policy_s",
        "critic_s",
        "update_s",
    ):
        assert key in result.history.keys()
    torch.manual_seed(cfg.seed)
    untrained = Policy(result.policy.spec)  # the same seed and spec give the initial parameters
    for name, value in result.policy.named_parameters():
        assert not torch.equal(value, dict(untrained.named_parameters())[name]), f"{name} did not change"
    if cfg.line_search:
        assert all(k <= cfg.delta + 1e-6 for k in result.history["kl"])


def test_same_seed_same_run():
    cfg = trpo.TRPOConfig(total_steps=2048)
    a, b = trpo.train(cfg), trpo.train(cfg)
    assert torch.equal(flat_params(a.policy), flat_params(b.policy))
    timings = ("rollout_s", "policy_s", "critic_s", "update_s")
    assert [{k: v for k, v in row.items() if k not in timings} for row in a.history.rows] == [
        {k: v for k, v in row.items() if k not in timings} for row in b.history.rows
    ]
    c = trpo.train(dataclasses.replace(cfg, seed=1))
    assert not torch.equal(flat_params(a.policy), flat_params(c.policy))


@pytest.mark.parametrize(
    "change,message",
    [({"delta": 0.0}, "delta must be > 0"), ({"backtrack_coef": 1.0}, "backtrack_coef"), ({"cg_iters": 0}, "cg_iters")],
)
def test_bad_config_names_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        trpo.train(trpo.TRPOConfig(total_steps=1024, **change))


def test_cli_trains_trpo(tmp_path):
    out = tmp_path / "run"
    main(
        [
            "train",
            "trpo",
            "--steps",
            "1024",
            "--cg-iters",
            "5",
            "--no-line-search",
            "--out",
            str(out),
            "--eval-episodes",
            "1",
        ]
    )
    rows = list(csv.DictReader(open(out / "history.csv")))
    assert len(rows) == 1 and float(rows[0]["step_fraction"]) == 1.0 and float(rows[0]["line_search_tries"]) == 0
    assert (out / "policy" / "model.safetensors").exists()


# --- learning test and its sabotaged twin ---


def trpo_cartpole() -> float:
    result = trpo.train(trpo.TRPOConfig(total_steps=100_000, seed=0))
    score = evaluate(result.policy, "CartPole-v1", episodes=20, seed=1000)[0]
    print(f"TRPO CartPole-v1, 100k steps, seed 0: evaluation {score:.1f}")
    return score


@pytest.mark.learning
def test_trpo_solves_cartpole_in_100k_steps():
    assert trpo_cartpole() >= 475


@pytest.mark.slow
def test_sabotaged_trpo_misses_cartpole(monkeypatch):
    """Sabotage: every episode end is treated as a time limit (``truncated`` where ``terminated`` belongs), so GAE
    bootstraps from V(final observation) where the pole fell: falling looks like any other step."""
    real = trpo.gae

    def buggy(rew, val, next_val, terminated, truncated, gamma, lam):
        return real(rew, val, next_val, torch.zeros_like(terminated), terminated | truncated, gamma, lam)

    monkeypatch.setattr(trpo, "gae", buggy)
    assert trpo_cartpole() < 475
