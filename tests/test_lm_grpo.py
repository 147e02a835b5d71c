"""The LM GRPO trainer: its loss against a loop-based reference, a smoke run, resume, bad input, and learning."""

import math
import os
import pickle

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from minirl import _io
from minirl.lm import PRETRAINED, build_tokenizer, grpo, make_model, runs, save
from minirl.lm.sampling import logprobs, positions
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


def test_length_chunks_sort_rows_by_completion_length_and_cover_each_once():
    lengths = torch.tensor([5, 1, 3, 3, 0, 6, 2])
    cmask = torch.arange(6)[None, :] < lengths[:, None]  # (7, 6), True from column 0 to each row's end
    chunks = grpo.length_chunks(cmask, rows=3)
    assert [c.tolist() for c in chunks] == [[4, 1, 6], [2, 3], [0, 5]]  # stable: rows 2 and 3 keep their order
    assert grpo.length_chunks(cmask, rows=100)[0].tolist() == [4, 1, 6, 2, 3, 0, 5]


@pytest.mark.parametrize("loss_agg, beta", [("token-mean", 0.0), ("seq-mean-token-mean", 0.5),
                                            ("seq-mean-token-sum-norm", 0.0)])  # fmt: skip
def test_training_in_length_chunks_gives_the_update_of_one_pass(tiny, monkeypatch, loss_agg, beta):
    """Chunks of 5 rows, each cut to its longest completion, against the whole batch in one forward pass (the
    chunk size above the batch): the same losses and, after two AdamW steps, the same parameters."""
    kw = dict(prompts_per_step=8, accuracy_weight=0.0, loss_agg=loss_agg, beta=beta, seed=3)
    runs = {}
    for rows in (5, 10**6):
        monkeypatch.setattr(grpo, "CHUNK_ROWS", rows)
        runs[rows] = grpo.train(tiny_cfg(tiny, **kw), reward_fn=length_reward)
    chunked, whole = runs[5].history, runs[10**6].history
    assert chunked["rows_computed"][0] > 10  # at least three chunks
    assert chunked["length"] == whole["length"]  # the same completions: the chunks cut real padding
    assert chunked["loss"] == pytest.approx(whole["loss"], rel=1e-5, abs=1e-6)  # seq-mean: about 0 at ratio 1
    for a, b in zip(runs[5].model.parameters(), runs[10**6].model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def parity_reward(prompts, completions, answers):
    """A reward of the row, not of its text: copies of one completion get different rewards, so they train."""
    return [float(i % 2) for i in range(len(completions))]


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_rows_that_repeat_are_computed_once_for_the_update_of_every_row(tiny, monkeypatch, beta):
    """Near-greedy sampling repeats completions within a group. Computing each distinct row once gives the losses
    and, after two AdamW steps, the parameters of scoring every row on its own with ``logprobs`` on whole rows."""

    def every_row(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature):
        ids, mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
        return logprobs(model, ids, mask, temperature)[:, prompt_ids.shape[1] :]  # (B, C)

    kw = dict(prompts_per_step=4, temperature=0.05, beta=beta, accuracy_weight=0.0, seed=1)
    once = grpo.train(tiny_cfg(tiny, **kw), reward_fn=parity_reward)
    monkeypatch.setattr(grpo, "completion_logprobs", every_row)
    each = grpo.train(tiny_cfg(tiny, **kw), reward_fn=parity_reward)
    h = once.history
    assert h["rows_computed"] == each.history["rows_computed"] == [16.0, 16.0]
    assert all(d < n for d, n in zip(h["rows_distinct"], h["rows_computed"]))  # there were copies
    assert h["length"] == each.history["length"]
    assert h["loss"] == pytest.approx(each.history["loss"], rel=1e-5, abs=1e-6)
    for a, b in zip(once.model.parameters(), each.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


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


class Killed(BaseException):
    """Stands for the process being killed: nothing after it runs, not even except-clauses for Exception."""


def count_calls(monkeypatch, kill_at: int | None = None) -> dict:
    """Count the renames and removals of ``minirl._io`` (the steps of a checkpoint write); raise ``Killed`` at call
    number ``kill_at`` of them, counted together."""
    seen = {"n": 0}
    for module, name in ((_io.os, "replace"), (_io.shutil, "rmtree")):
        real = getattr(module, name)

        def counted(*args, _real=real, **kwargs):
            seen["n"] += 1
            if seen["n"] == kill_at:
                raise Killed
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return seen


def test_a_kill_at_any_point_of_a_save_leaves_a_checkpoint_to_resume(tiny, tmp_path, monkeypatch):
    """Kill the second save (step 2 over step 1) at each of its renames and removals, then resume: the run continues
    from a complete checkpoint, step 1 or step 2, and ends with the parameters of an unbroken run."""
    kw = dict(accuracy_weight=0.0, steps=3, save_every=1, seed=5)
    want = grpo.train(tiny_cfg(tiny, **kw), reward_fn=length_reward).model.state_dict()
    probe = tmp_path / "probe"
    grpo.train(tiny_cfg(tiny, out=str(probe), **{**kw, "steps": 1}), reward_fn=length_reward)
    seen = count_calls(monkeypatch)
    grpo.train(tiny_cfg(tiny, out=str(probe), resume=True, **{**kw, "steps": 2}), reward_fn=length_reward)
    calls = seen["n"]  # the steps of one save over an existing checkpoint
    monkeypatch.undo()
    assert calls >= 3
    for k in range(1, calls + 1):
        out = tmp_path / f"kill{k}"
        grpo.train(tiny_cfg(tiny, out=str(out), **{**kw, "steps": 1}), reward_fn=length_reward)
        count_calls(monkeypatch, kill_at=k)
        with pytest.raises(Killed):
            grpo.train(tiny_cfg(tiny, out=str(out), resume=True, **{**kw, "steps": 2}), reward_fn=length_reward)
        monkeypatch.undo()
        assert runs.load_run(out).step in (1, 2), k  # recovered: a complete checkpoint, old or new
        resumed = grpo.train(tiny_cfg(tiny, out=str(out), resume=True, **kw), reward_fn=length_reward)
        assert len(resumed.history) == 3 and runs.load_run(out).step == 3
        got = resumed.model.state_dict()
        assert all(torch.equal(want[name], got[name]) for name in want), k
        assert sorted(p.name for p in out.iterdir()) == [_io.RUN_MARKER, "checkpoint"]  # nothing left over


def test_the_old_copy_survives_while_it_is_the_only_complete_one(tiny, tmp_path):
    """A kill between the two renames leaves only ``.checkpoint.old``: resuming restores it, never deletes it."""
    out = tmp_path / "run"
    kw = dict(accuracy_weight=0.0, steps=2)
    grpo.train(tiny_cfg(tiny, out=str(out), **kw), reward_fn=length_reward)
    os.replace(out / "checkpoint", out / ".checkpoint.old")
    resumed = grpo.train(tiny_cfg(tiny, out=str(out), resume=True, **{**kw, "steps": 3}), reward_fn=length_reward)
    assert len(resumed.history) == 3 and runs.load_run(out).step == 3 and not (out / ".checkpoint.old").exists()


def test_the_schedule_sets_the_lr_of_every_step(tiny):
    cfg = tiny_cfg(tiny, accuracy_weight=0.0, steps=4, lr=1e-3, schedule="cosine", warmup_steps=2)
    lrs = grpo.train(cfg, reward_fn=length_reward).history["lr"]
    # warm-up 1/2, 2/2 of lr; then the cosine from lr at progress 0 to 0.1 + 0.9 * (1 + cos(pi / 2)) / 2 = 0.55 of lr
    assert lrs == pytest.approx([5e-4, 1e-3, 1e-3, 5.5e-4], rel=1e-12)
    assert grpo.train(tiny_cfg(tiny, accuracy_weight=0.0), reward_fn=length_reward).history["lr"] == [1e-4, 1e-4]


@pytest.mark.parametrize("warmup_steps, applied", [(0, 1e-3), (2, 5e-4)])
def test_the_optimizer_steps_with_the_schedules_lr(tiny, warmup_steps, applied):
    # AdamW's first step moves every parameter by lr * g / (|g| + eps) (no weight decay): by lr wherever |g| >> eps
    cfg = tiny_cfg(tiny, accuracy_weight=0.0, steps=1, lr=1e-3, warmup_steps=warmup_steps)
    before = grpo.load(tiny, device="cpu")[0].state_dict()
    after = grpo.train(cfg, reward_fn=length_reward).model.state_dict()
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert moved == pytest.approx(applied, rel=1e-3)


def test_a_cosine_run_may_not_change_its_steps_on_resume(tiny, tmp_path):
    out = tmp_path / "run"
    grpo.train(tiny_cfg(tiny, out=str(out), accuracy_weight=0.0, schedule="cosine"), reward_fn=length_reward)
    with pytest.raises(ValueError, match="change the training math: steps"):
        grpo.train(tiny_cfg(tiny, out=str(out), resume=True, steps=3, accuracy_weight=0.0, schedule="cosine"))
    assert runs.load_run(out).step == 2 and runs.free_settings(tiny_cfg(tiny)) == runs.FREE


@pytest.mark.parametrize(
    "change, fields",
    [
        (dict(lr=3e-4), "lr"),
        (dict(group_size=2), "group_size"),
        (dict(task="sorting", max_new_tokens=8), "max_new_tokens.*task"),
        (dict(model=str(PRETRAINED)), "model"),
    ],
)
def test_a_resume_that_changes_the_math_is_refused(tiny, tmp_path, change, fields):
    out = tmp_path / "run"
    grpo.train(tiny_cfg(tiny, out=str(out), accuracy_weight=0.0), reward_fn=length_reward)
    with pytest.raises(ValueError, match=f"change the training math: {fields}.*Resume with the saved values"):
        grpo.train(tiny_cfg(tiny, out=str(out), resume=True, steps=3, accuracy_weight=0.0, **change))
    assert runs.load_run(out).step == 2  # untouched


def test_a_resume_records_what_changed(tiny, tmp_path):
    out = tmp_path / "run"
    grpo.train(tiny_cfg(tiny, out=str(out), accuracy_weight=0.0), reward_fn=length_reward)
    grpo.train(tiny_cfg(tiny, out=str(out), resume=True, steps=3, accuracy_weight=0.0), reward_fn=length_reward)
    saved = runs.load_run(out)
    assert saved.config["steps"] == 3 and saved.state["resumes"] == [{"step": 2, "changed": {"steps": [2, 3]}}]


def test_a_checkpoint_is_never_unpickled(tiny, tmp_path, monkeypatch):
    out = tmp_path / "run"
    grpo.train(tiny_cfg(tiny, out=str(out), accuracy_weight=0.0), reward_fn=length_reward)
    (out / "checkpoint" / "trainer.pt").write_bytes(b"a pickle payload would sit here")

    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load called on a checkpoint")

    monkeypatch.setattr(torch, "load", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    monkeypatch.setattr(pickle, "loads", no_unpickling)
    resumed = grpo.train(tiny_cfg(tiny, out=str(out), resume=True, steps=3, accuracy_weight=0.0))
    assert len(resumed.history) == 3


def test_a_folder_minirl_did_not_write_is_refused_before_training(tiny, tmp_path, monkeypatch):
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("years of work")
    monkeypatch.setattr(grpo, "load", lambda *a, **kw: pytest.fail("training started"))
    with pytest.raises(FileExistsError, match="not written by minirl.*Choose a new or empty folder"):
        grpo.train(tiny_cfg(tiny, out=str(mine)))
    assert [p.name for p in mine.iterdir()] == ["chapter1.tex"] and oct(mine.stat().st_mode & 0o777) != "0o700"
    monkeypatch.chdir(mine)
    with pytest.raises(FileExistsError, match="chapter1.tex"):  # --out . in a folder of one's own files
        grpo.train(tiny_cfg(tiny, out="."))


def test_out_dot_in_an_empty_folder_works(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mode = tmp_path.stat().st_mode
    grpo.train(tiny_cfg(tiny, out=".", accuracy_weight=0.0), reward_fn=length_reward)
    assert runs.load_run(".").step == 2 and tmp_path.stat().st_mode == mode  # the folder's permissions unchanged
    assert oct((tmp_path / "checkpoint").stat().st_mode & 0o777) == "0o755"
    with pytest.raises(FileExistsError, match="Pass --resume"):  # starting over would replace the checkpoint
        grpo.train(tiny_cfg(tiny, out="."))


@pytest.mark.parametrize("where", ["log-probs", "gradient", "parameter"])
def test_training_stops_at_the_first_non_finite_number_and_saves_nothing_after(tiny, tmp_path, monkeypatch, where):
    """Step 1 is saved; step 2 meets a NaN (in the weights, the gradient norm or the parameters after the update):
    training stops naming step 2 and its likely causes, and the checkpoint on disk is step 1's, all finite."""
    out = tmp_path / "run"
    state = {"step": 0}
    real_load, real_clip, real_step = grpo.load, torch.nn.utils.clip_grad_norm_, torch.optim.AdamW.step

    def load(*args, **kwargs):
        model, tok = real_load(*args, **kwargs)
        state["model"] = model
        return model, tok

    def on_batch(step, prompts, completions, rewards):
        state["step"] = step
        if step == 2 and where == "log-probs":
            with torch.no_grad():
                state["model"].get_input_embeddings().weight[:, 0] = float("nan")

    def clip(parameters, max_norm):
        norm = real_clip(parameters, max_norm)
        return norm * float("inf") if state["step"] == 2 and where == "gradient" else norm

    def step(self, *args, **kwargs):
        result = real_step(self, *args, **kwargs)
        if state["step"] == 2 and where == "parameter":
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("inf"))
        return result

    monkeypatch.setattr(grpo, "load", load)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    cfg = tiny_cfg(tiny, out=str(out), steps=3, save_every=1, accuracy_weight=0.0)
    with pytest.raises(FloatingPointError, match=f"{where}.* not finite .*at step 2.*learning rate too high"):
        grpo.train(cfg, reward_fn=length_reward, on_batch=on_batch)
    monkeypatch.undo()
    saved = runs.load_run(out)
    assert saved.step == 1
    weights = load_file(saved.model_path() / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_a_nan_reward_is_named_with_its_step_and_part(tiny, tmp_path):
    def nan_later(prompts, completions, answers):
        return [float("nan")] * len(completions) if nan_later.calls else [0.0] * len(completions)

    nan_later.calls = 0

    def counted(prompts, completions, answers):
        result = nan_later(prompts, completions, answers)
        nan_later.calls += 1
        return result

    out = tmp_path / "run"
    with pytest.raises(ValueError, match="step 2: reward function 'user' returned NaN or inf"):
        grpo.train(tiny_cfg(tiny, out=str(out), steps=3, save_every=1), reward_fn=counted)
    assert runs.load_run(out).step == 1


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
    "kw, error, message",
    [
        (dict(group_size=1), ValueError, "group of one"),
        (dict(loss_agg="mean"), ValueError, "loss_agg must be one of"),
        (dict(scale="std"), ValueError, "scale must be one of"),
        (dict(task="poetry"), ValueError, "task must be one of"),
        (dict(beta=-0.1), ValueError, "beta must be >= 0"),
        (dict(steps=0), ValueError, "steps must be > 0"),
        (dict(steps=-1000), ValueError, "steps must be > 0"),
        (dict(clip_low=-0.2), ValueError, r"clip_low must be in \[0, 1\]"),
        (dict(clip_high=-0.1), ValueError, "clip_high must be >= 0"),
        (dict(lr=0.0), ValueError, "lr must be > 0"),
        (dict(lr=float("inf")), ValueError, "lr must be a finite number"),
        (dict(max_grad_norm=-0.5), ValueError, "max_grad_norm must be > 0"),
        (dict(temperature=0), ValueError, "temperature must be > 0"),
        (dict(eval_n=0), ValueError, "eval_n must be > 0"),
        (dict(group_size=True), TypeError, "group_size must be a number, got the bool"),
        (dict(mask_truncated=1), TypeError, "mask_truncated must be True or False"),
        (dict(steps=2.5), TypeError, "steps must be an integer"),
        (dict(resume=True), ValueError, "resume=True needs out"),
        (dict(schedule="linear"), ValueError, "schedule must be one of"),
        (dict(warmup_steps=-1), ValueError, "warmup_steps must be >= 0"),
    ],
)
def test_bad_config_raises_before_any_work(tiny, kw, error, message, monkeypatch):
    monkeypatch.setattr(grpo, "load", lambda *a, **k: pytest.fail("training started"))
    with pytest.raises(error, match=message):
        grpo.train(tiny_cfg(tiny, **kw))


def test_numpy_numbers_are_numbers(tiny):
    cfg = grpo.check_config(tiny_cfg(tiny, lr=np.float32(1e-4), group_size=np.int64(4), mask_truncated=np.bool_(0)))
    assert type(cfg.lr) is float and type(cfg.group_size) is int and cfg.mask_truncated is False
    assert grpo.train(cfg, reward_fn=length_reward).history["rows_trained"] == [8.0, 8.0]


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

    args = build_parser().parse_args(["lm", "grpo", "--group-size", "4", "--clip-high", "none", "--mask-truncated",
                                      "--schedule", "cosine", "--warmup-steps", "5"])  # fmt: skip
    cfg = config_from(args, grpo.GRPOConfig)
    assert args.func.__name__ == "run_grpo"
    assert cfg.group_size == 4 and cfg.clip_high is None and cfg.mask_truncated and cfg.loss_agg == LOSS_AGGS[1]
    assert cfg.schedule == "cosine" and cfg.warmup_steps == 5


# --- learning: from the committed checkpoint, held-out accuracy must rise ---

LEARN = dict(model=str(PRETRAINED), steps=40, eval_every=40, eval_n=200, seed=0, threads=2)
MARGIN = 0.15  # held-out greedy accuracy (200 problems) must gain 15 points in 40 steps (measured: +28, seed 0)


def off_by_one_logprobs(model, ids, mask, temperature=1.0):
    """Sabotage: the classic shift bug. Token t is scored with the logits at position t, which predict token t + 1,
    instead of those at t - 1; the sampler's old log-probs stay right, so the ratio and the gradient are wrong."""
    mask = mask.bool()
    logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask)).logits  # (B, L, V)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, ids[..., None]).squeeze(-1)  # (B, L)
    return torch.where(mask & (positions(mask) > 0), logp, torch.zeros_like(logp))


def learning_run(monkeypatch=None, sabotage=False):
    if sabotage:
        monkeypatch.setattr(grpo, "logprobs", off_by_one_logprobs)
    result = grpo.train(grpo.GRPOConfig(**LEARN))
    before, after = result.evals[0]["heldout_accuracy"], result.evals[-1]["heldout_accuracy"]
    print(f"LM GRPO{' (off-by-one log-probs)' if sabotage else ''}, 40 steps, seed 0: {before:.1%} -> {after:.1%}")
    return before, after


@pytest.mark.learning
def test_grpo_raises_heldout_accuracy():
    before, after = learning_run()
    assert after - before >= MARGIN, (before, after)


@pytest.mark.slow
def test_sabotaged_twin_misses(monkeypatch):
    before, after = learning_run(monkeypatch, sabotage=True)
    assert after - before < MARGIN, (before, after)
