"""Preferences and the Bradley-Terry reward model: the loss by hand, learning a known utility, save/load, bad input."""

import math
import random

import pytest
import torch

from minirl.lm import build_tokenizer, make_model
from minirl.lm import preferences as prefs
from minirl.lm import reward_model as rm
from minirl.lm.tasks import get_task
from minirl.losses import bradley_terry_loss

SIZES = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def test_bradley_terry_loss_by_hand():
    chosen, rejected = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([0.0, 0.0, 1.0])
    # -log sigmoid(d) = log(1 + exp(-d)) for d = 2, 0, -2
    expected = [math.log(1 + math.exp(-2)), math.log(2), math.log(1 + math.exp(2))]
    assert torch.allclose(bradley_terry_loss(chosen, rejected), torch.tensor(expected), atol=1e-6)
    big = bradley_terry_loss(torch.tensor([200.0]), torch.tensor([-200.0]))  # no overflow at large gaps
    assert big.item() == 0.0 and torch.isfinite(bradley_terry_loss(torch.tensor([-200.0]), torch.tensor([200.0])))
    d = torch.tensor([0.5], requires_grad=True)
    bradley_terry_loss(d, torch.zeros(1)).sum().backward()
    assert math.isclose(d.grad.item(), -1 / (1 + math.exp(0.5)), rel_tol=1e-6)  # -sigmoid(-d)


def test_utility_orders_right_then_format_then_length():
    task = get_task("addition")
    problem = task.solve(347, 585)
    right = problem.completion
    wrong = right.replace("932", "933")
    malformed = "junk" + wrong
    assert prefs.utility(task, problem, right) > prefs.utility(task, problem, wrong)
    assert prefs.utility(task, problem, wrong) > prefs.utility(task, problem, malformed)
    assert prefs.utility(task, problem, "<answer>932</answer>") > prefs.utility(task, problem, "x<answer>932</answer>")


def test_labels_follow_the_utility_and_noise_flips_the_stated_share():
    task = get_task("addition")
    problems = [task.solve(100 + i, 200 + i) for i in range(400)]
    completions = [[p.completion, p.completion.replace("</answer>", "1</answer>"), "x", p.completion] for p in problems]
    clean = prefs.label_pairs(task, problems, completions, pairs_per_prompt=3, noise=0.0, seed=0)
    assert all(prefs.utility(task, pr, p.chosen) > prefs.utility(task, pr, p.rejected)
               for p in clean for pr in problems if pr.prompt == p.prompt)  # fmt: skip
    assert all(p.chosen != p.rejected for p in clean) and len(clean) == 3 * 400  # the duplicate never pairs with itself
    noisy = prefs.label_pairs(task, problems, completions, pairs_per_prompt=3, noise=0.2, seed=0)
    share = sum(p.flipped for p in noisy) / len(noisy)
    assert 0.16 < share < 0.24
    assert all((p.chosen, p.rejected) == ((q.rejected, q.chosen) if p.flipped else (q.chosen, q.rejected))
               for p, q in zip(noisy, clean))  # fmt: skip


def synthetic_pairs(n: int, seed: int) -> list[prefs.Pair]:
    """Pairs whose hidden utility is the count of '7's in a random digit string (noise-free): to rank them, the model
    must count a character over the whole text, something a constant or a length bias cannot do."""
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n:
        a, b = ("".join(rng.choice("0123456789") for _ in range(8)) for _ in range(2))
        if a.count("7") != b.count("7"):
            chosen, rejected = (a, b) if a.count("7") > b.count("7") else (b, a)
            pairs.append(prefs.Pair("n=", chosen, rejected))
    return pairs


def test_reward_model_learns_a_known_utility(one_thread):
    tok = build_tokenizer()
    model = rm.ScalarLM.from_lm(make_model(tok, seed=0, **SIZES))
    train, heldout = synthetic_pairs(600, seed=1), synthetic_pairs(200, seed=2)
    assert rm.pairwise_accuracy(model, tok, heldout) == 0.5  # zero head: every score is 0, every pair a tie
    history = rm.fit(model, tok, train, epochs=4, batch_size=32, lr=3e-3, seed=0)
    acc = rm.pairwise_accuracy(model, tok, heldout)
    assert acc > 0.85, acc  # a sign error gives < 0.5, a loss on the sum instead of the difference about 0.5
    assert history["loss"][-1] < 0.5 < history["loss"][0] + 0.2
    s = rm.scores(model, tok, ["n=", "n="], ["77770000", "00000000"])
    assert s[0] > s[1]  # four 7s beat none


def test_save_load_round_trip_and_normalisation(tmp_path):
    tok = build_tokenizer()
    model = rm.ScalarLM.from_lm(make_model(tok, seed=0, **SIZES))
    pairs = synthetic_pairs(64, seed=3)
    rm.fit(model, tok, pairs, epochs=1, batch_size=32, lr=3e-3)
    prompts, texts = ["n="] * 64, [p.chosen for p in pairs]
    before = rm.scores(model, tok, prompts, texts)
    rm.normalize_head(model, tok, prompts, texts)
    after = rm.scores(model, tok, prompts, texts)
    assert abs(after.mean().item()) < 1e-4 and abs(after.std().item() - 1) < 1e-3
    assert torch.equal(before.argsort(), after.argsort())  # rankings unchanged
    rm.save_scalar_lm(model, tok, tmp_path / "rm", {"note": "test"})
    loaded, loaded_tok = rm.load_scalar_lm(tmp_path / "rm", device="cpu")
    assert torch.allclose(rm.scores(loaded, loaded_tok, prompts, texts), after)
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.bin"))


def test_encode_lays_out_rows_like_the_sampler():
    tok = build_tokenizer()
    ids, mask = rm.encode(tok, ["1+2=", "10+20="], ["3", "30"], "cpu")
    assert ids.shape == mask.shape == (2, 7 + 3)  # 6 chars + bos, then completion + eos
    assert ids[0, rm.last_index(mask)[0]] == tok.eos_token_id and ids[1, rm.last_index(mask)[1]] == tok.eos_token_id
    assert not mask[0, 0] and mask[1, 0]  # the shorter prompt is padded on the left
    assert not mask[0, -1]  # the shorter completion is padded on the right


def test_bad_input_raises(tmp_path):
    tok = build_tokenizer()
    model = rm.ScalarLM.from_lm(make_model(tok, seed=0, **SIZES))
    with pytest.raises(ValueError, match="compares a completion with itself"):
        rm.fit(model, tok, [prefs.Pair("1+1=", "2", "2")])
    with pytest.raises(ValueError, match="preference set is empty"):
        rm.fit(model, tok, [])
    with pytest.raises(ValueError, match="preference set is empty"):
        rm.pairwise_accuracy(model, tok, [])
    with pytest.raises(ValueError, match="noise must be in"):
        prefs.label_pairs(get_task("addition"), [], [], 1, noise=0.5, seed=0)
    other = build_tokenizer()
    other.add_tokens(["<tool>"])
    with pytest.raises(ValueError, match="another vocabulary"):
        rm.check_same_vocab("reward model", tok, other)
    small = rm.ScalarLM.from_lm(make_model(tok, seed=0, **SIZES))
    small.trunk.resize_token_embeddings(50)
    with pytest.raises(ValueError, match="different vocabularies"):
        rm.fit(small, tok, synthetic_pairs(4, 0))
    with pytest.raises(ValueError, match="not a reward or value model"):
        rm.load_scalar_lm(tmp_path, device="cpu")
    for kw, match in [(dict(noise=0.5), "noise"), (dict(heldout=1.5), "heldout"), (dict(completions_per_prompt=1),
                      "completions_per_prompt"), (dict(task="chess"), "task")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            rm.check_config(rm.RewardModelConfig(**kw))
