"""``minirl lm ...``: the language-model commands. The package's ``minirl/cli.py`` calls ``register``.

Options are the fields of the command's config dataclass in kebab case (``--pool-size``), with each field's
trailing comment as its help text.
"""

import argparse
from pathlib import Path

from minirl._options import add_options, config_from
from minirl.lm import grpo
from minirl.lm.pretrain import PretrainConfig, pretrain


def run_pretrain(args: argparse.Namespace) -> None:
    pretrain(config_from(args, PretrainConfig))


def run_grpo(args: argparse.Namespace) -> None:
    cfg = config_from(args, grpo.GRPOConfig)
    if cfg.out is None:
        cfg.out = f"runs/lm-grpo-{cfg.task}-s{cfg.seed}"
    result = grpo.train(cfg, progress=True)
    result.history.to_csv(Path(cfg.out) / "history.csv")
    for ev in result.evals:
        acc, fmt = ev["heldout_accuracy"], ev["heldout_format"]
        print(f"step {ev['step']}: held-out greedy accuracy {acc:.1%}, format {fmt:.1%}")
    print(
        f"wrote {cfg.out}/model/ (the trained checkpoint), {cfg.out}/trainer.pt (for --resume), {cfg.out}/history.csv"
    )


def register(subparsers) -> None:
    """Add ``lm`` and its subcommands (``lm pretrain``, ``lm grpo``) to the ``minirl`` command's subparsers."""
    lm = subparsers.add_parser("lm", help="the language-model half of the course")
    commands = lm.add_subparsers(dest="lm_command", required=True)
    parser = commands.add_parser(
        "pretrain",
        help="train the course's tiny LM from scratch on a synthetic task and save the checkpoint",
        description="Train the course's tiny LM from scratch on a synthetic task, for a fixed number of steps, and "
        "save the checkpoint (safetensors, config, tokenizer, and minirl.json with the held-out scores).",
    )
    add_options(parser, PretrainConfig)
    parser.set_defaults(func=run_pretrain)
    parser = commands.add_parser(
        "grpo",
        help="GRPO with rule-based rewards from a checkpoint (by default the course's pretrained one)",
        description="GRPO on the language model with rule-based rewards (accuracy; format logged, weighted 0 unless "
        "--format-weight): writes OUT/model/, OUT/trainer.pt and OUT/history.csv; --resume continues a run.",
    )
    add_options(parser, grpo.GRPOConfig)
    parser.set_defaults(func=run_grpo)
