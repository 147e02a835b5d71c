"""Preference pairs for a reward model, labelled by a hidden utility you can read (``notebooks/09_rlhf_ppo.ipynb``).

RLHF's second stage learns a reward from comparisons: people see two answers to one prompt and say which is better.
Here the "person" is a rule, so that a student can check what the reward model recovered:

    utility(o) = 1.0 * correct(o) + 0.5 * format_ok(o) - 0.01 * len(o)

A right answer beats a wrong one; between two of the same correctness a well-formed completion beats a malformed
one; when both tie on those, the shorter text wins (a small length preference, the kind real labellers have, and
the one a policy can exploit). Two completions of equal utility make no pair: the rule prefers neither. Like human
labels the comparisons are noisy: a fraction ``noise`` of the labels is flipped by a seeded random generator.

The reward model never sees the utility, only which of two texts won. ``utility`` is public so that a notebook can
ask how well the learned scores recover its ranking.
"""

import random
from dataclasses import dataclass

import torch

from minirl.lm.sampling import sample
from minirl.lm.tasks import Problem, extract_answer, format_ok, make_problems, token_budget


@dataclass(frozen=True)
class Pair:
    """One comparison: two completions of the same ``prompt``, ``chosen`` labelled better than ``rejected``.

    ``flipped`` is True when label noise swapped the pair (the utility prefers ``rejected``); the reward model is
    never shown it."""

    prompt: str
    chosen: str
    rejected: str
    flipped: bool = False


def utility(task, problem: Problem, text: str) -> float:
    """The hidden utility of completion ``text``: 1 for a right answer, 0.5 for the exact R1 format, -0.01 per
    character."""
    given = extract_answer(text)
    correct = given is not None and task.same_answer(given, problem.answer)
    return 1.0 * correct + 0.5 * format_ok(text) - 0.01 * len(text)


def check_pairs(pairs: list[Pair]) -> list[Pair]:
    """Raise unless ``pairs`` is a non-empty list of :class:`Pair` whose two completions differ; return it."""
    if not isinstance(pairs, (list, tuple)) or not pairs:
        raise ValueError(
            "the preference set is empty: a reward model needs at least one pair (chosen, rejected); make some with "
            "minirl.lm.preferences.make_pairs, or lower the held-out share"
        )
    for i, pair in enumerate(pairs):
        if not isinstance(pair, Pair):
            raise TypeError(f"pair {i} is a {type(pair).__name__}, not a minirl.lm.preferences.Pair")
        if pair.chosen == pair.rejected:
            raise ValueError(
                f"pair {i} compares a completion with itself ({pair.chosen!r} for {pair.prompt!r}): it carries no "
                "preference, and its Bradley-Terry loss is log 2 whatever the model does; drop it"
            )
    return list(pairs)


def label_pairs(
    task, problems: list[Problem], completions: list[list[str]], pairs_per_prompt: int, noise: float, seed: int
) -> list[Pair]:
    """Pairs from ``completions[i]`` (several completions of ``problems[i]``), labelled by ``utility``.

    Per prompt: the distinct completions, every two of them whose utilities differ, and of those the
    ``pairs_per_prompt`` whose utilities differ most (a right answer against a wrong one first: a labelling budget is
    best spent on clear comparisons), ties in random order; then each label is flipped with probability ``noise``.
    Identical completions never make a pair.
    """
    if not 0 <= noise < 0.5:
        raise ValueError(f"noise must be in [0, 0.5): the share of labels flipped, got {noise!r}")
    rng = random.Random(f"pairs/{seed}")
    pairs = []
    for problem, texts in zip(problems, completions):
        distinct = sorted(set(texts))  # sorted: the same pairs for the same seed
        scored = [(utility(task, problem, t), t) for t in distinct]
        candidates = [(a, b) for i, a in enumerate(scored) for b in scored[i + 1 :] if a[0] != b[0]]
        rng.shuffle(candidates)
        candidates.sort(key=lambda c: -abs(c[0][0] - c[1][0]))  # clearest differences first, ties in random order
        for (ua, a), (ub, b) in candidates[:pairs_per_prompt]:
            chosen, rejected = (a, b) if ua > ub else (b, a)
            flip = rng.random() < noise
            if flip:
                chosen, rejected = rejected, chosen
            pairs.append(Pair(problem.prompt, chosen, rejected, flip))
    return pairs


@torch.no_grad()
def make_pairs(
    model,
    tokenizer,
    task,
    n_prompts: int,
    completions_per_prompt: int = 8,
    pairs_per_prompt: int = 2,
    noise: float = 0.1,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 256,
) -> list[Pair]:
    """Sample ``completions_per_prompt`` completions of ``n_prompts`` training problems from ``model`` and label pairs
    of them with ``label_pairs``. The same arguments give the same pairs."""
    problems = make_problems(task, "train", n_prompts, seed=seed)
    prompts = [p.prompt for p in problems for _ in range(completions_per_prompt)]
    generator = torch.Generator(next(model.parameters()).device).manual_seed(seed)
    texts, budget = [], token_budget(task, tokenizer)
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        texts += sample(model, tokenizer, chunk, budget, temperature=temperature, generator=generator).text
    k = completions_per_prompt
    grouped = [texts[i * k : (i + 1) * k] for i in range(len(problems))]
    return label_pairs(task, problems, grouped, pairs_per_prompt, noise, seed)


def split_pairs(pairs: list[Pair], heldout: float, seed: int = 0) -> tuple[list[Pair], list[Pair]]:
    """``(train, heldout)`` by prompt: all pairs of one prompt land on the same side, so held-out accuracy is measured
    on prompts the reward model never saw."""
    prompts = sorted({p.prompt for p in pairs})
    random.Random(f"split/{seed}").shuffle(prompts)
    held = set(prompts[: round(heldout * len(prompts))])
    return [p for p in pairs if p.prompt not in held], [p for p in pairs if p.prompt in held]
