"""R1's cold start against a bare start, on the course's tiny model, over seeds (notebook 12, section 2).

Both arms start from ``tiny-adder-plain``, which never wrote the R1 tags. The bare start runs GRPO on it directly
(R1-Zero style: the accuracy reward reads the answer inside ``<answer>..</answer>``); the cold start first fine-tunes it
on 64 clean traces (``pipeline.reference_traces``, 80 SFT steps of 16, lr 1e-3), then runs the same GRPO. GRPO uses
the trainer's defaults (16 prompts x 8 completions, temperature 1, lr 1e-4, beta 0) for ``--steps`` steps. Reported:
greedy held-out accuracy and format rate (200 problems) at each evaluation, and the wall time, on one thread.

    python benchmarks/r1_pipeline.py --seeds 0 1 --steps 30
"""

import argparse
import dataclasses
import time

import torch
from _stamp import RESULTS, stamp

from minirl.lm import grpo, load, pipeline, sft
from minirl.lm.config import PRETRAINED, GRPOConfig
from minirl.lm.tasks import get_task

PLAIN = str(PRETRAINED.parent / "tiny-adder-plain")


def run(seed: int, steps: int, cold: bool) -> tuple[list[dict], float]:
    """Evaluations of one arm ({"step", "heldout_accuracy", "heldout_format"}) and its wall seconds."""
    t0 = time.perf_counter()
    cfg = GRPOConfig(steps=steps, eval_every=10, eval_n=200, seed=seed, threads=1)
    if not cold:
        return grpo.train(dataclasses.replace(cfg, model=PLAIN)).evals, time.perf_counter() - t0
    model, tok = load(PLAIN, device="cpu")
    traces = pipeline.reference_traces(get_task("addition"), 64, seed=seed)
    sft.train(model, tok, traces, sft.SFTConfig(steps=80, batch_size=16, lr=1e-3, warmup_steps=5, seed=seed))
    return pipeline.reasoning_rl(model, tok, cfg).evals, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    header = "| start | seed | accuracy (format) at RL steps 0, 10, 20, ... | wall s |"
    lines = [stamp(("torch", "transformers")), "", f"GRPO steps: {args.steps}; greedy held-out accuracy (format) "
             "at each evaluation, 200 problems; wall seconds on one thread, cold-start SFT included.", "",
             header, "|---|---|---|---|"]  # fmt: skip
    for cold in (False, True):
        for seed in args.seeds:
            evals, seconds = run(seed, args.steps, cold)
            cells = " / ".join(f"{e['heldout_accuracy']:.1%} ({e['heldout_format']:.0%})" for e in evals)
            lines.append(f"| {'cold start' if cold else 'bare'} | {seed} | {cells} | {seconds:.0f} |")
            print(lines[-1], flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "r1_pipeline.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
