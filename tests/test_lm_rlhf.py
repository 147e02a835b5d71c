"""PPO-RLHF for the LM: the token reward by hand, GAE over tokens against a loop, a smoke run, resume, bad input,
and learning with a sabotaged twin."""

import math

import pytest
import torch

from minirl.lm import build_tokenizer, make_model, rlhf, save
from minirl.lm import reward_model as rm

SIZES = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random tiny policy and a random tiny reward model, saved the way the trainer loads them."""
    tok = build_tokenizer()
    root = tmp_path_factory.mktemp("rlhf")
    save(make_model(tok, seed=0, **SIZES), tok, root / "policy")
    reward = rm.ScalarLM.from_lm(make_model(tok, seed=1, **SIZES))
    torch.nn.init.normal_(reward.head.weight, std=0.5, generator=torch.Generator().manual_seed(0))
    rm.save_scalar_lm(reward, tok, root / "rm")
    return str(root / "policy"), str(root / "rm")


def tiny_cfg(tiny, **kw) -> rlhf.RLHFConfig:
    base = dict(model=tiny[0], reward_model=tiny[1], steps=2, prompts_per_step=6, max_new_tokens=6, eval_every=0,
                device="cpu", minibatches=2, epochs=2)  # fmt: skip
    return rlhf.RLHFConfig(**{**base, **kw})


def test_token_rewards_by_hand():
    # two completions: row 0 ends with eos at t = 2, row 1 is cut by the budget (3 tokens, no eos)
    score = torch.tensor([1.5, -2.0])
    logp = torch.tensor([[-1.0, -0.5, -0.2, 0.0], [-0.3, -0.3, -0.3, -0.3]])
    ref_logp = torch.tensor([[-1.2, -0.5, -0.1, 0.0], [-0.3, -0.4, -0.2, -0.5]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool()
    ended = torch.tensor([True, False])
    beta = 0.1
    rew = rlhf.token_rewards(score, logp, ref_logp, mask, ended, beta)
    expected = torch.tensor([
        [-0.1 * 0.2, 0.0, -0.1 * -0.1 + 1.5, 0.0],  # -beta * (logp - ref_logp), the score on the eos, 0 after it
        [0.0, -0.1 * 0.1, -0.1 * -0.1, -0.1 * 0.2],  # truncated: the KL terms only, never the score
    ])  # fmt: skip
    assert torch.allclose(rew, expected, atol=1e-7)
    assert torch.equal(rlhf.token_rewards(score, logp, ref_logp, mask, ended, 0.0)[0], torch.tensor([0, 0, 1.5, 0]))


def loop_gae(rew, val, next_val, mask, ended, gamma, lam):
    """Per row, in floats: A_t = sum_l (gamma lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t, where V after
    the last token is 0 at an eos and the bootstrap next_val at a truncation (Schulman et al. 2016 Eq. 16)."""
    B, C = len(rew), len(rew[0])
    adv = [[0.0] * C for _ in range(B)]
    for i in range(B):
        n = sum(mask[i])
        for t in range(n):
            total = 0.0
            for k in range(t, n):
                v_next = val[i][k + 1] if k + 1 < n else (0.0 if ended[i] else next_val[i][k])
                delta = rew[i][k] + gamma * v_next - val[i][k]
                total += (gamma * lam) ** (k - t) * delta
            adv[i][t] = total
    return adv


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 1.0), (1.0, 0.0), (0.7, 0.5)])
def test_gae_over_tokens_matches_a_loop(gamma, lam):
    g = torch.Generator().manual_seed(0)
    B, C = 5, 7
    lengths = torch.tensor([7, 3, 1, 7, 5])
    ended = torch.tensor([True, True, True, False, True])  # row 3 used the whole budget without eos
    mask = torch.arange(C)[None, :] < lengths[:, None]  # (B, C)
    rew, v_all = torch.randn(B, C, generator=g, dtype=torch.float64), torch.randn(B, C + 1, generator=g,
                                                                                  dtype=torch.float64)  # fmt: skip
    val, next_val = v_all[:, :-1], v_all[:, 1:]  # V(s_t) and V(s_{t+1}) from one pass, as the trainer slices them
    adv, ret = rlhf.token_gae(rew, val, next_val, mask, ended, gamma, lam)
    ref = torch.tensor(loop_gae(rew.tolist(), val.tolist(), next_val.tolist(), mask.tolist(), ended.tolist(), gamma,
                                lam), dtype=torch.float64)  # fmt: skip
    assert torch.allclose(adv, ref, atol=1e-12)
    assert torch.allclose(ret[mask], (adv + val)[mask]) and (adv[~mask] == 0).all()


def test_truncation_bootstraps_and_eos_does_not():
    mask, rew = torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 2)
    val, next_val = torch.zeros(1, 2), torch.tensor([[0.0, 5.0]])  # V(s_C) = 5 after the last token
    cut, _ = rlhf.token_gae(rew, val, next_val, mask, torch.tensor([False]), 1.0, 1.0)
    done, _ = rlhf.token_gae(rew, val, next_val, mask, torch.tensor([True]), 1.0, 1.0)
    assert cut.tolist() == [[5.0, 5.0]] and done.tolist() == [[0.0, 0.0]]


def test_smoke_run_changes_both_trained_models_and_logs_finite_numbers(tiny, one_thread):
    result = rlhf.train(tiny_cfg(tiny, beta=0.1))
    start = rlhf.load(tiny[0], device="cpu")[0].state_dict()
    assert any(not torch.equal(start[k], v) for k, v in result.model.state_dict().items())
    reward = rm.load_scalar_lm(tiny[1], device="cpu")[0].state_dict()
    value = result.value_model.state_dict()
    assert any(not torch.equal(reward[k], value[k]) for k in reward)  # the critic trained, from the reward model
    assert len(result.history) == 2
    for key in ("score", "reward", "kl_ref", "accuracy", "length", "policy_loss", "value_loss", "clip_frac",
                "kl_old", "entropy", "explained_variance", "sample_s", "train_s"):  # fmt: skip
        assert key in result.history.rows[-1] and math.isfinite(result.history.rows[-1][key]), key
    assert result.history.rows[-1]["clip_frac"] >= 0


def test_resume_continues_with_identical_parameters(tiny, tmp_path, one_thread):
    straight = rlhf.train(tiny_cfg(tiny, steps=4, out=str(tmp_path / "a")))
    rlhf.train(tiny_cfg(tiny, steps=2, out=str(tmp_path / "b")))
    resumed = rlhf.train(tiny_cfg(tiny, steps=4, out=str(tmp_path / "b"), resume=True))
    for a, b in ((straight.model, resumed.model), (straight.value_model, resumed.value_model)):
        sa, sb = a.state_dict(), b.state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert straight.history["score"] == resumed.history["score"] and len(resumed.history) == 4
    assert (tmp_path / "b" / "checkpoint" / "value" / "model.safetensors").exists()
    with pytest.raises(ValueError, match="change the training math"):
        rlhf.train(tiny_cfg(tiny, steps=6, out=str(tmp_path / "b"), resume=True, beta=0.5))
    with pytest.raises(FileExistsError, match="already holds"):
        rlhf.train(tiny_cfg(tiny, out=str(tmp_path / "b")))


def test_bad_input_raises(tiny, tmp_path):
    tok = build_tokenizer()
    other = build_tokenizer()
    other.add_tokens(["<tool>"])
    rm.save_scalar_lm(rm.ScalarLM.from_lm(make_model(other, seed=0, **SIZES)), other, tmp_path / "rm_other")
    with pytest.raises(ValueError, match="reward model reads another vocabulary"):
        rlhf.train(tiny_cfg(tiny, reward_model=str(tmp_path / "rm_other")))
    small = rm.ScalarLM.from_lm(make_model(tok, seed=0, **SIZES))
    small.trunk.resize_token_embeddings(50)
    rm.save_scalar_lm(small, tok, tmp_path / "value_small")
    with pytest.raises(ValueError, match="value model embeds 50 tokens"):
        rlhf.train(tiny_cfg(tiny, value_model=str(tmp_path / "value_small")))
    with pytest.raises(ValueError, match="not a reward or value model"):
        rlhf.train(tiny_cfg(tiny, reward_model=tiny[0]))  # a policy checkpoint is not a reward model
    for kw, match in [
        (dict(reward_model=""), "reward_model is required"),
        (dict(lam=1.5), "lam"),
        (dict(minibatches=10), "minibatches"),
        (dict(beta=-0.1), "beta"),
        (dict(value_clip=float("nan")), "value_clip"),
        (dict(resume=True), "resume=True needs out"),
    ]:
        with pytest.raises(ValueError, match=match):
            rlhf.train(tiny_cfg(tiny, **kw))


def test_memory_table_counts_what_is_trained():
    tok = build_tokenizer()
    lm = make_model(tok, seed=0, **SIZES)
    n = sum(p.numel() for p in lm.parameters())
    table = rlhf.memory_table({"policy": lm, "reference": lm}, trained=("policy",), activations={"policy": 10})
    assert table["policy"] == {"params": 4 * n, "grads": 4 * n, "optimizer": 8 * n, "activations": 10,
                               "total": 16 * n + 10}  # fmt: skip
    assert table["reference"]["total"] == 4 * n and table["sum"]["total"] == 20 * n + 10
    ids = torch.ones(2, 5, dtype=torch.long)
    _, saved = rlhf.saved_activation_bytes(lambda: lm(input_ids=ids).logits.sum())
    with torch.no_grad():
        _, none = rlhf.saved_activation_bytes(lambda: lm(input_ids=ids).logits.sum())
    assert saved > 0 and none == 0  # inference keeps no activations for a backward pass


# The verifier's 0/1 score is on another scale than the reward model the critic starts from; value clipping (0.2 per
# update) held the critic back so long that the gain swung with the seed (+18, +18, +13, +4 points on seeds 0-3).
# Without it, measured on seeds 0-5 (500 held-out problems, from 34.2%): +14.0, +11.2, +19.8, +15.0, +8.6, +15.2 points;
# the misaligned twin below: -9.2, -2.6, -8.8 on seeds 0-2.
LEARN = dict(steps=20, eval_every=20, eval_n=500, beta=0.05, value_clip=None, device="cpu", seed=0, threads=1)
MARGIN = 0.05


def learning_run(monkeypatch=None, sabotage: bool = False) -> tuple[float, float]:
    """PPO with all four models from the course's checkpoints, the verifier's accuracy as the eos score (a learned
    reward model is a proxy that PPO exploits, see notebook 09); the critic starts from the committed reward model."""
    if sabotage:  # a realistic bug: the scores shifted by one row, so each completion is rewarded for its neighbour
        token_rewards = rlhf.token_rewards

        def misaligned(score, logp, ref_logp, mask, ended, beta):
            return token_rewards(score.roll(1), logp, ref_logp, mask, ended, beta)

        monkeypatch.setattr(rlhf, "token_rewards", misaligned)
    task = rlhf.get_task("addition")
    result = rlhf.train(rlhf.RLHFConfig(**LEARN), reward_fn=rlhf.rw.accuracy_reward(task))
    return result.evals[0]["heldout_accuracy"], result.evals[-1]["heldout_accuracy"]


@pytest.mark.learning
def test_ppo_raises_verified_heldout_accuracy():
    before, after = learning_run()
    assert after - before >= MARGIN, (before, after)


@pytest.mark.slow
def test_sabotaged_twin_misses(monkeypatch):
    before, after = learning_run(monkeypatch, sabotage=True)
    assert after - before < MARGIN, (before, after)
