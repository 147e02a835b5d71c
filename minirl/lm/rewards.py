"""Rule-based rewards in the style of DeepSeek-R1-Zero (``notebooks/10_grpo.ipynb``, ``notebooks/11_r1_zero.ipynb``).

A reward function takes the batch's prompts, completions (decoded text) and reference answers, and returns one
number per completion:

    reward_fn(prompts: list[str], completions: list[str], answers: list[str]) -> list[float] | torch.Tensor  # (B,)

Three ship here: ``accuracy_reward(task)`` (1 when the answer the task reads in the completion is right, else 0),
``format_reward`` (1 when the completion is exactly ``<think>...</think><answer>...</answer>``, each tag once, in
order, nothing around it) and ``consistency_reward`` (the share of the trace's numerals written in digits: R1's
language-consistency reward, on the two notations of ``tasks.MixedAddition``). ``score`` turns named, weighted parts
into the reward the trainer uses,

    r_i = sum_k w_k * r_k(q_i, o_i)

and keeps each part on its own, so that a part weighted 0 (the format reward, by default) is still logged. A user's
function plugs in the same way as the built-in ones. Whatever a function returns is checked: one finite number per
completion, or a ValueError that names the function.

The rewards read decoded text only, so they work with any tokenizer: the course's character-level one, or the BPE
tokenizer of a real model (``tests/test_lm_bpe.py`` checks both).
"""

import math
from collections.abc import Callable, Mapping, Sequence

import torch

from minirl.lm.tasks import digit_share, format_ok

RewardFn = Callable[[list[str], list[str], list[str]], "Sequence[float] | torch.Tensor"]


def accuracy_reward(task) -> RewardFn:
    """1.0 where the answer ``task.extract_answer`` reads in the completion is the reference answer under
    ``task.same_answer``, else 0.0.

    The format is not required: ``junk<answer>932</answer>`` scores 1 on ``347+585=``. For the R1 tasks several
    answers score 0 (``tasks.extract_answer``), so listing guesses earns nothing.
    """

    def accuracy(prompts: list[str], completions: list[str], answers: list[str]) -> list[float]:
        scores = []
        for text, answer in zip(completions, answers):
            given = task.extract_answer(text)
            scores.append(float(given is not None and task.same_answer(given, answer)))
        return scores

    return accuracy


def format_reward(prompts: list[str], completions: list[str], answers: list[str]) -> list[float]:
    """1.0 where the completion is exactly ``<think>..</think><answer>..</answer>`` (``tasks.format_ok``), else 0.0."""
    return [float(format_ok(text)) for text in completions]


def consistency_reward(prompts: list[str], completions: list[str], answers: list[str]) -> list[float]:
    """The share of each trace written in the target notation (digits), in [0, 1] (``digit_share``).

    DeepSeek-AI 2025 (R1, section 2.3.3) adds the share of target-language words in the chain of thought to the reward
    to stop language mixing, and reports that it costs a little accuracy for traces people can read.
    """
    return [digit_share(text) for text in completions]


def check_rewards(name: str, values, n: int) -> torch.Tensor:
    """``values`` as a float tensor (n,), or a ValueError naming the reward function ``name`` and what was wrong."""
    if isinstance(values, torch.Tensor):
        rewards = values.detach().to(torch.float32).cpu()
    else:
        try:
            rewards = torch.tensor([float(v) for v in values], dtype=torch.float32)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"reward function {name!r} must return one number per completion, got {type(values).__name__}"
            ) from err
    if rewards.dim() != 1 or rewards.shape[0] != n:
        raise ValueError(
            f"reward function {name!r} returned shape {tuple(rewards.shape)} for {n} completions; it must return "
            f"exactly one number per completion, in the order given"
        )
    if not torch.isfinite(rewards).all():
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()
        raise ValueError(
            f"reward function {name!r} returned NaN or inf at completions {bad[:10]}; return a finite number for "
            "every completion (0.0 for one that cannot be scored)"
        )
    return rewards


def score(
    parts: Mapping[str, tuple[RewardFn, float]],
    prompts: list[str],
    completions: list[str],
    answers: list[str],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The weighted reward sum_k w_k r_k (B,), and each part's unweighted rewards by name (B,) for logging.

    ``parts`` maps a name to ``(reward_fn, weight)``. Every part is computed, weight 0 included. Raises a ValueError
    when the three lists differ in length, a weight is not finite, or a function returns NaN or the wrong length.
    """
    n = len(completions)
    if len(prompts) != n or len(answers) != n:
        raise ValueError(f"need one prompt and one answer per completion, got {len(prompts)}, {n}, {len(answers)}")
    if not parts:
        raise ValueError("parts is empty: give at least one (reward_fn, weight), such as accuracy_reward(task)")
    total = torch.zeros(n)  # (B,)
    values = {}
    for name, (fn, weight) in parts.items():
        if not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"the weight of reward {name!r} must be a finite number, got {weight!r}")
        values[name] = check_rewards(name, fn(list(prompts), list(completions), list(answers)), n)  # (B,)
        total = total + weight * values[name]
    return total, values
