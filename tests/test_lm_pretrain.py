"""Pretraining: same seed, same checkpoint; the CLI derived from the config; the committed checkpoint's scores."""

import argparse
import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from minirl._options import add_options, config_from, field_comments
from minirl.lm import (
    PRETRAINED,
    PretrainConfig,
    build_tokenizer,
    evaluate,
    load,
    make_model,
    pretrain,
    pretraining,
    sample,
    tasks,
)
from minirl.lm.cli import register

TINY = dict(
    pool_size=64, steps=6, batch_size=8, warmup_steps=2, hidden_size=32, num_layers=2, num_heads=2,
    intermediate_size=64, eval_every=3, eval_n=8, final_n=8,
)  # fmt: skip
SIZES = ("hidden_size", "num_layers", "num_heads", "intermediate_size")


def test_same_seed_same_checkpoint(tmp_path):
    weights = []
    for name in ("a", "b"):
        pretrain(PretrainConfig(out=str(tmp_path / name), seed=0, **TINY), progress=False)
        weights.append(load_file(tmp_path / name / "model.safetensors"))
    initial = make_model(build_tokenizer(), seed=0, **{k: TINY[k] for k in SIZES}).state_dict()
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not torch.equal(weights[0]["model.norm.weight"], initial["model.norm.weight"])  # it did train
    meta = json.loads((tmp_path / "a" / "minirl.json").read_text())
    assert meta["config"]["seed"] == 0 and meta["config"]["steps"] == 6
    assert set(meta["heldout"]) >= {"greedy_accuracy", "greedy_format_rate", "temperature_1_accuracy"}


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="minirl")
    register(root.add_subparsers(dest="command", required=True))
    return root


def test_cli_options_are_the_config_fields(capsys):
    args = parser().parse_args(["lm", "pretrain", "--pool-size", "123", "--lr", "0.002", "--out", "x"])
    assert args.pool_size == 123 and args.lr == 0.002 and args.out == "x" and args.steps == PretrainConfig.steps
    assert config_from(args, PretrainConfig) == PretrainConfig(pool_size=123, lr=0.002, out="x")
    comments = field_comments(PretrainConfig)
    assert set(comments) == {f.name for f in dataclasses.fields(PretrainConfig)}
    with pytest.raises(SystemExit):
        parser().parse_args(["lm", "pretrain", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    for field in dataclasses.fields(PretrainConfig):
        assert f"--{field.name.replace('_', '-')}" in helptext and comments[field.name] in helptext


def test_cli_runs_a_pretraining(tmp_path):
    options = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    args = parser().parse_args(["lm", "pretrain", f"--out={tmp_path / 'ck'}", *options])
    args.func(args)
    assert (tmp_path / "ck" / "model.safetensors").exists()


def test_committed_checkpoint_is_where_rl_can_start():
    """DESIGN: about 30-45% greedy held-out accuracy, at least 10% at temperature 1, the format mostly right."""
    model, tok = load(PRETRAINED, device="cpu")
    task = tasks.get_task("addition")
    result = evaluate(model, tok, task, n=500, seed=0, k=1)
    meta = json.loads((PRETRAINED / "minirl.json").read_text())
    assert 0.25 <= result.accuracy <= 0.6 and result.sampled_accuracy >= 0.1 and result.format_rate >= 0.9
    assert result.accuracy == pytest.approx(meta["heldout"]["greedy_accuracy"], abs=0.02)
    assert sum(p.numel() for p in model.parameters()) == meta["parameters"]
    assert sum(f.stat().st_size for f in PRETRAINED.iterdir()) < 5e6


def test_add_options_handles_every_field_type():
    @dataclasses.dataclass
    class Demo:
        flag: bool = False  # switch it on
        rate: float = 0.5  # a rate

    root = argparse.ArgumentParser()
    add_options(root, Demo)
    assert config_from(root.parse_args(["--flag", "--rate", "2"]), Demo) == Demo(flag=True, rate=2.0)
    assert config_from(root.parse_args(["--no-flag"]), Demo) == Demo()
    assert field_comments(Demo) == {"flag": "switch it on", "rate": "a rate"}


def test_committed_plain_checkpoint_never_saw_the_tags():
    """tiny-adder-plain: same size and config as tiny-adder, trained on tag-free sums, right often when read plainly."""
    path = PRETRAINED.parent / "tiny-adder-plain"
    model, tok = load(path, device="cpu")
    meta = json.loads((path / "minirl.json").read_text())
    assert meta["config"]["task"] == "addition-plain" and meta["parameters"] == 866_432
    task = tasks.get_task("addition-plain")
    held = tasks.make_problems(task, "heldout", 100)
    texts = sample(model, tok, [p.prompt for p in held], task.max_new_tokens, greedy=True).text
    assert not any(tag in text for text in texts for tag in tasks._TAGS)
    right = [task.plain_answer(t) is not None and task.same_answer(task.plain_answer(t), p.answer)
             for t, p in zip(texts, held)]  # fmt: skip
    assert sum(right) >= 30


def test_a_folder_minirl_did_not_write_is_refused_before_training(tmp_path, monkeypatch):
    mine = tmp_path / "data"
    mine.mkdir()
    (mine / "measurements.csv").write_text("1,2,3\n")
    monkeypatch.setattr(pretraining, "make_model", lambda *a, **kw: pytest.fail("training started"))
    with pytest.raises(FileExistsError, match="not written by minirl.*Choose a new or empty folder"):
        pretrain(PretrainConfig(out=str(mine), **TINY), progress=False)
    args = parser().parse_args(["lm", "pretrain", f"--out={mine}"])
    with pytest.raises(FileExistsError, match="measurements.csv"):
        args.func(args)
    assert [p.name for p in mine.iterdir()] == ["measurements.csv"] and oct(mine.stat().st_mode & 0o777) != "0o700"
    monkeypatch.chdir(tmp_path / "data")
    with pytest.raises(ValueError, match="current folder.*Name a folder of its own"):
        pretrain(PretrainConfig(out=".", **TINY), progress=False)


@pytest.mark.parametrize(
    "kw, error, message",
    [
        (dict(steps=-1000), ValueError, "steps must be > 0"),
        (dict(lr=0.0), ValueError, "lr must be > 0"),
        (dict(hidden_size=0), ValueError, "hidden_size must be > 0"),
        (dict(task="poetry"), ValueError, "task must be one of"),
        (dict(seed=True), TypeError, "seed must be a number, got the bool"),
    ],
)
def test_bad_config_is_refused_before_training(tmp_path, monkeypatch, kw, error, message):
    monkeypatch.setattr(pretraining, "make_model", lambda *a, **kw: pytest.fail("training started"))
    with pytest.raises(error, match=message):
        pretrain(PretrainConfig(out=str(tmp_path / "ck"), **{**TINY, **kw}), progress=False)
