"""The ``minirl`` command.

    minirl train ppo --env CartPole-v1 --steps 100000 --seed 0     train, then write history.csv, curve.png, policy/
    minirl eval runs/ppo-CartPole-v1-s0/policy                       deterministic evaluation of a saved policy
    minirl lm ...                                                    the language-model half (``minirl.lm.cli``)

Options of ``train`` are the fields of the algorithm's config dataclass in kebab case (``--total-steps``), with
``--env`` and ``--steps`` as the only aliases; each option's help is the comment beside its field.
"""

import argparse
import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path

from tqdm import tqdm

from minirl._options import add_options, config_from
from minirl.algos import ALGOS


def config_class(algo: str) -> type:
    """``minirl.algos.<algo>.<Name>Config``: the one dataclass in the module whose name ends in Config."""
    module = importlib.import_module(f"minirl.algos.{algo}")
    (cls,) = [c for name, c in vars(module).items() if name.endswith("Config") and dataclasses.is_dataclass(c)]
    return cls


def cmd_train(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from minirl._io import claim_folder
    from minirl.plotting import plot_history
    from minirl.rollout import evaluate

    cls = config_class(args.algo)
    cfg = config_from(args, cls)
    out = claim_folder(args.out or f"runs/{args.algo}-{cfg.env_id}-s{cfg.seed}")  # refuses a foreign folder now
    result = importlib.import_module(f"minirl.algos.{args.algo}").train(cfg, progress=True)
    result.history.to_csv(out / "history.csv")
    fig = plot_history(result.history, title=f"{args.algo} on {cfg.env_id}, seed {cfg.seed}")
    fig.savefig(out / "curve.png", dpi=120, bbox_inches="tight")
    result.save(out / "policy")
    mean, std = evaluate(result.policy, cfg.env_id, episodes=args.eval_episodes, seed=cfg.seed + 10_000)
    print(f"evaluation over {args.eval_episodes} deterministic episodes: {mean:.1f} +- {std:.1f}")
    print(f"wrote {out}/history.csv, {out}/curve.png, {out}/policy/")


def cmd_eval(args: argparse.Namespace) -> None:
    from minirl.policies import Policy
    from minirl.rollout import evaluate

    policy = Policy.load(args.path)
    env_id = args.env or json.loads((Path(args.path) / "config.json").read_text()).get("config", {}).get("env_id")
    if env_id is None:
        raise SystemExit(f"{args.path} does not record its environment; pass --env ENV_ID")
    mean, std = evaluate(policy, env_id, episodes=args.episodes, seed=args.seed)
    print(f"{env_id}: {mean:.1f} +- {std:.1f} over {args.episodes} deterministic episodes")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minirl", description="The minirl course's command line.")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train an agent on a gymnasium task")
    algos = train.add_subparsers(dest="algo", required=True, metavar="ALGO")
    for algo in ALGOS:
        cls = config_class(algo)
        p = algos.add_parser(algo, help=f"{algo} ({cls.__name__})")
        add_options(p, cls)
        p.add_argument("--out", help="output folder (default: runs/ALGO-ENV-sSEED)")
        p.add_argument("--eval-episodes", type=int, default=20, help="deterministic episodes to evaluate at the end")
        p.set_defaults(func=cmd_train)

    ev = commands.add_parser("eval", help="evaluate a saved policy with deterministic actions")
    ev.add_argument("path", help="a policy folder written by `minirl train` (…/policy)")
    ev.add_argument("--env", help="environment id (default: the one it was trained on)")
    ev.add_argument("--episodes", type=int, default=20)
    ev.add_argument("--seed", type=int, default=0)
    ev.set_defaults(func=cmd_eval)

    from minirl.lm import cli as lm_cli

    lm_cli.register(commands)
    return parser


# What minirl raises for a setting, a file or a number it refuses: each message names the problem and the fix, so the
# command prints it on one line instead of a traceback (MINIRL_TRACEBACK=1 shows the traceback as well).
USER_ERRORS = (ValueError, TypeError, OSError, FloatingPointError, KeyError)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except USER_ERRORS as err:
        if os.environ.get("MINIRL_TRACEBACK", "") not in ("", "0"):
            raise
        for bar in list(getattr(tqdm, "_instances", ())):  # end a progress bar the error interrupted, on its own line
            bar.close()
        parser.exit(2, f"minirl: error: {err}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
