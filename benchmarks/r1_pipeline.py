"""The stages of R1's pipeline on the course's tiny models, over seeds (notebook 12). One table per stage:

- ``--stage cold-start``: a cold start against a bare start. Both arms start from ``tiny-adder-plain``, which never
  wrote the R1 tags. The bare start runs GRPO on it directly (R1-Zero style: the accuracy reward reads the answer
  inside ``<answer>..</answer>``); the cold start first fine-tunes it on 64 clean traces
  (``pipeline.reference_traces``, 80 SFT steps of 16, lr 1e-3), then runs the same GRPO.
- ``--stage consistency``: GRPO from ``tiny-adder-mixed`` (traces in two notations) on ``addition-mixed``, with the
  accuracy reward alone and with R1's language-consistency reward added (``--consistency-weight``, the share of the
  trace written in digits). Reported: held-out accuracy and digit share at each evaluation.
- ``--stage distillation``: the small student trained by GRPO, against the same student fine-tuned on the RL
  teacher's verified traces for the same compute and for four times it (``pipeline.grpo_compute``/``sft_compute``).

GRPO uses the trainer's defaults (16 prompts x 8 completions, temperature 1, lr 1e-4, beta 0). Greedy held-out scores
on 200 problems; wall seconds on one thread.

    python benchmarks/r1_pipeline.py --stage cold-start --seeds 0 1 --steps 100
    python benchmarks/r1_pipeline.py --stage consistency --seeds 0 1 2 --steps 40
    python benchmarks/r1_pipeline.py --stage distillation --seeds 0 1 2 --steps 60
"""

import argparse
import dataclasses
import time

import torch
from _stamp import RESULTS, stamp

from minirl.lm import evaluate, grpo, load, pipeline, sft, tasks
from minirl.lm.config import PRETRAINED, GRPOConfig

PLAIN = str(PRETRAINED.parent / "tiny-adder-plain")
MIXED = str(PRETRAINED.parent / "tiny-adder-mixed")
EVAL_EVERY = 10


def cold_start(seed: int, steps: int, cold: bool) -> tuple[list[dict], float]:
    """Evaluations of one arm ({"step", "heldout_accuracy", "heldout_format", ...}) and its wall seconds."""
    t0 = time.perf_counter()
    cfg = GRPOConfig(steps=steps, eval_every=EVAL_EVERY, eval_n=200, seed=seed, threads=1)
    if not cold:
        return grpo.train(dataclasses.replace(cfg, model=PLAIN)).evals, time.perf_counter() - t0
    model, tok = load(PLAIN, device="cpu")
    traces = pipeline.reference_traces(tasks.get_task("addition"), 64, seed=seed)
    sft.train(model, tok, traces, sft.SFTConfig(steps=80, batch_size=16, lr=1e-3, warmup_steps=5, seed=seed))
    return pipeline.reasoning_rl(model, tok, cfg).evals, time.perf_counter() - t0


def cold_start_table(seeds: list[int], steps: int) -> list[str]:
    lines = [f"GRPO steps: {steps}; greedy held-out accuracy (format) every {EVAL_EVERY} steps, 200 problems; wall "
             "seconds on one thread, cold-start SFT included.", "",
             "| start | seed | accuracy (format) at RL steps 0, 10, 20, ... | wall s |",
             "|---|---|---|---|"]  # fmt: skip
    for cold in (False, True):
        for seed in seeds:
            evals, seconds = cold_start(seed, steps, cold)
            cells = " / ".join(f"{e['heldout_accuracy']:.1%} ({e['heldout_format']:.0%})" for e in evals)
            lines.append(f"| {'cold start' if cold else 'bare'} | {seed} | {cells} | {seconds:.0f} |")
            print(lines[-1], flush=True)
    return lines


def consistency_table(seeds: list[int], steps: int, weight: float) -> list[str]:
    lines = [f"GRPO steps: {steps} from `tiny-adder-mixed` on `addition-mixed`; greedy held-out accuracy (share of the "
             f"trace's numerals in digits) every {EVAL_EVERY} steps, 200 problems; wall seconds on one thread.", "",
             "| reward | seed | accuracy (digit share) at RL steps 0, 10, 20, ... | wall s |",
             "|---|---|---|---|"]  # fmt: skip
    for w in (0.0, weight):
        for seed in seeds:
            t0 = time.perf_counter()
            cfg = GRPOConfig(model=MIXED, task="addition-mixed", steps=steps, eval_every=EVAL_EVERY, eval_n=200,
                             seed=seed, consistency_weight=w, threads=1)  # fmt: skip
            evals = grpo.train(cfg).evals
            cells = " / ".join(f"{e['heldout_accuracy']:.1%} ({e['heldout_digit_share']:.0%})" for e in evals)
            name = f"accuracy + {w:g} x consistency" if w else "accuracy"
            lines.append(f"| {name} | {seed} | {cells} | {time.perf_counter() - t0:.0f} |")
            print(lines[-1], flush=True)
    return lines


def distillation_table(seeds: list[int], steps: int) -> list[str]:
    task = tasks.get_task("addition")
    teacher, tok = load(pipeline.TEACHER, device="cpu")
    lines = [f"Student `tiny-student` (0.11M); GRPO: {steps} steps; distillation: SFT (batch 32, lr 1e-3) on the RL "
             "teacher's verified traces (600 prompts x 4 samples at T=1) for the GRPO run's compute (1x) and 4x; "
             "compute in token-passes; greedy held-out accuracy, 200 problems.", "",
             "| seed | start | GRPO | compute | distilled 1x | distilled 4x | compute 4x |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for seed in seeds:
        traces = pipeline.rejection_sample(teacher, tok, task, tasks.make_problems(task, "train", 600, seed), k=4,
                                           seed=seed)  # fmt: skip
        start, _ = load(pipeline.STUDENT, device="cpu")
        start_acc = evaluate(start, tok, task, n=200, k=0).accuracy
        g = grpo.train(GRPOConfig(model=str(pipeline.STUDENT), steps=steps, eval_every=steps, eval_n=200, seed=seed,
                                  threads=1))  # fmt: skip
        compute = pipeline.grpo_compute(g.history.rows, pipeline.prompt_tokens(tok, task), 8, 16)
        per_step = pipeline.sft_compute(tok, traces.examples, steps=1, batch_size=32)
        matched = max(1, round(compute / per_step))
        accs = []
        for n_steps in (matched, 4 * matched):
            student, _ = load(pipeline.STUDENT, device="cpu")
            sft.train(student, tok, traces.examples, sft.SFTConfig(steps=n_steps, batch_size=32, lr=1e-3,
                                                                   warmup_steps=10, eval_every=n_steps, seed=seed))
            accs.append(evaluate(student, tok, task, n=200, k=0).accuracy)
        lines.append(f"| {seed} | {start_acc:.1%} | {g.evals[-1]['heldout_accuracy']:.1%} | {compute:.3g} | "
                     f"{accs[0]:.1%} | {accs[1]:.1%} | {4 * per_step * matched:.3g} |")  # fmt: skip
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("cold-start", "consistency", "distillation"), default="cold-start")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--consistency-weight", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.stage == "cold-start":
        lines = cold_start_table(args.seeds, args.steps)
    elif args.stage == "consistency":
        lines = consistency_table(args.seeds, args.steps, args.consistency_weight)
    else:
        lines = distillation_table(args.seeds, args.steps)
    lines = [stamp(("torch", "transformers")), ""] + lines
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"r1_{args.stage.replace('-', '_')}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
