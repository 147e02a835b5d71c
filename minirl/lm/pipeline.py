"""DeepSeek-R1's training pipeline at classroom scale (``notebooks/12_r1_pipeline_and_distillation.ipynb``).

R1 is trained in stages: a cold start (SFT on a small set of clean traces), reasoning RL (GRPO on verifiable
rewards), rejection-sampling SFT (sample many answers from the RL model, keep the verified ones, fine-tune the *base*
model on them), and a last RL round. Its distilled models are smaller base models fine-tuned on the same kind of
verified traces. Here every stage is one function on the tiny LM:

    cold start            ``cold_start(ColdStartConfig)``: ``sft.train`` on ``reference_traces(task, n)``
    reasoning RL          ``reasoning_rl(model, tokenizer, GRPOConfig)``      (``grpo.train`` from a model in memory)
    rejection sampling    ``rejection_sample(model, tokenizer, task, problems, k)`` -> ``Traces``
    SFT on traces         ``sft_on_traces(DistillConfig)``: rejection sampling from ``teacher``, then SFT of ``student``

Rejection-sampling SFT and distillation are the same stage; only the student differs: a fresh copy of the base model
the teacher came from (R1's stage 3), or a smaller model (R1's distilled Qwen and Llama models).

Compute is counted in token-passes (``sft_compute``, ``grpo_compute``): a token through a forward pass costs 1, through
a forward and a backward pass 3 (a backward costs about two forwards: Kaplan et al. 2020's 2N and 6N FLOPs per token).
Only real tokens count, never padding; the teacher's own cost is not the student's and is left out, as in the paper.
"""

import dataclasses
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minirl import _validate
from minirl.course import use_threads
from minirl.lm import distributed, grpo, sft
from minirl.lm.config import GRPOConfig
from minirl.lm.evaluation import evaluate
from minirl.lm.model import checkpoint_folder, load, save
from minirl.lm.pipeline_config import CHECKPOINTS, KEEPS, STUDENT, TEACHER, ColdStartConfig, DistillConfig  # noqa: F401
from minirl.lm.sampling import sample
from minirl.lm.tasks import TASKS, Problem, format_ok, get_task, is_correct, make_problems, token_budget


def verified(task, problem: Problem, text: str) -> bool:
    """R1's filter for its SFT data: the answer is right (the rule-based verifier) AND the completion is readable
    (here: exactly ``<think>..</think><answer>..</answer>``, ``tasks.format_ok``)."""
    return is_correct(task, problem, text) and format_ok(text)


def keep_fn(keep: str):
    """The filter named ``keep``: "verified" (right and readable), "correct" (right, any shape), "all" (no filter)."""
    _validate.one_of("keep", keep, KEEPS)
    if keep == "verified":
        return verified
    if keep == "correct":
        return is_correct
    return lambda task, problem, text: True


@dataclass
class Traces:
    """What ``rejection_sample`` kept: ``examples`` as ``(prompt, completion)`` pairs, with the counts behind them."""

    examples: list[tuple[str, str]]
    problems: list[Problem]  # the problem of each kept example, in the same order
    sampled: int  # completions drawn (prompts x k)
    correct: int  # of those, with the right answer
    readable: int  # of those, in the exact template
    solved: int  # prompts with at least one kept completion

    @property
    def keep_rate(self) -> float:
        return len(self.examples) / max(1, self.sampled)


def rejection_sample(
    model,
    tokenizer,
    task,
    problems: list[Problem],
    k: int = 4,
    temperature: float = 1.0,
    seed: int = 0,
    keep: str = "verified",
    per_prompt: int = 1,
    batch_size: int = 512,
) -> Traces:
    """Sample ``k`` completions per problem at ``temperature`` and keep those that pass the ``keep`` filter, at most
    ``per_prompt`` distinct ones per problem (duplicates would weight the easy problems, which every sample solves)."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer (completions per prompt), got {k!r}")
    if not isinstance(per_prompt, int) or per_prompt < 1:
        raise ValueError(f"per_prompt must be a positive integer, got {per_prompt!r}")
    if not problems:
        raise ValueError("problems must not be empty")
    accept = keep_fn(keep)
    rows = [p for p in problems for _ in range(k)]  # (N * k,) each problem's k rows consecutive
    generator = torch.Generator(next(model.parameters()).device).manual_seed(seed)
    texts, budget = [], token_budget(task, tokenizer)
    for i in range(0, len(rows), batch_size):
        prompts = [p.prompt for p in rows[i : i + batch_size]]
        smp = sample(model, tokenizer, prompts, budget, temperature=temperature, generator=generator)
        texts += smp.text
    examples, kept_problems, chosen = [], [], {}
    correct = readable = 0
    for problem, text in zip(rows, texts):
        correct += is_correct(task, problem, text)
        readable += format_ok(text)
        mine = chosen.setdefault(problem.prompt, set())
        if len(mine) < per_prompt and text not in mine and accept(task, problem, text):
            mine.add(text)
            examples.append((problem.prompt, text))
            kept_problems.append(problem)
    solved = sum(1 for v in chosen.values() if v)
    return Traces(examples, kept_problems, len(rows), correct, readable, solved)


def reference_traces(task, n: int, seed: int = 0) -> list[Problem]:
    """``n`` training problems with the task's own written solution: the clean, human-written traces of a cold start."""
    return make_problems(task, "train", n, seed)


# --- compute, in token-passes: 1 per token forward, 3 per token forward + backward ---


def sft_compute(tokenizer, examples, steps: int, batch_size: int) -> float:
    """Token-passes of ``steps`` SFT steps of ``batch_size`` examples: 3 x the mean real tokens of an example x the
    examples trained on (each example is bos + prompt + completion + eos)."""
    ids, mask, _ = sft.encode(tokenizer, examples)
    return 3.0 * mask.sum(1).float().mean().item() * steps * batch_size


def grpo_compute(history_rows: list[dict], prompt_tokens: float, group_size: int, prompts_per_step: int) -> float:
    """Token-passes of a GRPO run from its history: each step samples B rows (1 per prompt and completion token, with
    a KV cache) and trains ``rows_computed`` of them (3 per token; zero-advantage rows skip the passes)."""
    total = 0.0
    for row in history_rows:
        tokens = prompt_tokens + row["length"]  # a row's real tokens (the completion length includes the eos)
        total += group_size * prompts_per_step * tokens + 3.0 * row["rows_computed"] * tokens
    return total


def prompt_tokens(tokenizer, task, n: int = 64) -> float:
    """Mean tokens of a training prompt, bos included."""
    return sum(len(tokenizer(p.prompt)["input_ids"]) for p in make_problems(task, "train", n, 99)) / n


# --- stages ---


def reasoning_rl(model, tokenizer, cfg: GRPOConfig, **kwargs) -> grpo.GRPOResult:
    """``grpo.train`` starting from a model in memory: saved to a temporary folder that ``cfg.model`` then names."""
    with tempfile.TemporaryDirectory() as tmp:
        save(model, tokenizer, Path(tmp) / "start", {"note": "pipeline.reasoning_rl start"})
        return grpo.train(dataclasses.replace(cfg, model=str(Path(tmp) / "start")), **kwargs)


def check_config(cfg: DistillConfig | ColdStartConfig) -> DistillConfig | ColdStartConfig:
    """Check every field of ``cfg`` (type and range) before any work; raise naming the field and what it allows."""
    positive = ("prompts", "k", "temperature", "per_prompt", "traces", "steps", "batch_size", "lr", "eval_n")
    positive = tuple(f for f in positive if hasattr(cfg, f))  # the fields of the two configs that must be > 0
    nonneg = ("warmup_steps", "seed", "threads")
    choices = {f: allowed for f, allowed in (("keep", KEEPS), ("task", tuple(TASKS))) if hasattr(cfg, f)}
    return _validate.check_config(cfg, positive, nonneg, choices=choices)


@dataclass
class ColdStartResult:
    """The fine-tuned model, held-out scores before and after (``Evaluation``), and the SFT's history."""

    model: object
    tokenizer: object
    before: object
    after: object
    compute: float  # token-passes of the SFT
    history: list[dict] = field(default_factory=list)


def cold_start(cfg: ColdStartConfig, progress: bool = False) -> ColdStartResult:
    """R1's stage 1: SFT of a fresh copy of ``cfg.model`` on ``cfg.traces`` reference solutions of ``cfg.task``."""
    check_config(cfg)
    use_threads(cfg.threads)
    if cfg.out:
        checkpoint_folder(cfg.out)  # refuse a folder minirl did not write, before any work
    task = get_task(cfg.task)
    distributed.init(cfg.device)  # under torchrun: join the other processes before choosing this one's device
    model, tokenizer = load(cfg.model, device=distributed.device(cfg.device))
    examples = reference_traces(task, cfg.traces, cfg.seed)
    before = evaluate(model, tokenizer, task, n=cfg.eval_n, k=1)
    sft_cfg = sft.SFTConfig(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                            eval_every=cfg.steps, seed=cfg.seed)  # fmt: skip
    result = sft.train(model, tokenizer, examples, sft_cfg, progress=progress)
    after = evaluate(model, tokenizer, task, n=cfg.eval_n, k=1)
    compute = sft_compute(tokenizer, examples, cfg.steps, cfg.batch_size)
    if cfg.out and distributed.is_main():  # under torchrun every process holds the same model: one writes it
        save(model, tokenizer, cfg.out, {"config": dataclasses.asdict(cfg), "heldout": heldout_record(after)})
    return ColdStartResult(model, tokenizer, before, after, compute, result.history)


def heldout_record(ev) -> dict:
    """The scores of an ``Evaluation`` as stored in a checkpoint's ``minirl.json``."""
    record = {"n": ev.n, "greedy_accuracy": round(ev.accuracy, 4), "greedy_format_rate": round(ev.format_rate, 4),
              "greedy_digit_share": round(ev.digit_share, 4)}  # fmt: skip
    if ev.sampled_accuracy is not None:
        record.update({"temperature_1_accuracy": round(ev.sampled_accuracy, 4),
                       "temperature_1_format_rate": round(ev.sampled_format_rate, 4)})  # fmt: skip
    return record


@dataclass
class DistillResult:
    """The trained student, the traces it learned from, and held-out scores before and after (``Evaluation``)."""

    model: object
    tokenizer: object
    traces: Traces
    before: object
    after: object
    compute: float  # the student's token-passes
    seconds: dict = field(default_factory=dict)  # wall seconds: "sample" (teacher), "sft" (student)
    history: list[dict] = field(default_factory=list)


def sft_on_traces(cfg: DistillConfig, progress: bool = False) -> DistillResult:
    """Rejection-sample ``cfg.prompts`` training problems from the teacher, then SFT the student on what was kept."""
    check_config(cfg)
    if cfg.out:
        checkpoint_folder(cfg.out)  # refuse a folder minirl did not write, before any work
    use_threads(cfg.threads)
    task = get_task(cfg.task)
    distributed.init(cfg.device)  # under torchrun: join the other processes before choosing this one's device
    device = distributed.device(cfg.device)
    teacher, tokenizer = load(cfg.teacher, device=device)
    student, student_tok = load(cfg.student, device=device)
    if student_tok.get_vocab() != tokenizer.get_vocab():
        raise ValueError("teacher and student must share a tokenizer: the student learns the teacher's tokens")
    t0 = time.perf_counter()
    problems = make_problems(task, "train", cfg.prompts, cfg.seed)
    traces = rejection_sample(teacher, tokenizer, task, problems, cfg.k, cfg.temperature, cfg.seed, cfg.keep,
                              cfg.per_prompt)  # fmt: skip
    if not traces.examples:
        raise ValueError(f"the teacher kept no completion out of {traces.sampled}: it cannot teach this task")
    t1 = time.perf_counter()
    before = evaluate(student, tokenizer, task, n=cfg.eval_n, k=0)
    sft_cfg = sft.SFTConfig(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                            eval_every=cfg.steps, seed=cfg.seed)  # fmt: skip
    t2 = time.perf_counter()
    result = sft.train(student, tokenizer, traces.examples, sft_cfg, progress=progress)
    t3 = time.perf_counter()
    after = evaluate(student, tokenizer, task, n=cfg.eval_n, k=1)
    compute = sft_compute(tokenizer, traces.examples, cfg.steps, cfg.batch_size)
    if cfg.out and distributed.is_main():  # under torchrun every process holds the same student: one writes it
        meta = {"config": dataclasses.asdict(cfg), "kept": len(traces.examples), "sampled": traces.sampled,
                "heldout": heldout_record(after)}  # fmt: skip
        save(student, tokenizer, cfg.out, meta)
    return DistillResult(student, tokenizer, traces, before, after, compute, {"sample": t1 - t0, "sft": t3 - t2},
                         result.history)  # fmt: skip


# --- what the student inherits ---


def carries(problem: Problem) -> int:
    """Columns that carry a 1 in an addition problem (``c1`` in its reference trace)."""
    return problem.completion.count("c1")


def correct_flags(model, tokenizer, task, problems: list[Problem]) -> torch.Tensor:
    """1.0 where the greedy completion of a problem is right, else 0.0; (N,)."""
    texts = sample(model, tokenizer, [p.prompt for p in problems], token_budget(task, tokenizer), greedy=True).text
    return torch.tensor([float(is_correct(task, p, t)) for p, t in zip(problems, texts)])


def shared_errors(teacher_ok: torch.Tensor, student_ok: torch.Tensor) -> dict:
    """How the student's errors line up with the teacher's on the same problems.

    ``p_wrong`` is the student's error rate; ``p_wrong_given_teacher_wrong`` its error rate where the teacher errs;
    ``lift`` their ratio (1: the errors are independent of the teacher's; above 1: the student fails where the teacher
    fails). ``shared`` is the share of problems both get wrong, ``shared_if_independent`` what chance would give.
    """
    t_wrong, s_wrong = 1 - teacher_ok, 1 - student_ok  # (N,), (N,)
    p_s = s_wrong.mean().item()
    given = (s_wrong * t_wrong).sum().item() / max(1.0, t_wrong.sum().item())
    return {
        "p_wrong": p_s,
        "p_wrong_given_teacher_wrong": given,
        "lift": given / p_s if p_s else float("nan"),
        "shared": (s_wrong * t_wrong).mean().item(),
        "shared_if_independent": p_s * t_wrong.mean().item(),
    }


def make_teacher(out: str | Path = TEACHER, steps: int = 100, seed: int = 0, threads: int = 1) -> grpo.GRPOResult:
    """The committed RL teacher: GRPO with the trainer's defaults from ``tiny-adder`` for ``steps`` steps, saved.

    ``python -c "from minirl.lm import pipeline; pipeline.make_teacher()"`` remakes ``checkpoints/tiny-adder-r1``
    (about 7 minutes on one thread of a busy 2-core machine; the same file for the same machine and thread count).
    """
    cfg = GRPOConfig(steps=steps, eval_every=25, eval_n=200, seed=seed, threads=threads)
    result = grpo.train(cfg)
    final = evaluate(result.model, result.tokenizer, get_task(cfg.task), n=500, k=1)
    meta = {
        "command": f'python -c "from minirl.lm import pipeline; pipeline.make_teacher(steps={steps}, seed={seed})"',
        "config": dataclasses.asdict(cfg),
        "evals": result.evals,
        "heldout": heldout_record(final),
        "parameters": sum(p.numel() for p in result.model.parameters()),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
    }
    save(result.model, result.tokenizer, out, meta)
    return result
