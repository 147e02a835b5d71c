"""Checks of the language-model half: token log-probs, the RLHF token reward, R1's format reward and its SFT filter.

The package modules behind the last three import transformers, which takes seconds: each check imports its module
when it runs, so that ``import minirl.checks`` stays quick.

Shapes
    B   completions (rows), L tokens per row, C completion tokens, V vocabulary
"""

import importlib

import torch

from minirl.checks.core import Case, generator, run


def reference_token_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log pi(ids_t | ids_<t) of the temperature-scaled softmax, (B, L, V) logits and (B, L) ids -> (B, L).

    The logits at column t score the token at column t + 1; column 0 has no context and holds 0. The layout of
    ``minirl.lm.logprobs`` (which also zeroes padding), computed here with ``torch.log_softmax``.
    """
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)  # (B, L-1, V)
    logp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, L-1): token t+1 given tokens <= t
    return torch.nn.functional.pad(logp, (1, 0))  # (B, L)


def check_token_logprobs(fn) -> None:
    """Check ``fn(logits, ids, temperature=1.0)`` -> (B, L) log-probs of the tokens in ``ids`` against
    ``reference_token_logprobs`` (``notebooks/08_tiny_lm.ipynb``):
    log pi(o_t | q, o_<t) = log softmax(z_{t-1} / tau)[o_t], and 0 in column 0."""
    gen = generator(8)
    B, L, V = 2, 5, 7
    logits = torch.randn(B, L, V, generator=gen) * 2  # (B, L, V)
    ids = torch.randint(V, (B, L), generator=gen)  # (B, L)
    shift = ("the logits at column t score the NEXT token: log_softmax(logits[:, t])[ids[:, t + 1]] goes in column "
             "t + 1, and column 0 (no context) holds 0; gather the chosen ids with .gather(-1, ids[..., None])")
    temperature = "divide the logits by the temperature before the log_softmax, as the sampler did"
    unlikely = ("torch.log(torch.softmax(z)) underflows to log(0) = -inf for a very unlikely token; torch.log_softmax "
                "computes the same number exactly")
    far = logits.clone()
    far[0, :, 0] += 200.0  # token 0 is by far the likeliest everywhere in row 0, so the others are very unlikely
    cases = [
        Case("one row, temperature 1", dict(logits=logits[:1], ids=ids[:1], temperature=1.0), shift),
        Case("two rows", dict(logits=logits, ids=ids, temperature=1.0), shift),
        Case("temperature 0.5", dict(logits=logits, ids=ids, temperature=0.5), temperature),
        Case("temperature 2", dict(logits=logits, ids=ids, temperature=2.0), temperature),
        Case("very unlikely tokens (200 below the best logit)", dict(logits=far, ids=ids.clamp(min=1),
                                                                      temperature=1.0), unlikely),
    ]
    for i in range(2):
        B, L, V = 3, 6, 11
        random = dict(logits=torch.randn(B, L, V, generator=gen) * 3, ids=torch.randint(V, (B, L), generator=gen),
                      temperature=(0.7, 1.3)[i])
        cases.append(Case(f"random batch {i + 1}", random, f"{shift}; {temperature}"))
    run("check_token_logprobs", fn, reference_token_logprobs, cases)


def check_token_rewards(fn) -> None:
    """Check ``fn(score, logp, ref_logp, mask, ended, beta)`` against ``minirl.lm.rlhf.token_rewards``
    (``notebooks/09_rlhf_ppo.ipynb``): r_t = -beta * (logp_t - ref_logp_t) on every completion token, plus the reward
    model's score on the last token of a completion that ended with eos (Ouyang et al. 2022 Eq. 2)."""
    rlhf = importlib.import_module("minirl.lm.rlhf")
    gen = generator(9)
    logp = torch.tensor([[-1.0, -0.5, -0.2, -0.1], [-0.3, -0.3, -0.3, -0.3]])  # (B, C)
    ref_logp = torch.tensor([[-1.2, -0.5, -0.1, -0.4], [-0.3, -0.4, -0.2, -0.5]])  # (B, C)
    full = torch.ones(2, 4, dtype=torch.bool)
    padded = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool()  # row 0 ends at its third token

    def args(mask=full, ended=(True, True), beta=0.1, score=(1.5, -2.0)):
        return dict(score=torch.tensor(score), logp=logp, ref_logp=ref_logp, mask=mask, ended=torch.tensor(ended),
                    beta=beta)

    penalty = ("r_t = -beta * (logp_t - ref_logp_t) on every completion token, and the reward model's score is added "
               "on the last token only (the eos), not spread over the completion")
    truncated = ("a completion cut by the token budget (ended=False) gets no score, only the KL penalty: the critic "
                 "bootstraps its future instead")
    padding = ("outside the mask the reward is 0: multiply the penalty by the mask, and add the score on each row's "
               "last True column of the mask, which is not the last column when the row is padded")
    cases = [
        Case("both completions ended with eos, no padding", args(), penalty),
        Case("beta = 0: the score alone", args(beta=0.0), penalty),
        Case("score 0: the KL penalty alone", args(score=(0.0, 0.0)), penalty),
        Case("the second completion was truncated", args(ended=(True, False)), truncated),
        Case("padding after the eos of row 0", args(mask=padded, ended=(True, False)), padding),
    ]
    for i in range(2):
        B, C = 4, 6
        lengths = torch.randint(1, C + 1, (B,), generator=gen)  # (B,) tokens of each completion, eos included
        mask = torch.arange(C)[None, :] < lengths[:, None]  # (B, C)
        random = dict(score=torch.randn(B, generator=gen), logp=-torch.rand(B, C, generator=gen) * 2,
                      ref_logp=-torch.rand(B, C, generator=gen) * 2, mask=mask,
                      ended=torch.rand(B, generator=gen) < 0.6, beta=0.05)
        cases.append(Case(f"random batch {i + 1}", random, f"{penalty}; {truncated}; {padding}"))
    run("check_token_rewards", fn, rlhf.token_rewards, cases)


def check_format_reward(fn) -> None:
    """Check ``fn(prompts, completions, answers)`` -> one float per completion against
    ``minirl.lm.rewards.format_reward`` (``notebooks/11_r1_zero.ipynb``): 1.0 when the completion is exactly
    ``<think>...</think><answer>...</answer>``, each tag once, nothing around it; else 0.0."""
    rewards = importlib.import_module("minirl.lm.rewards")

    def args(*completions):
        n = len(completions)
        return dict(prompts=["347+585="] * n, completions=list(completions), answers=["932"] * n)

    exact = "1.0 when the completion is exactly <think>...</think><answer>...</answer>, else 0.0; one float per item"
    cases = [
        Case("the exact template", args("<think>7+5=12 c1</think><answer>932</answer>"), exact),
        Case("a missing closing tag", args("<think>7+5=12</think><answer>932", "<think>7+5=12<answer>932</answer>"),
             "all four tags must be there: a completion without </answer> or </think> is not in the template"),
        Case("text around the template", args("so <think>x</think><answer>932</answer>",
                                              "<think>x</think><answer>932</answer> and more",
                                              "<think>x</think> <answer>932</answer>"),
             "nothing may stand before <think>, between </think> and <answer>, or after </answer>: match the whole "
             "string (re.fullmatch), not a search"),
        Case("nested or repeated tags", args("<think><think>x</think></think><answer>932</answer>",
                                             "<think>x</think><answer>1</answer><answer>932</answer>"),
             "each tag exactly once: a greedy .* happily swallows a second <think> or <answer>, so count the tags too"),
        Case("tags in the wrong order", args("<answer>932</answer><think>x</think>",
                                             "<think>x<answer>932</answer></think>"),
             "the order is <think>, </think>, <answer>, </answer>"),
        Case("empty parts and line breaks", args("<think></think><answer></answer>",
                                                 "<think>7+5=12\n4+8+1=13</think><answer>932</answer>"),
             "the two parts may be empty or span lines: with re, use re.DOTALL so that . also matches a newline"),
        Case("an empty completion", args(""), exact),
        Case("a batch of all of the above", args("<think>a</think><answer>1</answer>", "", "<think>a</think>",
                                                 "<think>a</think><answer>1</answer>!",
                                                 "<think>\n</think><answer>2</answer>"),
             f"{exact}, in the order of the completions"),
    ]
    run("check_format_reward", fn, rewards.format_reward, cases)


def check_verified(fn) -> None:
    """Check ``fn(task, problem, text)`` -> bool against ``minirl.lm.pipeline.verified``
    (``notebooks/12_r1_pipeline_and_distillation.ipynb``): R1's rejection-sampling filter keeps a completion only
    when its answer is right AND it is exactly ``<think>...</think><answer>...</answer>``."""
    pipeline = importlib.import_module("minirl.lm.pipeline")
    tasks = importlib.import_module("minirl.lm.tasks")
    addition, sorting = tasks.Addition(3), tasks.Sorting(4)
    problem = addition.solve(347, 585)
    listed = sorting.solve([42, 7, 88, 15])

    def args(text, task=addition, example=problem):
        return dict(task=task, problem=example, text=text)

    both = ("keep a completion when the answer is right (tasks.is_correct) AND it is exactly the template "
            "(tasks.format_ok): R1 kept only correct traces that people can read")
    shown = dict(task="tasks.Addition(3)")
    think = "<think>7+5=12 c1 4+8+1=13 c1 3+5+1=9 c0</think>"
    cases = [
        Case("the target completion", args(problem.completion), both, shown),
        Case("right answer, text after the template", args(problem.completion + " done"),
             "a right answer outside the exact template is not kept: check the format too", shown),
        Case("the template, a wrong answer", args(think + "<answer>933</answer>"),
             "the format alone is not enough: the answer must be right", shown),
        Case("right answer with a leading zero", args(think + "<answer>0932</answer>"),
             "compare answers with task.same_answer (or tasks.is_correct), which allows leading zeros and spaces; "
             "not string equality", shown),
        Case("two answers, one right", args(think + "<answer>1</answer><answer>932</answer>"), both, shown),
        Case("an empty completion", args(""), both, shown),
        Case("sorting, the target completion", args(listed.completion, sorting, listed), both,
             dict(task="tasks.Sorting(4)")),
        Case("sorting, numbers in another order", args("<think>x</think><answer>7 42 15 88</answer>", sorting, listed),
             "the answer is right only when task.same_answer says so", dict(task="tasks.Sorting(4)")),
    ]
    run("check_verified", fn, pipeline.verified, cases)
