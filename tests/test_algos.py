"""The gymnasium algorithms: smoke runs, determinism, and learning tests with sabotaged twins.

Learning tests (``-m learning``) run the budgets the issue names; each has a twin marked ``slow`` with a bug someone
could really write, which must miss the same threshold. Where a learning test cannot see a realistic bug, the twin
says so and names the unit test that does.
"""

import dataclasses

import gymnasium as gym
import pytest
import torch
from _helpers import flat_params

import minirl.algos.ppo as ppo
import minirl.algos.reinforce as reinforce
from minirl.algos.common import adam_step, clip_grad_norm, one_buffer
from minirl.policies import Policy, spec_for
from minirl.rollout import evaluate

PENDULUM = dict(
    env_id="Pendulum-v1",
    num_envs=4,
    n_steps=1024,
    minibatch_size=256,
    epochs=10,
    gamma=0.9,
    lam=0.95,
    obs_norm=True,
    anneal_clip=False,
)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "cfg",
    [
        ppo.PPOConfig(total_steps=512),
        ppo.PPOConfig(env_id="Pendulum-v1", total_steps=512, obs_norm=True, clip_vf=0.2, target_kl=0.01),
        reinforce.REINFORCEConfig(total_steps=2000, baseline="value"),
        reinforce.REINFORCEConfig(env_id="Pendulum-v1", n_steps=200, total_steps=800, baseline="mean", returns="total"),
    ],
    ids=["ppo-cartpole", "ppo-pendulum", "reinforce-cartpole", "reinforce-pendulum"],
)
def test_smoke_run_changes_parameters_and_logs(cfg):
    module = ppo if isinstance(cfg, ppo.PPOConfig) else reinforce
    result = module.train(cfg)
    assert len(result.history) >= 1
    assert result.history["step"][-1] <= cfg.total_steps
    for key in ("return_mean", "pg_loss", "entropy", "rollout_s", "update_s"):
        assert key in result.history.keys()
    torch.manual_seed(cfg.seed)
    untrained = Policy(result.policy.spec)  # the same seed and spec give the initial parameters
    for name, value in result.policy.named_parameters():
        assert not torch.equal(value, dict(untrained.named_parameters())[name]), f"{name} did not change"


@pytest.mark.parametrize("module", [ppo, reinforce])
def test_same_seed_same_run(module):
    cls = ppo.PPOConfig if module is ppo else reinforce.REINFORCEConfig
    cfg = cls(total_steps=1024 if module is ppo else 2000)
    a, b = module.train(cfg), module.train(cfg)
    assert torch.equal(flat_params(a.policy), flat_params(b.policy))
    assert a.history.rows == [
        {**row, "rollout_s": r2["rollout_s"], "update_s": r2["update_s"]}
        for row, r2 in zip(b.history.rows, a.history.rows)
    ]
    c = module.train(dataclasses.replace(cfg, seed=1))
    assert not torch.equal(flat_params(a.policy), flat_params(c.policy))


def test_async_envs_give_the_same_run_as_sync():
    cfg = ppo.PPOConfig(total_steps=1024, num_envs=4)
    sync = ppo.train(cfg)
    asynchronous = ppo.train(dataclasses.replace(cfg, async_envs=True))
    assert torch.equal(flat_params(sync.policy), flat_params(asynchronous.policy))


@pytest.mark.parametrize("target_kl, epochs_run", [(None, 5), (1e-9, 1)])
def test_target_kl_stops_the_epochs(monkeypatch, target_kl, epochs_run):
    """4 minibatches per epoch, 5 epochs: every epoch runs without target_kl; with a tiny one the first epoch's KL
    (its later minibatches have moved) already passes it, and the update stops there."""
    steps = []
    monkeypatch.setattr(ppo, "adam_step", lambda optimizer: steps.append(1) or adam_step(optimizer))
    cfg = ppo.PPOConfig(total_steps=512, num_envs=2, n_steps=128, minibatch_size=64, epochs=5, target_kl=target_kl)
    ppo.train(cfg)
    assert len(steps) == 2 * 4 * epochs_run  # 2 updates of 256 transitions


def test_bad_config_names_the_problem():
    with pytest.raises(ValueError, match="baseline must be one of"):
        reinforce.train(reinforce.REINFORCEConfig(baseline="critic"))
    with pytest.raises(RuntimeError, match="raise n_steps"):
        reinforce.train(reinforce.REINFORCEConfig(n_steps=5, total_steps=10))
    with pytest.raises(ValueError, match="clip_low"):
        ppo.train(ppo.PPOConfig(total_steps=256, clip_low=1.5, anneal_clip=False))


@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 1e6])  # clipped hard, clipped a little, untouched
def test_clip_grad_norm_matches_torchs(max_norm):
    torch.manual_seed(0)
    nets = [Policy(spec_for(gym.make("CartPole-v1"))) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    obs = torch.randn(32, 4)
    for net in nets:
        (net.distribution(obs).logits.pow(2).sum() + net.value(obs).sum()).backward()
    ours = clip_grad_norm(list(nets[0].parameters()), max_norm)
    theirs = torch.nn.utils.clip_grad_norm_(nets[1].parameters(), max_norm)
    torch.testing.assert_close(ours, theirs)
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    assert ours > 1e-2  # the gradients were not all zero, so the clipping was exercised


def test_one_buffer_gives_the_plain_paths_updates(tmp_path):
    """Adam and the clip on one flat tensor move every weight as they do on the separate parameters."""
    torch.manual_seed(0)
    nets = [Policy(spec_for(gym.make("CartPole-v1"))) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    batches = [torch.randn(64, 4) * 2 for _ in range(5)]

    def loss(net, obs):
        return net.distribution(obs).logits.pow(2).sum() + net.value(obs).pow(2).sum()

    params = list(nets[0].parameters())
    start = [p.detach().clone() for p in params]
    plain = torch.optim.Adam(params, lr=1e-2, eps=1e-5)
    norms = []
    for obs in batches:
        plain.zero_grad()
        loss(nets[0], obs).backward()
        norms.append(clip_grad_norm(params, 0.5))
        plain.step()

    with one_buffer(nets[1]) as flat:
        assert flat.shape == (sum(p.numel() for p in params),)
        adam = torch.optim.Adam([flat], lr=1e-2, eps=1e-5, fused=True)
        for obs, norm in zip(batches, norms):
            flat.grad.zero_()
            loss(nets[1], obs).backward()
            torch.testing.assert_close(clip_grad_norm([flat], 0.5), norm)
            adam.step()
        assert all(p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for p in nets[1].parameters())
    assert max(norms) > 0.5  # the clip was active
    for a, b, a0 in zip(nets[0].parameters(), nets[1].parameters(), start, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        assert (b - a0).abs().max() > 1e-3  # every tensor moved: backward filled the gradient views
    # after the block each parameter owns its memory again: saving (safetensors refuses shared memory) works
    storages = {p.untyped_storage().data_ptr() for p in nets[1].parameters()}
    assert len(storages) == len(params) and all(p.grad is None for p in nets[1].parameters())
    nets[1].save(tmp_path / "policy")


@pytest.mark.parametrize(
    "options", [{"fused": True}, {"fused": False}, {"weight_decay": 0.1}, {"amsgrad": True}, {"two_tensors": True}]
)
def test_adam_step_is_optimizer_step(options):
    """The same weights and state, bit for bit, as ``optimizer.step()``, with the learning rate changed between
    steps as the annealing does; an Adam it cannot run functionally (amsgrad, two tensors) takes its own step."""
    options = dict(options)
    two = options.pop("two_tensors", False)
    torch.manual_seed(0)
    weights = [[torch.randn(300, requires_grad=True)] for _ in range(2)]
    if two:
        weights = [[w[0], torch.randn(5, requires_grad=True)] for w in weights]
    weights[1] = [w.detach().clone().requires_grad_() for w in weights[0]]
    opts = [torch.optim.Adam(w, lr=1e-2, eps=1e-5, **options) for w in weights]
    for k in range(6):
        grads = [torch.randn_like(w) * 10.0**-k for w in weights[0]]  # shrinking gradients: Adam's state matters
        for ws, opt, step in zip(weights, opts, (lambda o: o.step(), adam_step), strict=True):
            for w, g in zip(ws, grads, strict=True):
                w.grad = g.clone()
            opt.param_groups[0]["lr"] = 1e-2 * (1 - k / 6)
            step(opt)
    for a, b in zip(weights[0], weights[1], strict=True):
        assert torch.equal(a, b) and not torch.equal(a, a.detach() * 0)
        for key, value in opts[0].state[a].items():
            assert torch.equal(opts[1].state[b][key], value), key


def test_saved_result_reloads_with_its_config(tmp_path):
    result = ppo.train(ppo.PPOConfig(total_steps=512, obs_norm=True))
    path = result.save(tmp_path / "policy")
    loaded = Policy.load(path)
    assert torch.equal(flat_params(loaded), flat_params(result.policy))
    assert evaluate(loaded, "CartPole-v1", episodes=2) == evaluate(result.policy, "CartPole-v1", episodes=2)


# --- learning tests and their sabotaged twins ---


def termination_as_truncation(monkeypatch):
    """Sabotage: every episode end is treated as a time limit (``truncated`` where ``terminated`` belongs), so GAE
    bootstraps from V(final observation) where the pole fell: falling looks like any other step."""
    real = ppo.gae

    def buggy(rew, val, next_val, terminated, truncated, gamma, lam):
        return real(rew, val, next_val, torch.zeros_like(terminated), terminated | truncated, gamma, lam)

    monkeypatch.setattr(ppo, "gae", buggy)


def old_logp_after_the_update(monkeypatch):
    """Sabotage: the old log-probs are computed by the policy being updated (after each step, not stored when the
    batch was collected), so the ratio is always 1, nothing is ever clipped, and every epoch steps unconstrained."""
    real = ppo.ppo_clip_loss
    monkeypatch.setattr(ppo, "ppo_clip_loss", lambda logp, old_logp, *a: real(logp, logp.detach(), *a))


def forward_returns(monkeypatch):
    """Sabotage: reward-to-go accumulated forwards in time (a cumulative sum that forgot to run backwards), so G_t
    sums the rewards *before* step t, which the action at t cannot change."""

    def buggy(rew, done, gamma, reward_to_go=True):
        ret, running = torch.zeros_like(rew), torch.zeros_like(rew[0])
        for t in range(rew.shape[0]):  # forwards: the bug
            running = rew[t] + gamma * running
            ret[t] = running
            running = running * (~done[t])  # episode ends are still respected
        return ret

    monkeypatch.setattr(reinforce, "discounted_returns", buggy)


def ppo_cartpole():
    result = ppo.train(ppo.PPOConfig(total_steps=100_000, seed=0))
    score = evaluate(result.policy, "CartPole-v1", episodes=20, seed=1000)[0]
    print(f"PPO CartPole-v1, 100k steps, seed 0: evaluation {score:.1f}")
    return score


def reinforce_cartpole():
    result = reinforce.train(reinforce.REINFORCEConfig(total_steps=100_000, seed=0, baseline="value"))
    score = evaluate(result.policy, "CartPole-v1", episodes=20, seed=1000)[0]
    print(f"REINFORCE (learned baseline) CartPole-v1, 100k steps, seed 0: evaluation {score:.1f}")
    return score


def ppo_pendulum_gain():
    cfg = ppo.PPOConfig(total_steps=100_000, seed=0, **PENDULUM)
    torch.manual_seed(cfg.seed)
    untrained = Policy(spec_for(gym.make("Pendulum-v1"), obs_norm=True))
    before = evaluate(untrained, "Pendulum-v1", episodes=20, seed=1000)[0]
    after = evaluate(ppo.train(cfg).policy, "Pendulum-v1", episodes=20, seed=1000)[0]
    print(f"PPO Pendulum-v1, 100k steps, seed 0: untrained {before:.1f}, trained {after:.1f}")
    return after - before


@pytest.mark.learning
def test_ppo_solves_cartpole_in_100k_steps():
    assert ppo_cartpole() >= 475


@pytest.mark.learning
def test_ppo_with_hand_grad_solves_cartpole_in_100k_steps():
    result = ppo.train(ppo.PPOConfig(total_steps=100_000, seed=0, hand_grad=True))
    score = evaluate(result.policy, "CartPole-v1", episodes=20, seed=1000)[0]
    print(f"PPO (hand_grad) CartPole-v1, 100k steps, seed 0: evaluation {score:.1f}")
    assert score >= 475


@pytest.mark.learning
def test_reinforce_with_learned_baseline_clearly_beats_random():
    assert reinforce_cartpole() >= 150  # random play scores about 22


@pytest.mark.learning
def test_ppo_gaussian_improves_pendulum():
    assert ppo_pendulum_gain() >= 400


@pytest.mark.slow
def test_sabotaged_ppo_misses_cartpole(monkeypatch):
    """The reverse bug, truncation treated as termination, still scores 500 on CartPole (the time limit is where
    the task is solved); tests/test_returns.py::test_gae_truncation_bootstraps_and_termination_does_not catches it."""
    termination_as_truncation(monkeypatch)
    assert ppo_cartpole() < 475


@pytest.mark.slow
def test_sabotaged_reinforce_misses_cartpole(monkeypatch):
    forward_returns(monkeypatch)
    assert reinforce_cartpole() < 150


@pytest.mark.slow
def test_sabotaged_ppo_misses_pendulum(monkeypatch):
    """The other realistic bug on Pendulum, which only ever truncates, is truncation treated as termination (no
    bootstrap at the time limit). This learning test cannot see it: with that bug, seed 0 still gains 481 (against
    939 for the correct code), above the threshold of 400, since gamma = 0.9 makes only the last steps before the
    limit wrong. tests/test_returns.py::test_gae_truncation_bootstraps_and_termination_does_not and
    tests/test_rollout.py::test_no_transition_crosses_an_episode_boundary catch it."""
    old_logp_after_the_update(monkeypatch)
    assert ppo_pendulum_gain() < 400


@pytest.mark.parametrize("discrete", [True, False])
def test_an_update_on_the_whole_batch_is_one_on_a_permutation_of_it(monkeypatch, discrete):
    """With one minibatch per epoch, ``ppo.update`` takes the batch unshuffled: the same steps and logs as a shuffled
    batch, up to the order of the sums."""
    env = gym.make("CartPole-v1" if discrete else "Pendulum-v1")
    torch.manual_seed(0)
    nets = [Policy(spec_for(env)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    start = flat_params(nets[0])
    n = 96
    obs = torch.randn(n, nets[0].spec.obs_dim)
    with torch.no_grad():
        dist = nets[0].distribution(obs)
        act = dist.sample()
        logp = nets[0].log_prob(dist, act) + 0.05 * torch.randn(n)  # the old policy differs: ratios leave 1
    b = {"obs": obs, "act": act, "logp": logp, "adv": torch.randn(n), "ret": torch.randn(n), "val": torch.randn(n)}
    cfg = ppo.PPOConfig(epochs=4, minibatch_size=n, lr=3e-2, vf_coef=1.0)
    assert ppo.minibatches(n, n) == [slice(None)]

    logs = []
    for net, shuffled in zip(nets, (False, True), strict=True):
        if shuffled:  # the general path: one permuted minibatch of every transition per epoch
            monkeypatch.setattr(ppo, "minibatches", lambda size, _: [torch.randperm(size)])
        with one_buffer(net) as flat:
            adam = torch.optim.Adam([flat], lr=cfg.lr, eps=1e-5, fused=True)
            logs.append({k: v.item() for k, v in ppo.update(net, flat, adam, b, cfg, (0.2, None), 0).items()})
    for a, c in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)
    assert logs[0].keys() == logs[1].keys() >= {"pg_loss", "v_loss", "entropy", "grad_norm", "approx_kl", "clip_frac"}
    for key in logs[0]:
        assert logs[0][key] == pytest.approx(logs[1][key], rel=1e-4, abs=1e-6), key
    assert logs[0]["clip_frac"] > 0 and logs[0]["grad_norm"] > 0.5  # the clips were active
    assert (flat_params(nets[0]) - start).abs().max() > 1e-2  # the update moved the weights


@pytest.mark.parametrize(
    "options",
    [{}, {"ent_coef": 0.01, "clip_vf": 0.2}, {"norm_adv": False, "clip_high": 0.28}, {"minibatch_size": 32}],
    ids=["zoo", "entropy-and-value-clip", "raw-advantages-clip-higher", "four-minibatches"],
)
def test_hand_grad_gives_autograds_update(options):
    """``hand_grad=True`` writes out the chain rule of the loss that ``autograd_backward`` differentiates: the same
    gradient norms, logs and weights after four epochs, with both clips active."""
    env = gym.make("CartPole-v1")
    torch.manual_seed(0)
    # in float64, where the two paths' different rounding (the sums' order, NumPy's tanh) stays far below the checks
    nets = [Policy(spec_for(env)).double() for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    start = flat_params(nets[0])
    n = 128
    obs = torch.randn(n, 4, dtype=torch.float64) * 2
    with torch.no_grad():
        dist = nets[0].distribution(obs)
        act = dist.sample()
        logp = nets[0].log_prob(dist, act) + 0.05 * torch.randn(n)  # the old policy differs: ratios leave 1
        val = nets[0].value(obs) + 0.3 * torch.randn(n)
    adv, ret = torch.randn(n, dtype=torch.float64), 3 * torch.randn(n, dtype=torch.float64)
    b = {"obs": obs, "act": act, "logp": logp, "adv": adv, "ret": ret, "val": val}
    logs = []
    for net, hand in zip(nets, (False, True), strict=True):
        cfg = ppo.PPOConfig(**{"epochs": 4, "minibatch_size": n, "lr": 3e-2, "hand_grad": hand, **options})
        torch.manual_seed(1)  # the same minibatch permutations
        with one_buffer(net) as flat:
            adam = torch.optim.Adam([flat], lr=cfg.lr, eps=1e-5, fused=True)
            logs.append({k: v.item() for k, v in ppo.update(net, flat, adam, b, cfg, (0.2, cfg.clip_high), 0).items()})
    for a, c in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        torch.testing.assert_close(c, a, rtol=1e-9, atol=1e-10)
    assert logs[0].keys() == logs[1].keys()
    for key in logs[0]:
        assert logs[1][key] == pytest.approx(logs[0][key], rel=1e-9, abs=1e-12), key
    assert logs[0]["clip_frac"] > 0 and logs[0]["grad_norm"] > 0.5  # the clips were active
    assert (flat_params(nets[0]) - start).abs().max() > 1e-2  # the update moved the weights


def test_hand_grad_refuses_continuous_actions():
    with pytest.raises(ValueError, match="continuous actions; use hand_grad=False"):
        ppo.train(ppo.PPOConfig(env_id="Pendulum-v1", total_steps=512, hand_grad=True))
    policy = Policy(spec_for(gym.make("Pendulum-v1")))  # an update called directly is refused too
    b = {key: torch.zeros(8) for key in ("logp", "adv", "ret", "val")}
    b |= {"obs": torch.zeros(8, 3), "act": torch.zeros(8, 1)}
    with one_buffer(policy) as flat, pytest.raises(ValueError, match="continuous actions; use hand_grad=False"):
        adam = torch.optim.Adam([flat])
        ppo.update(policy, flat, adam, b, ppo.PPOConfig(env_id="Pendulum-v1", hand_grad=True), (0.2, None), 0)


def test_minibatches_cover_the_batch_once_per_epoch():
    torch.manual_seed(0)
    pieces = ppo.minibatches(10, 4)
    assert [len(p) for p in pieces] == [4, 4, 2]
    assert sorted(torch.cat(pieces).tolist()) == list(range(10))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_an_update_logs_the_entropy_of_the_policy_it_stepped_from(env_id):
    """One epoch of one minibatch: the logged entropy is the mean entropy of the policy before its step."""
    torch.manual_seed(0)
    net = Policy(spec_for(gym.make(env_id)))
    with torch.no_grad():
        net.actor[-1].weight.mul_(100)  # far from uniform: every state's entropy differs
    n = 64
    obs = torch.randn(n, net.spec.obs_dim) * 3
    with torch.no_grad():
        out = net.actor(obs)  # read through torch's own distributions
        if net.spec.discrete:
            expected = torch.distributions.Categorical(logits=out).entropy().mean()
        else:
            expected = torch.distributions.Normal(out, net.log_std.exp()).entropy().sum(-1).mean()
        dist = net.distribution(obs)
        act = dist.sample()
        logp = net.log_prob(dist, act)
    b = {"obs": obs, "act": act, "logp": logp, "adv": torch.randn(n), "ret": torch.randn(n), "val": torch.randn(n)}
    cfg = ppo.PPOConfig(epochs=1, minibatch_size=n, lr=1e-1)
    with one_buffer(net) as flat:
        adam = torch.optim.Adam([flat], lr=cfg.lr, eps=1e-5)
        logged = ppo.update(net, flat, adam, b, cfg, (0.2, None), 0)
    assert logged["entropy"].item() == pytest.approx(expected.item(), rel=1e-5)
