"""The student's wait: LM GRPO from the committed checkpoint, held-out greedy accuracy inside 10 minutes of wall time.

    python benchmarks/grpo_ten_minutes.py                      # 3 seeds, 10 minutes each, one after another
    python benchmarks/grpo_ten_minutes.py --lr 2e-4 --warmup-steps 20    # a faster rate after a linear warm-up

Each seed is one ``minirl lm grpo`` command in its own process, exactly as a student would type it (16 prompts x 8
completions, temperature 1, AdamW lr 1e-4 with a cosine down to 1e-5 at the last step, beta 0, accuracy reward only),
evaluated greedily on 500 held-out problems at step 0 and five times more, the last at the end. The clock runs from
the command's start, so loading the model and every evaluation count; a run still going at 10 minutes is stopped,
and its last saved evaluation is its result. Writes ``benchmarks/results/grpo_ten_minutes.md`` and
``figures/benchmark_grpo_ten_minutes.png``.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from _stamp import RESULTS, stamp

from minirl.lm import runs
from minirl.plotting import FIGURES

LIMIT_S = 600.0  # the student's ten minutes
TARGET = 0.95  # held-out greedy accuracy to reach inside them
ROUNDING = 1e-6  # accuracies are saved as float32: 475 / 500 reads 0.94999999


def command(seed: int, out: Path, recipe: argparse.Namespace) -> list[str]:
    """The ``minirl lm grpo`` command of one seed, with six evaluations and a checkpoint at each."""
    steps = recipe.steps
    beside = Path(sys.executable).parent / "minirl"  # the venv's command, also when the venv is not activated
    every = str(-(-steps // 5))  # five evaluations after step 0, the last at the end
    return [str(beside) if beside.exists() else "minirl", "lm", "grpo", "--steps", str(steps), "--eval-every", every,
            "--eval-n", "500", "--save-every", every, "--schedule", recipe.schedule, "--lr", str(recipe.lr),
            "--warmup-steps", str(recipe.warmup_steps), "--seed", str(seed), "--out", str(out)]  # fmt: skip


def run_seed(seed: int, recipe: argparse.Namespace) -> dict:
    """Run one seed for at most ``LIMIT_S`` seconds; returns its wall time, steps and evaluations."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        start = time.perf_counter()
        proc = subprocess.Popen(command(seed, out, recipe), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _, err = proc.communicate(timeout=LIMIT_S)
            stopped = False
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            stopped = True
        wall = time.perf_counter() - start
        if not stopped and proc.returncode != 0:
            raise RuntimeError(f"seed {seed}: minirl lm grpo failed:\n{err.decode()[-2000:]}")
        saved = runs.load_run(out)  # the last complete checkpoint (a kill mid-save leaves the one before)
    if saved is None:
        raise RuntimeError(f"seed {seed}: no checkpoint within {LIMIT_S:.0f} s; is another program using the CPU?")
    state, rows = saved.state, saved.state["rows"]
    return {
        "seed": seed,
        "wall": wall,
        "stopped": stopped,
        "steps": state["step"],
        "step_s": sum(r["sample_s"] + r["train_s"] for r in rows) / len(rows),
        "evals": [(e["step"], e["heldout_accuracy"]) for e in state["evals"]],
    }


def table(results: list[dict], recipe: argparse.Namespace) -> list[str]:
    marks = [s for s, _ in results[0]["evals"] if s > 0]
    lines = [
        "# LM GRPO inside 10 minutes: held-out greedy accuracy from the committed checkpoint",
        "",
        stamp(("torch", "transformers")),
        f"Command per seed S: `minirl {' '.join(command(0, Path('OUT'), recipe)[1:-4])} --seed S --out OUT`, "
        f"stopped at {LIMIT_S:.0f} s if still running; the seeds one after another, nothing else running. Held-out "
        "accuracy: greedy, 500 problems.",
        "",
        "| seed | wall (s) | steps | s/step (sample + train) | "
        + " | ".join(f"step {s}" for s in marks)
        + f" | last evaluation | >= {TARGET:.0%} |",
        "|---|---|---|---|" + "---|" * len(marks) + "---|---|",
    ]
    for r in results:
        acc = dict(r["evals"])
        last = r["evals"][-1][1]
        cells = [f"{100 * acc[s]:.1f}%" if s in acc else "-" for s in marks]
        wall = f"{r['wall']:.0f}" + (" (stopped)" if r["stopped"] else "")
        lines.append(
            f"| {r['seed']} | {wall} | {r['steps']} | {r['step_s']:.2f} | {' | '.join(cells)} | "
            f"**{100 * last:.1f}%** | {'yes' if last >= TARGET - ROUNDING else 'no'} |"
        )
    hits = sum(r["evals"][-1][1] >= TARGET - ROUNDING for r in results)
    lines += ["", f"{hits} of {len(results)} seeds at {TARGET:.0%} or more inside {LIMIT_S / 60:.0f} minutes."]
    return lines


def plot(results: list[dict]) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in results:
        steps, acc = zip(*r["evals"])
        ax.plot(steps, [100 * a for a in acc], marker="o", label=f"seed {r['seed']} ({r['wall']:.0f} s)")
    ax.axhline(100 * TARGET, color="grey", linestyle="--", linewidth=1, label=f"{TARGET:.0%}")
    ax.set(xlabel="GRPO step", ylabel="held-out greedy accuracy (%)",
           title="GRPO from the committed checkpoint, 10 minutes on 2 cores")  # fmt: skip
    ax.legend(loc="lower right")
    fig.tight_layout()
    FIGURES.mkdir(exist_ok=True)
    path = FIGURES / "benchmark_grpo_ten_minutes.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--schedule", default="cosine", choices=("cosine", "constant"))
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup-steps", type=int, default=0)
    args = parser.parse_args()
    results = []
    for seed in args.seeds:
        results.append(run_seed(seed, args))
        r = results[-1]
        print(f"seed {seed}: {r['steps']} steps in {r['wall']:.0f} s, held-out {r['evals'][-1][1]:.1%}", flush=True)
    lines = table(results, args)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "grpo_ten_minutes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {RESULTS / 'grpo_ten_minutes.md'} and {plot(results)}")


if __name__ == "__main__":
    main()
