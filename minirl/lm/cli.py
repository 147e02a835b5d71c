"""``minirl lm ...``: the language-model commands. The package's ``minirl/cli.py`` calls ``register``.

Options are the fields of the command's config dataclass in kebab case (``--pool-size``), with each field's
trailing comment as its help text.
"""

import argparse

from minirl._options import add_options, config_from
from minirl.lm.pretrain import PretrainConfig, pretrain


def run_pretrain(args: argparse.Namespace) -> None:
    pretrain(config_from(args, PretrainConfig))


def register(subparsers) -> None:
    """Add ``lm`` and its subcommands (``lm pretrain``) to the ``minirl`` command's subparsers."""
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
