"""The character tokenizer: lossless on every task's strings, tags as single tokens, save/load round-trip."""

import pytest
from transformers import AutoTokenizer

from minirl.lm import build_tokenizer, tasks
from minirl.lm.tokenizer import TAGS

TASKS = [tasks.Addition(1), tasks.Addition(3), tasks.Addition(5), tasks.Sorting(2), tasks.Sorting(4)]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_round_trip_on_every_task_string(tok, task):
    n = 5 if task.name == "addition1" else 50  # one-digit addition has only 81 problems
    for split in tasks.SPLITS:
        for problem in tasks.make_problems(task, split, n, seed=3):
            for text in (problem.prompt, problem.completion, problem.prompt + problem.completion):
                ids = tok(text)["input_ids"]
                assert ids[0] == tok.bos_token_id and tok.unk_token_id not in ids
                assert tok.decode(ids, skip_special_tokens=True) == text


def test_tags_are_single_tokens_and_survive_decoding(tok):
    text = "<think>1+2=3 c0</think><answer>3</answer>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for tag in TAGS:
        assert tok.convert_tokens_to_ids(tag) in ids
    assert len(ids) == len("1+2=3 c0") + len("3") + 4
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text


def test_one_token_per_character_and_unknowns(tok):
    assert tok("a b\n", add_special_tokens=False)["input_ids"] == tok.convert_tokens_to_ids(["a", " ", "b", "\n"])
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    assert len(tok) == 104 and len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}) == 4


def test_save_and_autotokenizer_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "347+585=<think>7+5=12 c1</think><answer>932</answer>"
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded.padding_side == "left"
    assert (loaded.pad_token, loaded.bos_token, loaded.eos_token) == ("<pad>", "<bos>", "<eos>")
    batch = loaded(["1+1=", "12+34="], padding=True)["input_ids"]
    assert batch[0][:2] == [loaded.pad_token_id, loaded.pad_token_id]  # padded on the left
