"""Bad input and faults on the gymnasium side: every config field is validated, a NaN from the env names the env,
training stops at the first non-finite number and never saves it, a policy refuses an env with other spaces, and
checkpoints load whole or not at all (issue 11)."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from _envs import register
from safetensors.torch import load_file, save_file

import minirl.algos.dqn as dqn
import minirl.algos.grpo as grpo
import minirl.algos.ppo as ppo
import minirl.algos.reinforce as reinforce
import minirl.algos.trpo as trpo
from minirl._validate import check_finite
from minirl.policies import Policy, spec_for
from minirl.rollout import evaluate

pytestmark = pytest.mark.usefixtures("one_thread")
register()  # the test envs of _envs.py

MODULES = {"ppo": ppo, "reinforce": reinforce, "trpo": trpo, "grpo": grpo, "dqn": dqn}
CONFIGS = {
    "ppo": ppo.PPOConfig,
    "reinforce": reinforce.REINFORCEConfig,
    "trpo": trpo.TRPOConfig,
    "grpo": grpo.GRPOConfig,
    "dqn": dqn.DQNConfig,
}
SMALL = {  # quick runs on the test envs (episodes of 10 steps)
    "ppo": dict(total_steps=64, num_envs=2, n_steps=16, minibatch_size=16, epochs=1),
    "reinforce": dict(total_steps=40, num_envs=2, n_steps=20),
    "trpo": dict(total_steps=64, num_envs=2, n_steps=32, minibatch_size=32, value_epochs=1, cg_iters=3),
    "grpo": dict(total_steps=40, group_size=2, n_groups=1),
    "dqn": dict(total_steps=60, learning_starts=20, batch_size=8, log_every=20, train_freq=4, gradient_steps=2),
}

# --- every field of every config, checked when training starts ---

BAD = [
    ("ppo", dict(n_steps=0), "n_steps must be > 0"),
    ("ppo", dict(minibatch_size=0), "minibatch_size must be > 0"),
    ("ppo", dict(epochs=0), "epochs must be > 0"),
    ("ppo", dict(max_grad_norm=-0.5), "max_grad_norm must be > 0"),
    ("ppo", dict(lr=0.0), "lr must be > 0"),
    ("ppo", dict(lr=float("inf")), "lr must be a finite number"),
    ("ppo", dict(total_steps=-1000), "total_steps must be > 0"),
    ("ppo", dict(total_steps=1.5), "total_steps must be an integer"),
    ("ppo", dict(gamma=1.5), r"gamma must be in \[0, 1\]"),
    ("ppo", dict(gamma=True), "gamma must be a number, got the bool"),
    ("ppo", dict(lam=-0.1), r"lam must be in \[0, 1\]"),
    ("ppo", dict(clip_low=0.0), "clip_low must be > 0"),
    ("ppo", dict(clip_low=1.5), r"clip_low must be in \(0, 1\)"),
    ("ppo", dict(clip_vf=0.0), "clip_vf must be > 0"),
    ("ppo", dict(target_kl=-0.01), "target_kl must be > 0"),
    ("ppo", dict(hidden=(0,)), "hidden must be a non-empty sequence of integers >= 1"),
    ("ppo", dict(hidden=()), "hidden must be a non-empty sequence"),
    ("ppo", dict(num_envs=0), "num_envs must be > 0"),
    ("ppo", dict(anneal_lr="yes"), "anneal_lr must be True or False"),
    ("ppo", dict(ent_coef=-0.1), "ent_coef must be >= 0"),
    ("ppo", dict(seed=-1), "seed must be >= 0"),
    ("reinforce", dict(returns="future"), "returns must be one of"),
    ("reinforce", dict(baseline="critic"), "baseline must be one of"),
    ("reinforce", dict(value_epochs=0), "value_epochs must be > 0"),
    ("reinforce", dict(value_lr=0.0), "value_lr must be > 0"),
    ("reinforce", dict(n_steps=0), "n_steps must be > 0"),
    ("reinforce", dict(gamma=np.True_), "gamma must be a number"),
    ("trpo", dict(delta=0.0), "delta must be > 0"),
    ("trpo", dict(cg_iters=0), "cg_iters must be > 0"),
    ("trpo", dict(backtrack_coef=1.0), r"backtrack_coef must be in \(0, 1\)"),
    ("trpo", dict(cg_damping=-1e-3), "cg_damping must be >= 0"),
    ("trpo", dict(value_lr=-1e-3), "value_lr must be > 0"),
    ("trpo", dict(minibatch_size=0), "minibatch_size must be > 0"),
    ("trpo", dict(lam=2.0), r"lam must be in \[0, 1\]"),
    ("grpo", dict(group_size=1), "group_size must be an int >= 2"),
    ("grpo", dict(max_episode_steps=0), "max_episode_steps must be > 0"),
    ("dqn", dict(batch_size=0), "batch_size must be > 0"),
    ("dqn", dict(eps_end=1.5), r"eps_end must be in \[0, 1\]"),
    ("dqn", dict(lr=0.0), "lr must be > 0"),
    ("dqn", dict(train_freq=0), "train_freq must be > 0"),
    ("dqn", dict(learning_starts=-1), "learning_starts must be >= 0"),
    ("dqn", dict(max_grad_norm=0.0), "max_grad_norm must be > 0"),
    ("dqn", dict(buffer_size=0), "buffer_size must be > 0"),
]


@pytest.mark.parametrize("algo, change, match", BAD, ids=[f"{a}-{next(iter(c))}" for a, c, _ in BAD])
def test_every_bad_config_value_is_refused_by_name(algo, change, match):
    cfg = CONFIGS[algo](**change)
    with pytest.raises((ValueError, TypeError), match=match):
        MODULES[algo].train(cfg)


@pytest.mark.parametrize("algo", list(MODULES))
def test_numpy_scalars_are_numbers(algo):
    fields = {"total_steps": np.int64(1000), "seed": np.int32(0), "hidden": (np.int64(8),)}
    fields["lr" if algo != "trpo" else "value_lr"] = np.float32(1e-3)
    if algo != "grpo":
        fields["gamma"] = np.float32(0.99)
    cfg = CONFIGS[algo](**fields)
    MODULES[algo].check_config(cfg)
    assert type(cfg.total_steps) is int and type(cfg.seed) is int and cfg.hidden == (8,)
    assert type(cfg.lr if algo != "trpo" else cfg.value_lr) is float


# --- bad numbers from the env ---


@pytest.mark.parametrize("algo", list(MODULES))
@pytest.mark.parametrize("env_id, what", [("minirl-test/NaNReward-v0", "reward"), ("minirl-test/NaNObs-v0", "obs")])
def test_a_nan_from_the_env_names_the_env(algo, env_id, what):
    cfg = CONFIGS[algo](env_id=env_id, **SMALL[algo])
    with pytest.raises(ValueError, match=f"{env_id} returned a non-finite {what}"):
        MODULES[algo].train(cfg)


def test_evaluate_names_the_env_of_a_nan():
    policy = Policy(spec_for(gym.make("minirl-test/NaNObs-v0")))
    with pytest.raises(ValueError, match="minirl-test/NaNObs-v0 returned a non-finite observation"):
        evaluate(policy, "minirl-test/NaNObs-v0", episodes=1)


# --- divergence: stop at the first non-finite number, save nothing ---


def nan_loss(monkeypatch, algo):
    """Make one loss of ``algo`` NaN, as a diverging run would."""
    nan = float("nan")
    if algo == "ppo":
        real = ppo.value_loss
        monkeypatch.setattr(ppo, "value_loss", lambda *a, **k: real(*a, **k) * nan)
    elif algo == "trpo":
        real = trpo.value_loss
        monkeypatch.setattr(trpo, "value_loss", lambda *a, **k: real(*a, **k) * nan)
    elif algo == "reinforce":
        real = reinforce.policy_gradient_loss
        monkeypatch.setattr(reinforce, "policy_gradient_loss", lambda *a, **k: real(*a, **k) * nan)
    elif algo == "grpo":
        real = grpo.aggregate
        monkeypatch.setattr(grpo, "aggregate", lambda *a, **k: real(*a, **k) * nan)
    else:
        real = dqn.td_target
        monkeypatch.setattr(dqn, "td_target", lambda *a, **k: real(*a, **k) * nan)


@pytest.mark.parametrize("algo", list(MODULES))
def test_a_non_finite_loss_stops_training_naming_the_step_and_causes(monkeypatch, algo):
    nan_loss(monkeypatch, algo)
    cfg = CONFIGS[algo](env_id="minirl-test/ThreeActions-v0", **SMALL[algo])
    with pytest.raises(FloatingPointError, match=r"is not finite \(NaN or inf\) at step \d+.*learning rate too high"):
        MODULES[algo].train(cfg)


def test_ppo_with_hand_grad_stops_at_a_non_finite_gradient(monkeypatch):
    real = ppo.value_loss_and_grad
    monkeypatch.setattr(ppo, "value_loss_and_grad", lambda *a, **k: [x * float("nan") for x in real(*a, **k)])
    cfg = ppo.PPOConfig(env_id="minirl-test/ThreeActions-v0", hand_grad=True, **SMALL["ppo"])
    with pytest.raises(FloatingPointError, match=r"grad_norm is not finite \(NaN or inf\) at step \d+"):
        ppo.train(cfg)


@pytest.mark.filterwarnings("error")  # a 0-d tensor that requires grad is read without torch's warning
def test_check_finite_reads_numbers_0d_and_nd_tensors():
    fine = {"a": 1.0, "b": torch.tensor(2.0, requires_grad=True), "c": torch.ones(3), "d": torch.tensor(3)}
    check_finite(0, "causes", **fine)
    for bad in (
        float("inf"),
        torch.tensor(float("nan")),
        torch.tensor(-math.inf, requires_grad=True),
        torch.tensor([1.0, math.nan]),
        torch.tensor([[math.inf]]),
    ):
        with pytest.raises(FloatingPointError, match="x is not finite .* at step 7.*causes"):
            check_finite(7, "causes", **fine, x=bad)


def test_a_policy_with_non_finite_weights_is_never_saved(tmp_path):
    policy = Policy(spec_for(gym.make("CartPole-v1")))
    with torch.no_grad():
        policy.actor[0].weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="not saving a policy with NaN or inf in actor.0.weight"):
        policy.save(tmp_path / "policy")
    assert not (tmp_path / "policy").exists()


# --- a policy and an env with other spaces ---


@pytest.mark.parametrize(
    "env_id, theirs",
    [
        ("minirl-test/ThreeActions-v0", "observations of size 4 and 3 discrete actions"),
        ("minirl-test/ObsSix-v0", "observations of size 6 and 2 discrete actions"),
        ("Pendulum-v1", "observations of size 3 and continuous actions of size 1"),
    ],
)
def test_evaluate_refuses_an_env_with_other_spaces_naming_both(env_id, theirs):
    policy = Policy(spec_for(gym.make("CartPole-v1")))
    ours = "observations of size 4 and 2 discrete actions"
    with pytest.raises(ValueError, match=f"built for {ours}, but {env_id} has {theirs}"):
        evaluate(policy, env_id, episodes=1)


def test_act_refuses_observations_of_another_size():
    policy = Policy(spec_for(gym.make("CartPole-v1")))
    with pytest.raises(ValueError, match=r"shape \(B, 4\), got \(3, 6\)"):
        policy.act(torch.zeros(3, 6))


# --- checkpoints: only into our own folders, whole or not at all ---


def test_save_refuses_a_folder_that_is_not_a_minirl_policy(tmp_path):
    policy = Policy(spec_for(gym.make("CartPole-v1")))
    for name, text in (("notes.txt", "mine"), ("config.json", '{"model": "someone else\'s"}')):
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        (folder / name).write_text(text)
        with pytest.raises(FileExistsError, match="not a minirl policy"):
            policy.save(folder)
        assert [p.name for p in folder.iterdir()] == [name] and (folder / name).read_text() == text
    policy.save(tmp_path / "policy")
    policy.save(tmp_path / "policy")  # our own folder is replaced
    assert json.loads((tmp_path / "policy" / "config.json").read_text())["policy"]["act_dim"] == 2


@pytest.mark.parametrize(
    "damage, match", [("drop", r"missing \['actor.0.weight'\]"), ("add", r"unexpected \['extra'\]")]
)
def test_load_refuses_missing_or_unexpected_tensors(tmp_path, damage, match):
    path = Policy(spec_for(gym.make("CartPole-v1"))).save(tmp_path / "policy")
    state = load_file(path / "model.safetensors")
    if damage == "drop":
        del state["actor.0.weight"]
    else:
        state["extra"] = torch.zeros(1)
    save_file(state, path / "model.safetensors")
    with pytest.raises(ValueError, match=match):
        Policy.load(path)


def test_load_recovers_a_save_killed_between_its_renames(tmp_path):
    policy = Policy(spec_for(gym.make("CartPole-v1")))
    path = policy.save(tmp_path / "policy")
    path.rename(tmp_path / ".policy.old")  # the state a kill right after the first rename leaves
    assert torch.equal(Policy.load(path).actor[0].weight, policy.actor[0].weight)


# --- smaller deviations (issue 11, item 15) ---


def test_ppo_ratio_is_exactly_one_before_the_first_step_with_obs_norm(monkeypatch):
    ratios = []
    real = ppo.ppo_clip_loss

    def spy(logp, old_logp, *args):
        ratios.append(torch.exp(logp - old_logp).detach())
        return real(logp, old_logp, *args)

    monkeypatch.setattr(ppo, "ppo_clip_loss", spy)
    ppo.train(ppo.PPOConfig(env_id="Pendulum-v1", total_steps=512, num_envs=2, n_steps=256, obs_norm=True))
    # the first minibatch of every update meets the policy that collected it (up to the rounding of another batch
    # shape): the statistics used to act are the ones the update sees. Acting with older statistics gave 0.97-1.03.
    first = ratios[0]
    assert (first - 1).abs().max() < 1e-5


def test_reinforce_logs_the_gaussian_entropy_summed_over_action_dimensions():
    cfg = reinforce.REINFORCEConfig(env_id="minirl-test/Box2-v0", **SMALL["reinforce"])
    result = reinforce.train(cfg)
    per_dim = 0.5 * math.log(2 * math.pi * math.e)  # a unit Gaussian's entropy; log_std starts at 0
    assert result.history["entropy"][0] == pytest.approx(2 * per_dim, rel=1e-5)
