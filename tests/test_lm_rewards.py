"""Rule-based rewards: accuracy, strict format, weighted sums, and loud errors for bad user functions."""

import math

import pytest
import torch

from minirl.lm import rewards, tasks

ADD = tasks.Addition(3)
GOOD = "<think>7+5=12 c1 4+8+1=13 c1 3+5+1=9 c0</think><answer>932</answer>"


@pytest.mark.parametrize(
    "text, acc, fmt",
    [
        (GOOD, 1.0, 1.0),
        ("<think>x</think><answer>0932</answer>", 1.0, 1.0),  # leading zeros are the same number
        ("<think>x</think><answer>931</answer>", 0.0, 1.0),  # well formed, wrong
        ("<answer>932</answer>", 1.0, 0.0),  # right answer, no think block: accuracy does not need the format
        ("<think>x</think><answer>932</answer> and more", 1.0, 0.0),  # trailing text breaks the strict format
        ("<answer>932</answer><think>x</think>", 1.0, 0.0),  # tags out of order
        ("<think>x</think><think>y</think><answer>932</answer>", 1.0, 0.0),  # a tag twice
        ("<think>x</think><answer>932</answer><answer>931</answer>", 0.0, 0.0),  # two answers: no reward at all
        ("", 0.0, 0.0),  # the empty completion (the model wrote eos first)
        ("<think>x</think><answer>932", 0.0, 0.0),  # unclosed
    ],
)
def test_accuracy_and_format_by_hand(text, acc, fmt):
    assert rewards.accuracy_reward(ADD)(["347+585="], [text], ["932"]) == [acc]
    assert rewards.format_reward(["347+585="], [text], ["932"]) == [fmt]


def test_score_weights_the_parts_and_logs_each():
    comps = [GOOD, "<answer>932</answer>", "<think>x</think><answer>1</answer>", ""]
    n = len(comps)
    parts = {"accuracy": (rewards.accuracy_reward(ADD), 1.0), "format": (rewards.format_reward, 0.25)}
    total, values = rewards.score(parts, ["347+585="] * n, comps, ["932"] * n)
    assert values["accuracy"].tolist() == [1, 1, 0, 0] and values["format"].tolist() == [1, 0, 1, 0]
    assert total.tolist() == [1.25, 1.0, 0.25, 0.0]
    total0, values0 = rewards.score({**parts, "format": (rewards.format_reward, 0.0)}, ["q"] * n, comps, ["932"] * n)
    assert total0.tolist() == [1, 1, 0, 0] and values0["format"].tolist() == [1, 0, 1, 0]  # weight 0: still logged


def test_a_user_function_plugs_in_the_same_way():
    def length_penalty(prompts, completions, answers):
        return torch.tensor([-len(c) / 100 for c in completions])

    parts = {"accuracy": (rewards.accuracy_reward(ADD), 1.0), "length": (length_penalty, 2.0)}
    total, values = rewards.score(parts, ["q", "q"], [GOOD, ""], ["932", "932"])
    assert torch.allclose(values["length"], torch.tensor([-len(GOOD) / 100, 0.0]))
    assert torch.allclose(total, torch.tensor([1 - 2 * len(GOOD) / 100, 0.0]))


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda p, c, a: [1.0] * (len(c) - 1), "exactly one number per completion"),
        (lambda p, c, a: [float("nan")] * len(c), "NaN or inf"),
        (lambda p, c, a: torch.full((len(c),), math.inf), "NaN or inf"),
        (lambda p, c, a: torch.zeros(len(c), 2), "exactly one number per completion"),
        (lambda p, c, a: None, "one number per completion"),
        (lambda p, c, a: ["high"] * len(c), "one number per completion"),
    ],
)
def test_bad_user_rewards_raise_naming_the_function(bad, message):
    with pytest.raises(ValueError, match=message) as err:
        rewards.score({"mine": (bad, 1.0)}, ["q"] * 3, ["a", "b", "c"], ["1"] * 3)
    assert "'mine'" in str(err.value)


def test_bad_weights_and_lengths_raise():
    acc = rewards.accuracy_reward(ADD)
    with pytest.raises(ValueError, match="finite"):
        rewards.score({"accuracy": (acc, float("nan"))}, ["q"], [GOOD], ["932"])
    with pytest.raises(ValueError, match="one prompt and one answer"):
        rewards.score({"accuracy": (acc, 1.0)}, ["q"], [GOOD, GOOD], ["932"])
    with pytest.raises(ValueError, match="at least one"):
        rewards.score({}, ["q"], [GOOD], ["932"])


def test_consistency_reward_is_the_digit_share_and_grpo_logs_it():
    from minirl.lm import grpo

    texts = ["<think>7+5=12 c1</think><answer>12</answer>", "<think>H+F=BC cB</think><answer>12</answer>", "x"]
    assert rewards.consistency_reward(["7+5="] * 3, texts, ["12"] * 3) == [1.0, 0.0, 0.0]
    parts = grpo.reward_parts(grpo.GRPOConfig(consistency_weight=0.5), tasks.get_task("addition-mixed"), None)
    total, values = rewards.score(parts, ["7+5="] * 3, texts, ["12"] * 3)
    assert total.tolist() == [1.5, 1.0, 0.0]  # accuracy 1, 1, 0 plus half the digit share
    assert values["consistency"].tolist() == [1.0, 0.0, 0.0]
    _, values = rewards.score(grpo.reward_parts(grpo.GRPOConfig(), tasks.get_task("addition"), None),
                              ["7+5="], texts[:1], ["12"])  # fmt: skip
    assert "consistency" in values  # logged even at weight 0, like the format reward
