"""The LM GRPO trainer: its loss against a loop-based reference, a smoke run, resume, bad input, and learning."""

import math

import pytest
import torch

from minirl.lm import PRETRAINED, build_tokenizer, grpo, make_model, runs, save
from minirl.losses import LOSS_AGGS

SIZES = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random tiny model saved as a checkpoint folder, the way the trainer loads its start."""
    tok = build_tokenizer()
    path = tmp_path_factory.mktemp("tiny") / "model"
    save(make_model(tok, seed=0, **SIZES), tok, path)
    return str(path)


def tiny_cfg(tiny, **kw) -> grpo.GRPOConfig:
    base = dict(model=tiny, steps=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0, device="cpu")
    return grpo.GRPOConfig(**{**base, **kw})


def length_reward(prompts, completions, answers):
    """A reward with spread even for a random model: longer completions score higher."""
    return [float(len(c)) for c in completions]


def reference_loss(logp, old_logp, adv, mask, ref_logp, beta, clip_low, clip_high, loss_agg, max_len):
    """Shao et al. 2024 Eq. 3 (negated), written as the paper's nested sums over completions and tokens, in floats."""
    clip_high = clip_low if clip_high is None else clip_high
    B, C = len(logp), len(logp[0])
    per_row, all_tokens = [], []
    for i in range(B):
        terms = []
        for t in range(C):
            if not mask[i][t]:
                continue
            ratio = math.exp(logp[i][t] - old_logp[i][t])
            clipped = min(max(ratio, 1 - clip_low), 1 + clip_high)
            term = -min(ratio * adv[i], clipped * adv[i])
            if beta > 0:
                log_r = ref_logp[i][t] - logp[i][t]
                term += beta * (math.exp(log_r) - 1 - log_r)
            terms.append(term)
        per_row.append(terms)
        all_tokens += terms
    if loss_agg == "seq-mean-token-mean":
        return sum(sum(terms) / len(terms) for terms in per_row) / B
    if loss_agg == "token-mean":
        return sum(all_tokens) / len(all_tokens)
    if loss_agg == "seq-mean-token-sum":
        return sum(sum(terms) for terms in per_row) / B
    return sum(all_tokens) / (B * max_len)


@pytest.mark.parametrize("loss_agg", LOSS_AGGS)
@pytest.mark.parametrize("beta, clip_high", [(0.0, None), (0.1, 0.28)])
def test_loss_matches_the_loop_reference(loss_agg, beta, clip_high):
    gen = torch.Generator().manual_seed(0)
    B, C = 6, 7
    old_logp = -torch.rand(B, C, generator=gen) * 3  # (B, C)
    logp = (old_logp + 0.4 * torch.randn(B, C, generator=gen)).requires_grad_()  # ratios on both sides of the clip
    ref_logp = old_logp + 0.3 * torch.randn(B, C, generator=gen)
    adv = torch.randn(B, generator=gen)
    lengths = torch.tensor([1, 7, 3, 5, 2, 7])  # a row holding only its eos, and full rows
    mask = torch.arange(C)[None, :] < lengths[:, None]  # (B, C)
    got = grpo.grpo_loss(logp, old_logp, adv, mask, ref_logp, beta, 0.2, clip_high, loss_agg, max_len=10)
    want = reference_loss(
        logp.tolist(), old_logp.tolist(), adv.tolist(), mask.tolist(), ref_logp.tolist(), beta, 0.2, clip_high,
        loss_agg, 10,
    )  # fmt: skip
    assert got.item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    got.backward()
    assert logp.grad[~mask].abs().max() == 0 and logp.grad[mask].abs().max() > 0  # padding gets no gradient


@pytest.mark.parametrize("loss_agg", LOSS_AGGS)
def test_rows_without_advantage_can_be_skipped(loss_agg):
    """With beta = 0, the loss of the rows with A_i != 0, times their share of the denominator, is the loss of all."""
    gen = torch.Generator().manual_seed(1)
    B, C = 8, 6
    old_logp = -torch.rand(B, C, generator=gen) * 3
    logp = (old_logp + 0.3 * torch.randn(B, C, generator=gen)).requires_grad_()
    adv = torch.tensor([0.0, 1.2, -0.4, 0.0, 0.0, 0.7, -1.5, 0.0])  # (B,) half the rows carry no signal
    mask = torch.arange(C)[None, :] < torch.tensor([6, 2, 5, 1, 3, 6, 4, 2])[:, None]  # (B, C)
    full = grpo.grpo_loss(logp, old_logp, adv, mask, loss_agg=loss_agg, max_len=9)
    (g_full,) = torch.autograd.grad(full, logp)
    live = adv != 0
    share = grpo.denominator_share(mask, live, loss_agg)
    part = share * grpo.grpo_loss(logp[live], old_logp[live], adv[live], mask[live], loss_agg=loss_agg, max_len=9)
    (g_part,) = torch.autograd.grad(part, logp)
    assert part.item() == pytest.approx(full.item(), rel=1e-6, abs=1e-9)
    assert torch.allclose(g_part, g_full, atol=1e-7) and g_full[~live].abs().max() == 0


def test_skipping_silent_rows_gives_the_update_of_the_full_batch(tiny):
    """One step with beta = 0 (rows with A_i = 0 skipped) equals one step with beta > 0 (every row computed): at the
    first step the policy is the reference, so k3 and its gradient are exactly 0."""

    def half_silent(prompts, completions, answers):  # all-equal rewards for even answers, a spread for odd ones
        return [0.0 if int(a) % 2 == 0 else float(len(c)) for c, a in zip(completions, answers)]

    kw = dict(steps=1, prompts_per_step=6, accuracy_weight=0.0, loss_agg="token-mean")  # its loss is not ~0 at ratio 1
    runs = [grpo.train(tiny_cfg(tiny, beta=beta, **kw), reward_fn=half_silent) for beta in (0.0, 0.5)]
    skipped, computed = (r.history.rows[-1] for r in runs)
    assert 0 < skipped["zero_var_groups"] < 1 and skipped["rows_computed"] < skipped["rows_trained"] == 24
    assert computed["rows_computed"] == 24
    assert abs(computed["loss"]) > 1e-3 and skipped["loss"] == pytest.approx(computed["loss"], rel=1e-5)
    for a, b in zip(runs[0].model.parameters(), runs[1].model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_the_loss_reads_zero_but_its_gradient_is_the_policy_gradient():
    """One iteration: ratio = 1, advantages zero-mean per group, so the loss is ~0; its gradient is -A_i / |o_i|."""
    gen = torch.Generator().manual_seed(1)
    old_logp = -torch.rand(4, 5, generator=gen)
    logp = old_logp.clone().requires_grad_()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])  # two groups of 2, each zero-mean
    mask = torch.ones(4, 5, dtype=torch.bool)
    loss = grpo.grpo_loss(logp, old_logp, adv, mask)
    loss.backward()
    assert abs(loss.item()) < 1e-7
    assert torch.allclose(logp.grad, -adv[:, None].expand(4, 5) / (4 * 5))  # 1/B * 1/|o_i| * -A_i per token


def test_smoke_run_changes_the_parameters_and_logs_everything(tiny):
    before = {k: v.clone() for k, v in grpo.load(tiny, device="cpu")[0].state_dict().items()}
    seen = []
    cfg = tiny_cfg(tiny, accuracy_weight=0.0, iterations=2, beta=0.1)
    result = grpo.train(cfg, reward_fn=length_reward, on_batch=lambda *batch: seen.append(batch))
    after = result.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert len(result.history) == 2 and result.tokenizer is not None
    row = result.history.rows[-1]
    for key in ("reward", "reward_accuracy", "reward_format", "reward_user", "accuracy", "format_rate", "length",
                "kl_ref", "clip_frac", "entropy", "zero_var_groups", "sample_s", "train_s"):  # fmt: skip
        assert key in row and math.isfinite(row[key]), key
    assert row["kl_ref"] >= 0 and row["reward_accuracy"] == 0.0 and row["reward"] == row["reward_user"]
    assert math.isnan(row["length_correct"]) and row["length_wrong"] == row["length"]  # a random model: all wrong
    assert [b[0] for b in seen] == [1, 2]  # on_batch sees each step's prompts, completions and rewards
    step, prompts, completions, rewards = seen[-1]
    assert len(prompts) == len(completions) == 8 and rewards["reward"].tolist() == length_reward(0, completions, 0)


def test_resume_continues_with_identical_parameters(tiny, tmp_path):
    kw = dict(accuracy_weight=0.0, steps=4, seed=3)
    straight = grpo.train(tiny_cfg(tiny, out=str(tmp_path / "a"), **kw), reward_fn=length_reward)
    grpo.train(tiny_cfg(tiny, out=str(tmp_path / "b"), **{**kw, "steps": 2}), reward_fn=length_reward)
    calls = []

    def counted(prompts, completions, answers):
        calls.append(1)
        return length_reward(prompts, completions, answers)

    resumed = grpo.train(tiny_cfg(tiny, out=str(tmp_path / "b"), resume=True, **kw), reward_fn=counted)
    assert len(calls) == 2  # it ran steps 3 and 4 only: the first two came from the checkpoint
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert straight.history["reward"] == resumed.history["reward"] and len(resumed.history) == 4
    assert (tmp_path / "b" / "checkpoint" / "model" / "model.safetensors").exists()
    assert (tmp_path / "b" / "checkpoint" / "trainer.json").exists() and not list(tmp_path.rglob("*.pt"))
    c = grpo.train(tiny_cfg(tiny, **kw), reward_fn=length_reward).model.state_dict()  # the same without saving
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_a_failed_save_leaves_the_previous_checkpoint(tiny, tmp_path, monkeypatch):
    out = tmp_path / "run"
    grpo.train(tiny_cfg(tiny, out=str(out), accuracy_weight=0.0), reward_fn=length_reward)

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(runs, "save_file", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        grpo.train(tiny_cfg(tiny, out=str(out), resume=True, steps=3, accuracy_weight=0.0), reward_fn=length_reward)
    monkeypatch.undo()
    assert runs.load_run(out).step == 2


def test_dropping_and_masking_leave_nothing_to_train_on(tiny):
    """A random model never answers right: every group has equal rewards (all 0), so dropping them skips the update.
    With a 2-token budget every completion is truncated, so masking truncated ones skips it too."""
    start = grpo.load(tiny, device="cpu")[0].state_dict()
    for kw in (dict(drop_zero_variance=True), dict(mask_truncated=True, max_new_tokens=2)):
        result = grpo.train(tiny_cfg(tiny, **kw))
        assert result.history["rows_trained"] == [0.0, 0.0] and math.isnan(result.history["loss"][-1])
        assert result.history["zero_var_groups"][-1] == 1.0 or kw.get("mask_truncated")
        assert all(torch.equal(v, result.model.state_dict()[k]) for k, v in start.items())


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(group_size=1), "group of one"),
        (dict(loss_agg="mean"), "loss_agg must be one of"),
        (dict(scale="std"), "scale must be one of"),
        (dict(beta=-0.1), "beta must be >= 0"),
        (dict(steps=0), "steps must be > 0"),
        (dict(resume=True), "resume=True needs out"),
    ],
)
def test_bad_config_raises(tiny, kw, message):
    with pytest.raises(ValueError, match=message):
        grpo.train(tiny_cfg(tiny, **kw))


@pytest.mark.parametrize(
    "reward_fn, message",
    [(lambda p, c, a: [float("nan")] * len(c), "NaN or inf"), (lambda p, c, a: [0.0], "one number per completion")],
)
def test_bad_user_reward_raises(tiny, reward_fn, message):
    with pytest.raises(ValueError, match=message):
        grpo.train(tiny_cfg(tiny), reward_fn=reward_fn)


def test_an_empty_completion_is_one_eos_token_with_reward_zero(tiny):
    """A completion that is eos at once has mask [True] (the eos) and text "": it scores 0 and trains like any other."""
    gen = torch.Generator().manual_seed(0)
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[True, False, False], [True, True, True]])  # row 0: the empty completion
    loss = grpo.grpo_loss(logp, logp.detach() - 0.1 * torch.rand(2, 3, generator=gen), torch.tensor([1.0, -1.0]), mask)
    assert torch.isfinite(loss)
    parts = grpo.reward_parts(grpo.GRPOConfig(format_weight=0.5), grpo.get_task("addition"), None)
    total, _ = grpo.rw.score(parts, ["1+1="], [""], ["2"])
    assert total.tolist() == [0.0]


def test_cli_options_come_from_the_config():
    from minirl._options import config_from
    from minirl.cli import build_parser

    args = build_parser().parse_args(["lm", "grpo", "--group-size", "4", "--clip-high", "none", "--mask-truncated"])
    cfg = config_from(args, grpo.GRPOConfig)
    assert args.func.__name__ == "run_grpo"
    assert cfg.group_size == 4 and cfg.clip_high is None and cfg.mask_truncated and cfg.loss_agg == LOSS_AGGS[1]


# --- learning: from the committed checkpoint, held-out accuracy must rise ---

LEARN = dict(model=str(PRETRAINED), steps=40, eval_every=40, eval_n=200, seed=0, threads=2)
MARGIN = 0.15  # held-out greedy accuracy (200 problems) must gain 15 points in 40 steps (measured: +28, seed 0)


def learning_run(monkeypatch=None, sabotage=False):
    if sabotage:
        flip = grpo.group_advantages
        monkeypatch.setattr(grpo, "group_advantages", lambda *a, **kw: -flip(*a, **kw))
    result = grpo.train(grpo.GRPOConfig(**LEARN))
    return result.evals[0]["heldout_accuracy"], result.evals[-1]["heldout_accuracy"]


@pytest.mark.learning
def test_grpo_raises_heldout_accuracy():
    before, after = learning_run()
    assert after - before >= MARGIN, (before, after)


@pytest.mark.slow
def test_sabotaged_twin_misses(monkeypatch):
    before, after = learning_run(monkeypatch, sabotage=True)
    assert after - before < MARGIN, (before, after)
