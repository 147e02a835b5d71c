"""``minirl lm ...``: the language-model commands. The package's ``minirl/cli.py`` calls ``register``.

Options are the fields of the command's config dataclass in kebab case (``--pool-size``), with each field's
trailing comment as its help text. The configs come from ``minirl.lm.config``, which imports neither torch nor
transformers; the trainers are imported only when a command runs, so ``minirl --help`` stays fast.
"""

import argparse
from pathlib import Path

from minirl._options import add_options, config_from
from minirl.lm.config import GRPOConfig, PretrainConfig


def run_pretrain(args: argparse.Namespace) -> None:
    from minirl.lm.pretraining import pretrain

    pretrain(config_from(args, PretrainConfig))


def run_grpo(args: argparse.Namespace) -> None:
    from minirl.lm import grpo

    cfg = config_from(args, GRPOConfig)
    if cfg.out is None:
        cfg.out = f"runs/lm-grpo-{cfg.task}-s{cfg.seed}"
    result = grpo.train(cfg, progress=True)
    result.history.to_csv(Path(cfg.out) / "history.csv")
    for ev in result.evals:
        acc, fmt = ev["heldout_accuracy"], ev["heldout_format"]
        print(f"step {ev['step']}: held-out greedy accuracy {acc:.1%}, format {fmt:.1%}")
    print(
        f"wrote {cfg.out}/checkpoint/model/ (the trained model: minirl.lm.load reads it), {cfg.out}/checkpoint/ "
        f"(optimizer and trainer state, for --resume), {cfg.out}/history.csv"
    )


def register(subparsers) -> None:
    """Add ``lm`` and its subcommands (``lm pretrain``, ``lm grpo``) to the ``minirl`` command's subparsers."""
    lm = subparsers.add_parser("lm", help="the language-model half of the course")
    commands = lm.add_subparsers(dest="lm_command", required=True)
    parser = commands.add_parser(
        "pretrain",
        help="train the course's tiny LM from scratch on a synthetic task and save the checkpoint",
        description="Train the course's tiny LM from scratch on a synthetic task, for a fixed number of steps, and "
        "save the checkpoint (safetensors, config, tokenizer, and minirl.json with the held-out scores). OUT must be "
        "new, empty, or a checkpoint minirl wrote.",
    )
    add_options(parser, PretrainConfig)
    parser.set_defaults(func=run_pretrain)
    parser = commands.add_parser(
        "grpo",
        help="GRPO with rule-based rewards from a checkpoint (by default the course's pretrained one)",
        description="GRPO on the language model with rule-based rewards (accuracy; format logged, weighted 0 unless "
        "--format-weight): writes OUT/checkpoint/model/ (the model), the rest of OUT/checkpoint/ (optimizer and "
        "trainer state) and OUT/history.csv; --resume continues a run with the same settings. OUT must be new, "
        "empty, or a run folder minirl made.",
    )
    add_options(parser, GRPOConfig)
    parser.set_defaults(func=run_grpo)
