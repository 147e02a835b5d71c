"""`minirl train` on gymnasium: the output folder is claimed before training, bad options and bad envs stop the run
before anything is written, and help texts come from the config's comments."""

import re
from dataclasses import dataclass

import pytest
from _envs import register

import minirl.algos.dqn as dqn
from minirl._options import field_comments
from minirl.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")
register()  # the test envs of _envs.py


def refused(capsys, argv: list[str], match: str) -> None:
    """The command stops with exit status 2 and a last line naming the problem, not a traceback."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    last = err.splitlines()[-1]  # after a progress bar the error interrupted, if any
    assert stop.value.code == 2 and last.startswith("minirl: error: ") and "Traceback" not in err
    assert re.search(match, err), err


def test_a_foreign_folder_is_refused_before_training(tmp_path, monkeypatch, capsys):
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "chapter1.tex").write_text("years of work")
    monkeypatch.setattr(dqn, "train", lambda *a, **k: pytest.fail("training started before the folder was checked"))
    refused(capsys, ["train", "dqn", "--steps", "100", "--out", str(out)], "not written by minirl")
    assert [p.name for p in out.iterdir()] == ["chapter1.tex"] and (out / "chapter1.tex").read_text() == "years of work"


def test_a_run_folder_can_be_trained_into_again(tmp_path):
    out = tmp_path / "run"
    args = ["train", "dqn", "--steps", "300", "--learning-starts", "200", "--out", str(out), "--eval-episodes", "1"]
    main(args)
    main(args)  # minirl's own folder: replaced, not refused
    assert (out / "policy" / "model.safetensors").exists()


@pytest.mark.parametrize(
    "option, match",
    [
        (["ppo", "--n-steps", "0"], "n_steps must be > 0"),
        (["ppo", "--max-grad-norm", "-0.5"], "max_grad_norm must be > 0"),
        (["ppo", "--steps", "-1000"], "total_steps must be > 0"),
        (["reinforce", "--lr", "0"], "lr must be > 0"),
        (["trpo", "--minibatch-size", "0"], "minibatch_size must be > 0"),
        (["dqn", "--hidden", "0"], "hidden must be a non-empty sequence of integers >= 1"),
    ],
)
def test_a_bad_option_stops_before_training(tmp_path, capsys, option, match):
    refused(capsys, ["train", *option, "--out", str(tmp_path / "run")], match)
    assert not (tmp_path / "run" / "policy").exists()


def test_dqn_with_a_nan_reward_stops_naming_the_env_and_saves_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "dqn", "--env", "minirl-test/NaNReward-v0", "--steps", "100", "--out", str(out)]
    refused(capsys, argv, "minirl-test/NaNReward-v0 returned a non-finite reward")
    assert not (out / "policy").exists() and not (out / "history.csv").exists()


def test_help_text_survives_a_hash_inside_a_default():
    @dataclass
    class Config:
        sep: str = "#"  # separator of the fields; the '#' in the default is not a comment
        tag: str = "a # b"  # another default with a hash
        plain: int = 3
        noted: float = 0.5  # a plain comment

    assert field_comments(Config) == {
        "sep": "separator of the fields; the '#' in the default is not a comment",
        "tag": "another default with a hash",
        "noted": "a plain comment",
    }


def test_minirl_traceback_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIRL_TRACEBACK", "1")
    with pytest.raises(ValueError, match="total_steps must be > 0"):
        main(["train", "ppo", "--steps", "-5", "--out", str(tmp_path / "run")])
