"""minirl's LM GRPO against TRL's GRPOTrainer on 3-digit addition: same model, problems, reward and settings.

    pip install -e ".[bench]"
    python benchmarks/grpo_vs_trl.py                    # 3 seeds x 30 steps each, both libraries, about 4 minutes
    python benchmarks/grpo_vs_trl.py --seeds 0 --steps 2
    python benchmarks/grpo_vs_trl.py --threads 2        # both libraries on two threads: grpo_vs_trl_threads2.md

Both sides start from the committed checkpoint ``minirl.lm.PRETRAINED`` (a 0.87M-parameter Llama with a
character-level tokenizer) and train on the same problems in the same order (step s uses
``draw_problems(task, 16, seed, s)``), rewarded by minirl's accuracy reward alone. A step is one round of
16 prompts x G = 8 completions, sampled at temperature 1 (no top-k, no top-p) up to ``task.max_new_tokens`` tokens and
trained on with one AdamW step (lr 1e-4 constant, betas 0.9/0.999, eps 1e-8, no weight decay, gradient norm clipped
to 1): one iteration per batch, clip epsilon 0.2 both sides, beta 0 (no reference model), advantages scaled by the
group's Bessel-corrected std + 1e-4, the loss averaged over each completion's tokens and then over completions
(minirl "seq-mean-token-mean", TRL ``loss_type="grpo"``), truncated completions kept. ``assert_same_hyperparameters``
reads every knob back from both sides; on every TRL step the advantages TRL computed are checked against
``minirl.returns.group_advantages`` of the same rewards, and after training the prompts TRL saw are checked against
minirl's order. TRL's gradient checkpointing (its default) is turned off: it only recomputes activations in the
backward pass and does not change the math; minirl has none.

Both sides run in this process at one torch thread (``--threads N``: N each), alternating per seed, and are scored
by the same function, ``minirl.lm.evaluate(model, tokenizer, task, n=500, k=0).accuracy`` (greedy, held-out
problems). Seconds per step are the training loop's wall time divided by the steps; loading the model and building
the trainer are counted apart ("setup"). minirl's loop time is the sum of its per-step ``sample_s`` and
``train_s``; TRL's runs from the callback ``on_train_begin`` to ``on_train_end``, and its sample time is the time
spent in ``GRPOTrainer._generate_and_score_completions`` (generation, decoding, reward, advantages).

What is not a hyperparameter and differs (also listed in the results file, ``DIFFERENCES``):

- Sampling randomness. minirl seeds a generator per step with (seed, step); TRL samples from torch's global generator,
  seeded once with ``seed`` when the trainer is built. The same seed therefore gives different completions on the two
  sides: compare medians over seeds, not seed by seed.
- Sampler. minirl's own loop with a KV cache; TRL calls ``model.generate`` (also with a KV cache). Both stop a row at
  eos (pad id 0, bos 1, eos 2), keep the eos in the loss mask and pad after it, and decode without special tokens.
- pi_old. With one iteration, TRL takes the policy's own detached log-probs as pi_old (the ratio is exactly 1);
  minirl keeps the log-probs recorded while sampling (the ratio is 1 up to rounding between the cached and uncached
  forward). Clipping is inactive on both sides.
- Log-probs. TRL patches the model with a fused LM head that scores only completion positions and also computes the
  per-token entropy (for logging); minirl scores the last prompt position and the completion, computes each distinct
  prompt of a chunk once and each distinct row (prompt and completion) once, its copies sharing its log-probs. TRL
  passes no position ids; every addition prompt is bos + 8 characters, so there is no left padding and the positions
  agree (asserted).
- Optimizer kernel. TRL's default ``optim="adamw_torch_fused"``; minirl builds ``torch.optim.AdamW`` with defaults
  (the single-tensor loop on CPU). Same update rule.
- TRL shuffles the 128 rows of a round before slicing it into micro-batches; with one micro-batch of 128 the loss is
  a mean over rows and the order does not matter. The dataset itself is not shuffled (``shuffle_dataset=False``).
- Overheads inside the step: TRL's loop also holds its Trainer machinery (dataloader, callbacks, metric gathering,
  logging every 10 steps); minirl's per-step logging (a few ``.item()`` calls) falls outside its ``sample_s`` and
  ``train_s`` and is counted in its setup time instead.
- Warm-up. The first training steps in the process are slower; minirl runs first for each seed, so its seed-0 time
  carries most of that one-off cost.

Writes ``benchmarks/results/grpo_vs_trl.md`` and ``figures/benchmark_grpo_vs_trl.png``.
"""

import argparse
import functools
import inspect
import statistics
import tempfile
import time

import matplotlib
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from _floor import matmul_gflops
from _stamp import RESULTS, stamp
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig as TRLConfig
from trl import GRPOTrainer

from minirl.lm import PRETRAINED, evaluate, load
from minirl.lm import rewards as rw
from minirl.lm.grpo import GRPOConfig, draw_problems, train
from minirl.lm.tasks import get_task
from minirl.plotting import save_figure
from minirl.returns import group_advantages

TASK = "addition"
EVAL_N = 500
LOSS_AGG_OF_TRL = {"grpo": "seq-mean-token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
DIFFERENCES = [
    "Sampling randomness: minirl seeds a generator per step with (seed, step); TRL samples from torch's global "
    "generator, seeded once with the seed when the trainer is built. Same seed, different completions.",
    "Sampler: minirl's own KV-cache loop; TRL's `model.generate` (KV cache). Both stop at eos (pad 0, bos 1, eos 2), "
    "keep the eos in the loss mask, pad after it and decode without special tokens.",
    "pi_old: with one iteration TRL uses the policy's own detached log-probs (ratio exactly 1); minirl the log-probs "
    "recorded while sampling (ratio 1 up to rounding). Clipping is inactive on both sides.",
    "Log-probs: TRL's fused LM head scores only completion positions and also computes per-token entropy (logged); "
    "minirl scores the last prompt position and the completion, each distinct prompt of a chunk computed once and "
    "each distinct row once (its copies share its log-probs). TRL passes no position ids, which is harmless here: "
    "every prompt is bos + 8 characters, no left padding.",
    "Optimizer kernel: TRL's default `adamw_torch_fused`; minirl's `torch.optim.AdamW` defaults. Same update rule.",
    "TRL shuffles the 128 rows of a round before its (single) micro-batch; the loss is a mean over rows, so no effect. "
    "The dataset is not shuffled (`shuffle_dataset=False`); the prompts of each step are checked against minirl's.",
    "Step overheads: TRL's loop includes its Trainer machinery (dataloader, callbacks, metrics, logging every 10 "
    "steps); minirl's per-step logging is counted in its setup time, not in its sample or train time.",
    "Gradient checkpointing is off in TRL (its default is on); it would only recompute activations, not change the "
    "math.",
    "Warm-up: the first training steps in a process are slower; minirl runs first for each seed, so its seed-0 time "
    "carries most of that one-off cost.",
]

THREADS = [
    "Threads: TRL runs every operation on all of them; minirl's sampler splits a batch of at least "
    "2 x `minirl.lm.sampling.SPLIT_ROWS` rows, whose halves' decode steps are below `ONE_THREAD_FLOPS` (a 128-row "
    "batch of this model), into two halves sampled in two threads of one torch thread each (the same tokens), and "
    "runs its training passes on all of them.",
]


def minirl_config(seed: int, steps: int, threads: int = 1) -> GRPOConfig:
    """minirl's side; most values are the defaults, written out because they are what the benchmark is about."""
    return GRPOConfig(
        model=str(PRETRAINED),
        task=TASK,
        steps=steps,
        prompts_per_step=16,
        group_size=8,
        max_new_tokens=0,  # the task's
        temperature=1.0,
        iterations=1,
        clip_low=0.2,
        clip_high=None,
        beta=0.0,
        scale="group",
        loss_agg="seq-mean-token-mean",
        mask_truncated=False,
        drop_zero_variance=False,
        accuracy_weight=1.0,
        format_weight=0.0,
        lr=1e-4,
        weight_decay=0.0,
        max_grad_norm=1.0,
        eval_every=0,  # no evaluation inside the timed loop; both models are scored afterwards by the same function
        seed=seed,
        threads=threads,
        device="cpu",
    )


def trl_config(cfg: GRPOConfig, out_dir: str) -> TRLConfig:
    """TRL's side with minirl's values: one round of N x G completions is one generation and one optimizer step."""
    task = get_task(cfg.task)
    return TRLConfig(
        output_dir=out_dir,
        max_steps=cfg.steps,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.group_size,  # all 128 completions in one micro-batch
        gradient_accumulation_steps=1,
        steps_per_generation=1,  # generation_batch_size = 128 * 1
        num_generations=cfg.group_size,
        max_completion_length=cfg.max_new_tokens or task.max_new_tokens,
        temperature=cfg.temperature,
        top_k=0,
        top_p=1.0,
        num_iterations=cfg.iterations,
        epsilon=cfg.clip_low,
        epsilon_high=cfg.clip_high,
        beta=cfg.beta,
        scale_rewards=cfg.scale,
        loss_type="grpo",
        mask_truncated_completions=cfg.mask_truncated,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        shuffle_dataset=False,
        gradient_checkpointing=False,
        bf16=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=cfg.seed,
    )


def trl_dataset(task, cfg: GRPOConfig, tokenizer) -> Dataset:
    """The problems minirl draws, in its order: rows s*N .. s*N + N - 1 are step s's prompts and answers."""
    problems = [p for step in range(cfg.steps) for p in draw_problems(task, cfg.prompts_per_step, cfg.seed, step)]
    lengths = {len(ids) for ids in tokenizer([p.prompt for p in problems])["input_ids"]}
    assert len(lengths) == 1, f"prompts of different lengths {lengths}: TRL's forward would shift position ids"
    return Dataset.from_dict({"prompt": [p.prompt for p in problems], "answer": [p.answer for p in problems]})


def trl_reward(task, calls: list):
    """minirl's accuracy reward behind TRL's reward-function interface (dataset columns arrive as keyword arguments);
    each call's prompts, completions and rewards are kept in ``calls``."""
    accuracy = rw.accuracy_reward(task)

    def accuracy_reward(prompts, completions, answer, **kwargs) -> list[float]:
        scores = accuracy(prompts, completions, answer)
        calls.append((list(prompts), list(completions), scores))
        return scores

    return accuracy_reward


class Clock(TrainerCallback):
    """Wall time of TRL's training loop, and the optimizer and thread count it runs with."""

    def __init__(self) -> None:
        self.begin = self.end = 0.0
        self.optimizer, self.threads, self.lr_at_end = None, 0, 0.0

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        self.optimizer = getattr(optimizer, "optimizer", optimizer)  # the torch optimizer inside accelerate's wrapper
        self.threads = torch.get_num_threads()
        self.begin = time.perf_counter()

    def on_train_end(self, args, state, control, optimizer=None, **kwargs):
        self.end = time.perf_counter()
        self.lr_at_end = optimizer.param_groups[0]["lr"]


def instrument(trainer: GRPOTrainer, calls: list, sample_s: list) -> None:
    """Time each round's generation and scoring, and check TRL's advantages against minirl's of the same rewards."""
    generate_and_score = trainer._generate_and_score_completions

    def timed(inputs):
        t0 = time.perf_counter()
        out = generate_and_score(inputs)
        sample_s.append(time.perf_counter() - t0)
        expected = group_advantages(torch.tensor(calls[-1][2]), trainer.num_generations)  # (B,)
        torch.testing.assert_close(out["advantages"].cpu(), expected, msg="TRL's advantages differ from minirl's")
        return out

    trainer._generate_and_score_completions = timed


def assert_same_hyperparameters(trainer: GRPOTrainer, cfg: GRPOConfig) -> None:
    """Every knob that changes the math, read back from both sides (minirl's AdamW uses torch's defaults)."""
    args, task = trainer.args, get_task(cfg.task)
    adamw = inspect.signature(torch.optim.AdamW).parameters
    B = cfg.prompts_per_step * cfg.group_size
    pairs = {
        "G": (trainer.num_generations, cfg.group_size),
        "completions per generation": (args.generation_batch_size, B),
        "completions per optimizer step": (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            B,
        ),
        "optimizer steps per round": (args.steps_per_generation * trainer.num_iterations, cfg.iterations),
        "max completion tokens": (trainer.max_completion_length, cfg.max_new_tokens or task.max_new_tokens),
        "temperature": (trainer.temperature, cfg.temperature),
        "top-k, top-p, min-p, repetition penalty": (
            (trainer.top_k, trainer.top_p, trainer.min_p, trainer.repetition_penalty),
            (0, 1.0, None, 1.0),  # minirl's trainer samples with temperature only
        ),
        "generate(): sampling, T, top-k, top-p": (
            tuple(getattr(trainer.generation_config, k) for k in ("do_sample", "temperature", "top_k", "top_p")),
            (True, cfg.temperature, 0, 1.0),
        ),
        "generate(): eos, pad": (
            (trainer.generation_config.eos_token_id, trainer.generation_config.pad_token_id),
            ([trainer.processing_class.eos_token_id], trainer.processing_class.pad_token_id),
        ),
        "mu (iterations)": (trainer.num_iterations, cfg.iterations),
        "clip low": (trainer.epsilon_low, cfg.clip_low),
        "clip high": (trainer.epsilon_high, cfg.clip_low if cfg.clip_high is None else cfg.clip_high),
        "importance sampling level": (trainer.importance_sampling_level, "token"),
        "beta": (trainer.beta, cfg.beta),
        "reference model": (trainer.ref_model, None),
        "advantage scale": (trainer.scale_rewards, cfg.scale),
        "loss aggregation": (LOSS_AGG_OF_TRL.get(trainer.loss_type), cfg.loss_agg),
        "mask truncated": (trainer.mask_truncated_completions, cfg.mask_truncated),
        "drop zero-variance groups": (False, cfg.drop_zero_variance),  # TRL has no such option
        "reward weights (accuracy, format)": (
            (*trainer.reward_weights.tolist(), 0.0),
            (cfg.accuracy_weight, cfg.format_weight),
        ),
        "entropy bonus, top-entropy mask": (
            (trainer.entropy_coef, trainer.use_adaptive_entropy, trainer.top_entropy_quantile),
            (0.0, False, 1.0),
        ),
        "off-policy mask": (args.off_policy_mask_threshold, None),
        "lr": (args.learning_rate, cfg.lr),
        "lr schedule": (args.lr_scheduler_type, "constant"),
        "warm-up steps": (args.warmup_steps, 0),
        "adam betas": ((args.adam_beta1, args.adam_beta2), adamw["betas"].default),
        "adam eps": (args.adam_epsilon, adamw["eps"].default),
        "weight decay": (args.weight_decay, cfg.weight_decay),
        "max grad norm": (args.max_grad_norm, cfg.max_grad_norm),
        "dataset shuffle": (trainer.shuffle_dataset, False),  # minirl draws step s's problems in order
        "precision": ((args.bf16, args.fp16), (False, False)),
        "gradient checkpointing": (args.gradient_checkpointing, False),
        "vLLM": (trainer.use_vllm, False),
        "device": (trainer.accelerator.device.type, cfg.device),
    }
    mismatched = {k: v for k, v in pairs.items() if v[0] != v[1]}
    assert not mismatched, f"hyperparameters differ (TRL, minirl): {mismatched}"


def assert_same_optimizer(clock: Clock, cfg: GRPOConfig) -> None:
    """TRL's optimizer as built inside ``train()``, against minirl's ``AdamW(lr, weight_decay)`` with torch defaults."""
    group, adamw = clock.optimizer.param_groups[0], inspect.signature(torch.optim.AdamW).parameters
    pairs = {
        "optimizer": (type(clock.optimizer).__name__, "AdamW"),
        "lr": (group["lr"], cfg.lr),
        "lr after the last step (constant)": (clock.lr_at_end, cfg.lr),
        "betas": (tuple(group["betas"]), adamw["betas"].default),
        "eps": (group["eps"], adamw["eps"].default),
        "weight decay": (group["weight_decay"], cfg.weight_decay),
        "torch threads": (clock.threads, cfg.threads),
    }
    mismatched = {k: v for k, v in pairs.items() if v[0] != v[1]}
    assert not mismatched, f"optimizer differs (TRL, minirl): {mismatched}"


def weights_per_token(model) -> int:
    """Multiply-adds of the matrix products per token of a forward pass: every linear layer's weights, LM head included
    (the embedding lookup is not a product)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def floor_s(result, task, gflops: float) -> float:
    """Seconds per step of the matrix products on real tokens alone, at ``gflops``: 2 FLOPs per weight per token for
    sampling (a forward pass; a prompt once, however many rows share it), 6 for training (forward and backward) on the
    distinct rows that went through it (a row that repeats another is computed once). Padding, attention scores and
    every other operation count zero, so no implementation gets below it."""
    h, w = result.history, weights_per_token(result.model)
    prompts = result.config.prompts_per_step
    rows = prompts * result.config.group_size  # sampled per step
    prompt = len(result.tokenizer(draw_problems(task, 1, 0, 0)[0].prompt)["input_ids"])  # bos + the characters
    flops = sum(2 * w * (prompts * prompt + rows * n) + 6 * w * live * (prompt + n)
                for n, live in zip(h["length"], h["rows_distinct"]))  # fmt: skip
    return flops / gflops / 1e9 / len(h["length"])


def run_minirl(cfg: GRPOConfig, task, gflops: float) -> dict:
    t0 = time.perf_counter()
    result = train(cfg)
    wall = time.perf_counter() - t0
    h = result.history
    sample, update = sum(h["sample_s"]), sum(h["train_s"])
    return {
        "library": "minirl",
        "seed": cfg.seed,
        "step_s": (sample + update) / cfg.steps,
        "sample_s": sample / cfg.steps,
        "train_s": update / cfg.steps,
        "setup_s": wall - sample - update,
        "train_acc": h["accuracy"],
        "after": evaluate(result.model, result.tokenizer, task, n=EVAL_N, k=0).accuracy,
        "floor_s": floor_s(result, task, gflops),
        "rows_computed": statistics.mean(h["rows_computed"]),
        "rows_distinct": statistics.mean(h["rows_distinct"]),
    }


def run_trl(cfg: GRPOConfig, task) -> dict:
    calls, sample_s, clock = [], [], Clock()
    with tempfile.TemporaryDirectory() as out_dir:
        t0 = time.perf_counter()
        model, tokenizer = load(cfg.model, device=cfg.device)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=trl_reward(task, calls),
            args=trl_config(cfg, out_dir),
            train_dataset=trl_dataset(task, cfg, tokenizer),
            processing_class=tokenizer,
            callbacks=[clock],
        )
        assert_same_hyperparameters(trainer, cfg)
        instrument(trainer, calls, sample_s)
        trainer.train()
        wall = time.perf_counter() - t0
    assert_same_optimizer(clock, cfg)
    assert len(calls) == cfg.steps == trainer.state.global_step, (len(calls), trainer.state.global_step)
    for step, (prompts, _, _) in enumerate(calls):
        expected = [p.prompt for p in draw_problems(task, cfg.prompts_per_step, cfg.seed, step)]
        assert prompts == [p for p in expected for _ in range(cfg.group_size)], f"TRL's prompts differ at step {step}"
    print(
        "TRL, first completions of the last step:", *[f"  {p}{c!r} -> {r}" for p, c, r in zip(*calls[-1])][:3], sep="\n"
    )
    loop = clock.end - clock.begin
    return {
        "library": "TRL",
        "seed": cfg.seed,
        "step_s": loop / cfg.steps,
        "sample_s": sum(sample_s) / cfg.steps,
        "train_s": (loop - sum(sample_s)) / cfg.steps,
        "setup_s": wall - loop,
        "train_acc": [sum(r) / len(r) for _, _, r in calls],
        "after": evaluate(trainer.model, tokenizer, task, n=EVAL_N, k=0).accuracy,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both libraries (1: the table of "
                        "record, grpo_vs_trl.md; N > 1 writes grpo_vs_trl_threadsN.md)")  # fmt: skip
    args = parser.parse_args()
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    task = get_task(TASK)
    model, tokenizer = load(PRETRAINED, device="cpu")
    before = evaluate(model, tokenizer, task, n=EVAL_N, k=0).accuracy
    print(f"untrained checkpoint: held-out accuracy {before:.3f}", flush=True)

    gflops = matmul_gflops()
    t_start, rows = time.perf_counter(), []
    for seed in args.seeds:
        cfg = minirl_config(seed, args.steps, args.threads)
        for run in (functools.partial(run_minirl, gflops=gflops), run_trl):
            rows.append({**run(cfg, task), "before": before})
            r = rows[-1]
            print(
                f"{r['library']} seed {seed}: {r['step_s']:.2f} s/step (sample {r['sample_s']:.2f}, "
                f"train {r['train_s']:.2f}), setup {r['setup_s']:.1f} s, training accuracy "
                f"{[round(a, 2) for a in r['train_acc']]}, held-out {before:.3f} -> {r['after']:.3f}",
                flush=True,
            )
    write_table(rows, args, time.perf_counter() - t_start, gflops)
    plot(rows, args)


def threads_text(threads: int) -> str:
    return "one torch thread" if threads == 1 else f"{threads} torch threads"


def suffix(threads: int) -> str:
    """The results' name ending: none for one thread, the table of record; ``_threadsN`` for N threads."""
    return "" if threads == 1 else f"_threads{threads}"


def write_table(rows: list[dict], args, total_s: float, gflops: float) -> None:
    libs = ("minirl", "TRL")
    med = {
        lib: {k: statistics.median(r[k] for r in rows if r["library"] == lib) for k in ("step_s", "after")}
        for lib in libs
    }
    ratio = med["minirl"]["step_s"] / med["TRL"]["step_s"]
    ours = [r for r in rows if r["library"] == "minirl"]
    verdict = "met" if ratio <= 0.5 and med["minirl"]["after"] >= med["TRL"]["after"] else "not met"
    lines = [
        "# GRPO on 3-digit addition: minirl vs TRL's GRPOTrainer",
        "",
        stamp(("torch", "transformers", "trl")),
        f"Checkpoint `minirl.lm.PRETRAINED` (0.87M-parameter Llama, character tokenizer), {args.steps} steps of "
        f"16 prompts x 8 completions, seeds {args.seeds}, {threads_text(args.threads)} each; held-out accuracy: "
        f"greedy, {EVAL_N} problems, the same function for both. "
        f"Whole run {total_s / 60:.1f} minutes.",
        "",
        "| library | seed | s/step | sample s/step | train s/step | setup (s) | train accuracy, last 5 steps "
        "| held-out accuracy before | after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        last = r["train_acc"][-5:]
        lines.append(
            f"| {r['library']} | {r['seed']} | {r['step_s']:.2f} | {r['sample_s']:.2f} | {r['train_s']:.2f} | "
            f"{r['setup_s']:.2f} | {sum(last) / len(last):.3f} | {r['before']:.3f} | {r['after']:.3f} |"
        )
    lines += [
        "",
        f"Median time per step: minirl {med['minirl']['step_s']:.2f} s, TRL {med['TRL']['step_s']:.2f} s; "
        f"ratio minirl / TRL = **{ratio:.2f}x** (target 0.5x at equal or better accuracy: {verdict}). "
        f"Median held-out accuracy after training: minirl {med['minirl']['after']:.3f}, "
        f"TRL {med['TRL']['after']:.3f} (untrained {rows[0]['before']:.3f}).",
        f"Floor: the matrix products on real tokens alone at this CPU's speed for one 512 x 512 product "
        f"({gflops:.0f} GFLOP/s, {threads_text(args.threads)}), 2 FLOPs per weight per token sampled (a prompt once "
        f"per group) and 6 per token trained on (of the distinct rows minirl computed): median "
        f"{statistics.median(r['floor_s'] for r in rows if 'floor_s' in r):.2f} s/step. "
        "Padding, attention scores and all other operations count zero.",
        f"Rows through the training passes, mean per step over steps and seeds: minirl "
        f"{statistics.mean(r['rows_computed'] for r in ours):.1f} of 128 (those with a nonzero advantage), of which "
        f"{statistics.mean(r['rows_distinct'] for r in ours):.1f} distinct (a row that repeats another, prompt and "
        "completion, is computed once); TRL all 128.",
        "minirl's sample and train times are its history's `sample_s` and `train_s`; TRL's sample time is spent in "
        "`_generate_and_score_completions` (generation, reward, advantages), its train time is the rest of its loop "
        "(from `on_train_begin` to `on_train_end`). Setup: loading the model and building the trainer (for minirl, "
        "also its per-step logging).",
        "",
        "Hyperparameters (asserted equal on both sides, minirl -> TRL): group_size -> num_generations = 8; "
        "prompts_per_step x group_size -> per_device_train_batch_size = generation_batch_size = 128, "
        "gradient_accumulation_steps = steps_per_generation = 1; max_new_tokens (task's) -> max_completion_length; "
        "temperature -> temperature = 1 (top_k 0, top_p 1); iterations -> num_iterations = 1; clip_low/clip_high -> "
        "epsilon/epsilon_high = 0.2; beta -> beta = 0; scale -> scale_rewards = group; loss_agg seq-mean-token-mean -> "
        "loss_type grpo; mask_truncated -> mask_truncated_completions = False; lr -> learning_rate = 1e-4, constant "
        "schedule, no warm-up; AdamW betas 0.9/0.999, eps 1e-8; weight_decay = 0; max_grad_norm = 1; accuracy reward "
        "weight 1, no format reward. TRL's advantages were checked on every step against "
        "`minirl.returns.group_advantages` (Bessel-corrected group std + 1e-4) of the same rewards.",
        "",
        "Differences that are not hyperparameters:",
        "",
        *[f"- {d}" for d in DIFFERENCES + (THREADS if args.threads > 1 else [])],
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"grpo_vs_trl{suffix(args.threads)}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(rows: list[dict], args) -> None:
    """Training accuracy per step (mean of the round's 128 rewards) for each run, and held-out accuracy at the end."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for lib, color in (("minirl", "tab:blue"), ("TRL", "tab:orange")):
        runs = [r for r in rows if r["library"] == lib]
        for i, r in enumerate(runs):
            steps = range(1, len(r["train_acc"]) + 1)
            label = f"{lib}, training (sampled, T = 1)" if i == 0 else None
            ax.plot(steps, r["train_acc"], color=color, alpha=0.8, lw=1.2, label=label)
        ax.scatter(
            [args.steps] * len(runs),
            [r["after"] for r in runs],
            color=color,
            marker="D",
            zorder=3,
            label=f"{lib}, held-out after (greedy)",
        )
    ax.axhline(rows[0]["before"], color="gray", ls=":", lw=1, label="held-out, untrained (greedy)")
    ax.set_xlabel("GRPO step (16 prompts x 8 completions)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"GRPO on 3-digit addition, same checkpoint, {len(args.seeds)} seeds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, f"benchmark_grpo_vs_trl{suffix(args.threads)}")


if __name__ == "__main__":
    main()
