"""The `minirl` command: options derived from the config dataclasses, train then eval end to end."""

import csv
import dataclasses
import subprocess
import sys

import pytest

from minirl.algos import ALGOS
from minirl.algos.ppo import PPOConfig
from minirl.cli import build_parser, config_class, main


@pytest.mark.parametrize("algo", ALGOS)
def test_every_config_field_is_an_option_with_its_comment_as_help(algo):
    parser = build_parser()
    cls = config_class(algo)
    args = parser.parse_args(["train", algo])
    for f in dataclasses.fields(cls):
        assert getattr(args, f.name) == f.default
    sub = parser._subparsers._group_actions[0].choices["train"]._subparsers._group_actions[0].choices[algo]
    help_text = sub.format_help()
    for f in dataclasses.fields(cls):
        assert f"--{f.name.replace('_', '-')}" in help_text


def test_aliases_types_and_none():
    args = build_parser().parse_args(
        [
            "train",
            "ppo",
            "--env",
            "Pendulum-v1",
            "--steps",
            "2048",
            "--clip-high",
            "0.28",
            "--target-kl",
            "none",
            "--no-anneal-lr",
            "--hidden",
            "32",
            "32",
            "--lr",
            "3e-4",
        ]
    )
    assert (args.env_id, args.total_steps, args.clip_high, args.target_kl) == ("Pendulum-v1", 2048, 0.28, None)
    assert (args.anneal_lr, args.hidden, args.lr) == (False, [32, 32], 3e-4)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "ppo", "--steps", "many"])


def test_help_shows_field_comment():
    sub = build_parser()._subparsers._group_actions[0].choices["train"]._subparsers._group_actions[0].choices["ppo"]
    assert "epsilon of the clipped surrogate" in sub.format_help()


def test_train_then_eval(tmp_path, capsys):
    out = tmp_path / "run"
    main(
        [
            "train",
            "ppo",
            "--env",
            "CartPole-v1",
            "--steps",
            "512",
            "--seed",
            "3",
            "--out",
            str(out),
            "--eval-episodes",
            "2",
        ]
    )
    rows = list(csv.DictReader(open(out / "history.csv")))
    assert len(rows) == 512 // (PPOConfig.num_envs * PPOConfig.n_steps) and "return_mean" in rows[0]
    assert (out / "curve.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "policy" / "model.safetensors").exists()
    main(["eval", str(out / "policy"), "--episodes", "2"])
    printed = capsys.readouterr().out
    assert "CartPole-v1:" in printed and "over 2 deterministic episodes" in printed


def test_the_parser_does_not_import_the_language_model_libraries():
    """`minirl train ppo --help` must not pay seconds for transformers: the lm commands register lazily."""
    code = (
        "import sys; from minirl.cli import build_parser; build_parser(); "
        "import minirl.lm.grpo as g, minirl.lm.config as c; "
        "assert 'transformers' in sys.modules and g.GRPOConfig is c.GRPOConfig"
    )
    light = "import sys; from minirl.cli import build_parser; build_parser(); import minirl, minirl.lm; "
    light += "minirl.lm.PRETRAINED; assert 'transformers' not in sys.modules, 'transformers was imported'"
    for source in (light, code):
        done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
