"""SFT: the prompt is masked out of the loss, and training lowers the held-out loss. Evaluation counts correctly."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from minirl.lm import build_tokenizer, evaluate, logprobs, make_model, sft, tasks

SIZES = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_encode_masks_the_prompt_and_keeps_the_eos(tok):
    ids, mask, loss_mask = sft.encode(tok, [("12+3=", "<answer>15</answer>"), ("1=", "x")])
    assert ids.shape == mask.shape == loss_mask.shape == (2, 6 + 5)  # bos + 5 characters; 4 tokens + eos
    assert tok.decode(ids[0]) == "<bos>12+3=<answer>15</answer><eos>"
    assert loss_mask[0].tolist() == [False] * 6 + [True] * 5
    assert ids[0][loss_mask[0]].tolist()[-1] == tok.eos_token_id
    assert mask[1].tolist() == [False] * 6 + [True] * 5 and loss_mask[1].tolist() == [False] * 9 + [True] * 2
    problem = tasks.Addition(2).solve(12, 34)
    assert torch.equal(sft.encode(tok, [problem])[0], sft.encode(tok, [(problem.prompt, problem.completion)])[0])


def test_the_loss_is_the_mean_completion_nll(tok):
    model = make_model(tok, **SIZES)
    ids, mask, loss_mask = sft.encode(tok, [("12+3=", "15"), ("1+1=", "2")])
    with torch.no_grad():
        logp = logprobs(model, ids, mask)
        expected = -logp[loss_mask].mean()
        assert torch.isclose(sft.sft_loss(model, ids, mask, loss_mask), expected)
        other_prompt = sft.encode(tok, [("99+9=", "15"), ("1+1=", "2")])
        assert not torch.isclose(sft.sft_loss(model, *other_prompt), expected)  # the prompt conditions the loss


def test_sft_lowers_the_heldout_loss(tok):
    task = tasks.Addition(2)
    train, heldout = tasks.make_problems(task, "train", 256), tasks.make_problems(task, "heldout", 64)
    model = make_model(tok, seed=0, **SIZES)
    before = sft.heldout_loss(model, tok, heldout)
    cfg = sft.SFTConfig(steps=40, batch_size=32, lr=1e-2, warmup_steps=5, eval_every=20)
    result = sft.train(model, tok, train, cfg, heldout=heldout, on_eval=lambda m: {"probe": 1.0})
    after = sft.heldout_loss(model, tok, heldout)
    assert after < 0.6 * before, (before, after)
    assert [row["step"] for row in result.history] == list(range(1, 41))
    assert [row["step"] for row in result.history if "heldout_loss" in row] == [20, 40]
    assert result.history[-1]["heldout_loss"] == pytest.approx(after) and result.history[-1]["probe"] == 1.0
    assert result.model is model and not model.training


def test_learning_rate_schedule():
    cfg = sft.SFTConfig(steps=100, lr=1.0, warmup_steps=10)
    assert sft.lr_at(0, cfg) == pytest.approx(0.1) and sft.lr_at(9, cfg) == pytest.approx(1.0)
    assert sft.lr_at(10, cfg) == pytest.approx(1.0) and sft.lr_at(100, cfg) == pytest.approx(0.1)
    constant = sft.SFTConfig(steps=100, lr=1.0, warmup_steps=10, schedule="constant")
    assert sft.lr_at(5, constant) == sft.lr_at(5, cfg) and sft.lr_at(60, constant) == sft.lr_at(99, constant) == 1.0


def test_bad_input_is_named(tok):
    model = make_model(tok, **SIZES)
    with pytest.raises(ValueError, match="examples must not be empty"):
        sft.train(model, tok, [])
    with pytest.raises(ValueError, match="steps must be > 0"):
        sft.train(model, tok, [("1", "2")], sft.SFTConfig(steps=0))
    with pytest.raises(ValueError, match="grad_clip must be > 0"):
        sft.train(model, tok, [("1", "2")], sft.SFTConfig(grad_clip=-0.5))
    with pytest.raises(TypeError, match="batch_size must be a number, got the bool"):
        sft.train(model, tok, [("1", "2")], sft.SFTConfig(batch_size=True))
    with pytest.raises(ValueError, match="schedule must be one of"):
        sft.train(model, tok, [("1", "2")], sft.SFTConfig(schedule="linear"))
    other = build_tokenizer()
    other.add_tokens(["<tool>"])
    with pytest.raises(ValueError, match="different vocabularies"):
        sft.train(model, other, [("1", "2")])


def test_evaluate_counts_accuracy_format_and_pass_at_k(tok, monkeypatch):
    """Sampling is replaced by fixed texts, so every score has a known value."""
    task = tasks.Addition(2)
    problems = tasks.make_problems(task, "heldout", 4)
    greedy_texts = [problems[0].completion, f"<answer>{problems[1].answer}</answer>", "junk", problems[3].completion]
    sampled_texts = ["x"] * 6 + [problems[2].completion, "y"]  # k = 2 samples of each problem: one right answer
    calls = []

    def fake_sample(model, tokenizer, prompts, max_new_tokens, greedy=False, **kwargs):
        calls.append(greedy)
        return SimpleNamespace(text=greedy_texts if greedy else sampled_texts)

    monkeypatch.setattr("minirl.lm.evaluation.sample", fake_sample)
    result = evaluate(make_model(tok, **SIZES), tok, task, n=4, k=2)
    assert calls == [True, False]
    assert result.accuracy == 0.75 and result.format_rate == 0.5
    assert result.sampled_accuracy == 1 / 8 and result.sampled_format_rate == 1 / 8 and result.pass_at_k == 0.25
    assert result.examples[2] == (problems[2].prompt, "junk")


def test_numpy_numbers_are_numbers():
    cfg = sft.check_config(sft.SFTConfig(lr=np.float32(1e-3), steps=np.int64(3)))
    assert type(cfg.lr) is float and type(cfg.steps) is int


def test_sft_stops_at_the_first_non_finite_loss(tok):
    model = make_model(tok, **SIZES)
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = float("inf")
    with pytest.raises(FloatingPointError, match="loss is not finite .*at step 1.*learning rate too high"):
        sft.train(model, tok, [("1+1=", "2")] * 4, sft.SFTConfig(steps=2, batch_size=2))


def test_sft_stops_when_an_update_makes_the_weights_non_finite(tok, monkeypatch):
    """A learning rate huge enough to overflow one weight: caught right after the update that did it."""
    model = make_model(tok, **SIZES)
    real_step = torch.optim.AdamW.step

    def overflowing(self, *args, **kwargs):
        result = real_step(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][-1].mul_(float("inf"))
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", overflowing)
    with pytest.raises(FloatingPointError, match=r"parameter .* not finite .*at step 1"):
        sft.train(model, tok, [("1+1=", "2")] * 4, sft.SFTConfig(steps=2, batch_size=2))
