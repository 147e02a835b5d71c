"""Held-out accuracy and format rate of a language model on a task (``notebooks/08_tiny_lm.ipynb``).

Works with any tokenizer: the completion budget is counted in the tokenizer's own tokens (``tasks.token_budget``), and
``chat=True`` puts each question in an instruct model's chat template (``tokenizer.render_prompt``).
"""

from dataclasses import dataclass

import torch

from minirl.lm.sampling import sample
from minirl.lm.tasks import digit_share, format_ok, is_correct, make_problems, token_budget
from minirl.lm.tokenizer import render_prompt


@dataclass
class Evaluation:
    """Scores on ``n`` held-out problems. ``accuracy`` and ``format_rate`` are greedy; the ``sampled_`` scores average
    ``k`` completions per problem at ``temperature``; ``pass_at_k`` is the share of problems with a correct one.
    ``digit_share`` is the mean share of the greedy traces' numerals written in digits (``tasks.digit_share``)."""

    n: int
    accuracy: float
    format_rate: float
    k: int
    temperature: float
    sampled_accuracy: float | None
    sampled_format_rate: float | None
    pass_at_k: float | None
    examples: list[tuple[str, str]]  # (prompt, greedy completion) of the first few problems
    digit_share: float = 1.0


def _score(task, problems, prompts, model, tokenizer, batch_size, **kw) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Correct and well-formatted flags (1.0 or 0.0), one per prompt, and the completions, sampled in batches."""
    correct, formatted, texts = [], [], []
    budget = token_budget(task, tokenizer)
    for i in range(0, len(prompts), batch_size):
        texts += sample(model, tokenizer, prompts[i : i + batch_size], budget, **kw).text
    for problem, text in zip(problems, texts):
        correct.append(is_correct(task, problem, text))
        formatted.append(format_ok(text))
    return torch.tensor(correct, dtype=torch.float), torch.tensor(formatted, dtype=torch.float), texts


def evaluate(
    model,
    tokenizer,
    task,
    n: int = 500,
    seed: int = 0,
    k: int = 4,
    temperature: float = 1.0,
    batch_size: int = 500,
    chat: bool = False,
) -> Evaluation:
    """Evaluate on the first ``n`` held-out problems drawn with ``seed`` (the same problems for the same n and seed).

    Greedy decoding gives ``accuracy`` and ``format_rate``; ``k`` sampled completions per problem at ``temperature``
    (seeded by ``seed``) give ``sampled_accuracy`` (pass@1), ``sampled_format_rate`` and ``pass_at_k``. ``k=0`` skips
    the sampling. ``chat=True`` asks each question as a user turn of the tokenizer's chat template.
    """
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    problems = make_problems(task, "heldout", n, seed)
    if not problems:
        raise ValueError("n must be at least 1")
    prompts = [render_prompt(tokenizer, p.prompt, chat) for p in problems]
    correct, formatted, texts = _score(task, problems, prompts, model, tokenizer, batch_size, greedy=True)
    sampled = (None, None, None)
    if k:
        generator = torch.Generator(next(model.parameters()).device).manual_seed(seed)
        s_correct, s_formatted, _ = _score(
            task, problems * k, prompts * k, model, tokenizer, batch_size, temperature=temperature, generator=generator
        )
        per_problem = s_correct.view(k, n)  # (k, n): row j holds the j-th sample of every problem
        sampled = (s_correct.mean().item(), s_formatted.mean().item(), per_problem.amax(0).mean().item())
    return Evaluation(
        n=n,
        accuracy=correct.mean().item(),
        format_rate=formatted.mean().item(),
        k=k,
        temperature=temperature,
        sampled_accuracy=sampled[0],
        sampled_format_rate=sampled[1],
        pass_at_k=sampled[2],
        examples=[(p.prompt, text) for p, text in zip(problems, texts)][:5],
        digit_share=sum(map(digit_share, texts)) / n,
    )
