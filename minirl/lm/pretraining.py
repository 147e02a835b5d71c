"""Train the course's tiny model from scratch on a synthetic task: ``minirl lm pretrain`` (``notebooks/08_tiny_lm``).

"Pretraining" here is supervised training of a fresh model on a fixed pool of solved training problems, written in
the R1 template. It stops at a fixed step count, never at an accuracy, so the same config, seed, machine and thread
count give the same checkpoint. The learning rate is constant after the warm-up, so stopping at step S is the same as
cutting a longer run at S. The defaults stop at step 300, while held-out accuracy is still climbing (it passes 70% by
step 450): the template is learned, the arithmetic only partly, which leaves reinforcement learning something to do.
The committed checkpoint (``minirl/lm/checkpoints/README.md``) scores 34% greedy and 15% at temperature 1.
"""

import dataclasses
import platform
import time
from pathlib import Path

import torch

from minirl import _validate
from minirl.course import use_threads
from minirl.lm import distributed, sft
from minirl.lm.config import PretrainConfig
from minirl.lm.evaluation import evaluate
from minirl.lm.model import checkpoint_folder, make_model, save
from minirl.lm.tasks import TASKS, get_task, make_problems
from minirl.lm.tokenizer import build_tokenizer


def check_config(cfg: PretrainConfig) -> PretrainConfig:
    """Check every field of ``cfg`` (type and range) before any work; raise naming the field and what it allows."""
    positive = ("pool_size", "steps", "batch_size", "lr", "hidden_size", "num_layers", "num_heads",
                "intermediate_size", "eval_every", "eval_n", "final_n")  # fmt: skip
    nonneg = ("warmup_steps", "seed", "threads")
    return _validate.check_config(cfg, positive, nonneg, choices={"task": tuple(TASKS)})


def pretrain(cfg: PretrainConfig, progress: bool = True) -> sft.SFTResult:
    """Build the tokenizer and model, train them, evaluate on held-out problems, save the checkpoint to ``cfg.out``.

    The checkpoint's ``minirl.json`` records the config, the final evaluation, the wall time and the machine. The
    config and ``cfg.out`` are checked before training: a folder of other files is refused, never replaced.
    """
    check_config(cfg)
    checkpoint_folder(cfg.out)
    use_threads(cfg.threads)
    start = time.perf_counter()
    task = get_task(cfg.task)
    tokenizer = build_tokenizer()
    sizes = dict(
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
    )
    model = make_model(tokenizer, seed=cfg.seed, **sizes)
    pool = make_problems(task, "train", cfg.pool_size, seed=cfg.seed)

    def accuracy(model) -> dict:
        return {"acc": evaluate(model, tokenizer, task, n=cfg.eval_n, k=0).accuracy}

    sft_cfg = sft.SFTConfig(
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        warmup_steps=cfg.warmup_steps,
        schedule="constant",
        eval_every=cfg.eval_every,
        seed=cfg.seed,
    )
    result = sft.train(model, tokenizer, pool, sft_cfg, on_eval=accuracy, progress=progress)
    train_s = time.perf_counter() - start
    final = evaluate(model, tokenizer, task, n=cfg.final_n, seed=0, k=1, temperature=1.0)
    metadata = {
        "command": "minirl lm pretrain " + " ".join(_as_options(cfg)),
        "config": dataclasses.asdict(cfg),
        "heldout": {
            "n": final.n,
            "greedy_accuracy": round(final.accuracy, 4),
            "greedy_format_rate": round(final.format_rate, 4),
            "temperature_1_accuracy": round(final.sampled_accuracy, 4),
            "temperature_1_format_rate": round(final.sampled_format_rate, 4),
        },
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(train_s, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
    }
    if not distributed.is_main():  # under torchrun every process holds the same model: rank 0 saves it
        return result
    save(model, tokenizer, Path(cfg.out), metadata)
    if progress:
        print(
            f"saved {cfg.out}: greedy held-out accuracy {final.accuracy:.1%}, format {final.format_rate:.1%}, "
            f"temperature-1 accuracy {final.sampled_accuracy:.1%} (n={final.n}), trained in {train_s:.0f} s"
        )
    return result


def _as_options(cfg: PretrainConfig) -> list[str]:
    """The command-line options that reproduce ``cfg``, for the record."""
    return [f"--{f.name.replace('_', '-')} {getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)]
