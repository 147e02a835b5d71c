"""Tasks: traces that are right, splits that never overlap, checks that never crash."""

import random
import re

import pytest

from minirl.lm import tasks
from minirl.lm.tasks import Addition, Problem, Sorting, extract_answer, format_ok, is_correct, make_problems


def test_addition_trace_by_hand():
    p = Addition(3).solve(347, 585)
    assert p == Problem("347+585=", "<think>7+5=12 c1 4+8+1=13 c1 3+5+1=9 c0</think><answer>932</answer>", "932")
    assert Addition(2).solve(99, 99).completion == "<think>9+9=18 c1 9+9+1=19 c1</think><answer>198</answer>"


def test_plain_addition_has_the_same_trace_without_tags():
    plain, tagged = tasks.get_task("addition-plain"), Addition(3)
    assert plain.solve(347, 585) == Problem("347+585=", "7+5=12 c1 4+8+1=13 c1 3+5+1=9 c0 so 932", "932")
    for p in make_problems(plain, "train", 50):
        q = tagged.solve(*map(int, p.prompt[:-1].split("+")))
        retagged = "<think>" + p.completion.replace(" so ", "</think><answer>") + "</answer>"
        assert q.prompt == p.prompt and q.completion == retagged
        assert plain.plain_answer(p.completion) == p.answer and extract_answer(p.completion) is None
    assert plain.plain_answer("7+5=12 c1") is None and plain.plain_answer("so 1 so 22") == "22"


@pytest.mark.parametrize("digits", [1, 2, 3, 4])
def test_addition_traces_are_arithmetic(digits):
    """Every step of every trace is a true sum, and carries chain from one column to the next."""
    task = Addition(digits)
    for p in make_problems(task, "train", 5 if digits == 1 else 100, seed=1):
        a, b = map(int, p.prompt[:-1].split("+"))
        think = re.fullmatch(r"<think>(.*)</think><answer>(\d+)</answer>", p.completion).group(1)
        carry = 0
        for i, step in enumerate(re.findall(r"([\d+]+)=(\d+) c(\d)", think)):
            terms = list(map(int, step[0].split("+")))
            assert terms[:2] == [a // 10**i % 10, b // 10**i % 10]
            assert sum(terms) == int(step[1]) and terms[2:] == ([carry] if i else [])
            carry = int(step[2])
            assert carry == int(step[1]) // 10
        assert int(p.answer) == a + b and is_correct(task, p, p.completion) and format_ok(p.completion)


def test_sorting_trace_by_hand():
    p = Sorting(4).solve([42, 7, 88, 15])
    assert p.prompt == "sort 42 7 88 15="
    assert p.completion == "<think>42 7 88 15>7; 42 88 15>15; 42 88>42</think><answer>7 15 42 88</answer>"
    assert is_correct(Sorting(4), p, p.completion)


@pytest.mark.parametrize("task", [Addition(3), Sorting(4)], ids=lambda t: t.name)
def test_deterministic_by_seed_and_distinct(task):
    a = make_problems(task, "train", 200, seed=5)
    assert a == make_problems(task, "train", 200, seed=5)
    assert a != make_problems(task, "train", 200, seed=6)
    assert len({p.prompt for p in a}) == 200
    assert make_problems(task, "heldout", 50, seed=0) == make_problems(task, "heldout", 200, seed=0)[:50]


@pytest.mark.parametrize("task", [Addition(2), Addition(3), Sorting(3)], ids=lambda t: t.name)
def test_train_and_heldout_never_share_a_problem(task):
    train = {p.prompt for seed in range(3) for p in make_problems(task, "train", 800, seed)}
    heldout = {p.prompt for seed in range(3) for p in make_problems(task, "heldout", 80, seed)}
    assert not train & heldout
    assert all(tasks.split_of(p) == "heldout" for p in heldout)


def test_every_prompt_of_a_small_task_has_one_split():
    """Two-digit addition has 8,100 problems: about a tenth are held out, and no seed moves one across."""
    prompts = [f"{a}+{b}=" for a in range(10, 100) for b in range(10, 100)]
    held = [p for p in prompts if tasks.split_of(p) == "heldout"]
    assert 0.08 < len(held) / len(prompts) < 0.12


def test_max_new_tokens_fits_every_target():
    for task in (Addition(3), Sorting(4)):
        longest = max(tasks.token_count(p.completion) for p in make_problems(task, "train", 500))
        assert longest < task.max_new_tokens


TRICKY = [
    ("", None, False),
    ("<answer>932", None, False),  # unclosed
    ("932</answer>", None, False),
    ("</answer>932<answer>", None, False),  # wrong order
    ("<answer>932</answer><answer>931</answer>", None, False),  # two answers: none counts
    ("<think>x</think><answer> 932 </answer>", " 932 ", True),
    ("<think></think><answer>0932</answer>", "0932", True),  # leading zeros are the same number
    ("<answer>932</answer>", "932", True),  # right answer without the think: correct, though not well formatted
    ("<think>a</think><answer>93 2</answer>", "93 2", False),
    ("<think>a</think><answer>-932</answer>", "-932", False),
    ("<think>a</think><answer>٩٣٢</answer>", "٩٣٢", False),  # Arabic-Indic digits are not ASCII digits
    ("<think>a</think><answer>" + "9" * 50_000 + "</answer>", "9" * 50_000, False),  # beyond int()'s digit limit
    ("<think><think></think><answer>932</answer>", "932", True),
    ("<think>a</think><answer>932</answer>\n", "932", True),
    ("<answer><answer>932</answer>", None, False),
]


@pytest.mark.parametrize(("text", "answer", "correct"), TRICKY)
def test_extraction_and_checking_on_tricky_strings(text, answer, correct):
    problem = Addition(3).solve(347, 585)
    assert extract_answer(text) == answer
    assert is_correct(Addition(3), problem, text) is correct


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("<think>a</think><answer>1</answer>", True),
        ("<think></think><answer></answer>", True),
        ("<think>a</think><answer>1</answer>\n", False),  # something after the answer
        (" <think>a</think><answer>1</answer>", False),
        ("<think><think>a</think><answer>1</answer>", False),  # a repeated tag
        ("<think>a</think>b<answer>1</answer>", False),
        ("<think>a</think><answer>1</answer></answer>", False),
        ("<answer>1</answer><think>a</think>", False),
        ("", False),
    ],
)
def test_format(text, ok):
    assert format_ok(text) is ok


def test_sorting_answer_check():
    task, p = Sorting(3), Sorting(3).solve([5, 3, 9])
    assert task.same_answer("3 5 9", p.answer) and task.same_answer(" 3  5\n9 ", p.answer)
    assert not task.same_answer("3 9 5", p.answer) and not task.same_answer("3 5", p.answer)
    assert not task.same_answer("3 5 9 9", p.answer) and not task.same_answer("", p.answer)


def test_random_garbage_never_raises():
    rng = random.Random(0)
    alphabet = ["<think>", "</think>", "<answer>", "</answer>", "1", "9", " ", "x", "\n", "+", "="]
    problem = Addition(3).solve(100, 200)
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        for task in (Addition(3), Sorting(3)):
            assert isinstance(is_correct(task, problem, text), bool)
        assert isinstance(format_ok(text), bool)


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="task must be one of"):
        tasks.get_task("countdown")
    with pytest.raises(ValueError, match="split must be one of"):
        make_problems(Addition(3), "test", 5)
    with pytest.raises(ValueError, match="ask for fewer"):
        make_problems(Addition(1), "heldout", 50)
    with pytest.raises(ValueError, match="digits"):
        Addition(0)


# --- two notations (language mixing at toy scale) ---


def test_mixed_addition_writes_whole_columns_in_one_notation():
    """Each column's sum and the carry it passes on share a notation; the answer is always in digits."""
    task = tasks.MixedAddition(3)
    plain = Addition(3)
    for p in make_problems(task, "train", 300, seed=1):
        a, b = map(int, p.prompt[:-1].split("+"))
        reference = plain.solve(a, b)
        assert p.answer == reference.answer and p.completion.endswith(f"<answer>{p.answer}</answer>")
        think = lambda text: text[len("<think>") : text.index("</think>")]
        columns = re.findall(r"\S+ c\S", think(p.completion))
        ref_columns = re.findall(r"\S+ c\d", think(reference.completion))
        assert len(columns) == len(ref_columns) == 3
        for column, ref in zip(columns, ref_columns):
            assert column in (ref, ref.translate(str.maketrans("0123456789", "ABCDEFGHIJ")))
            assert column == ref or not any(ch.isdigit() for ch in column)  # never half and half


def test_mixed_addition_mixes_at_the_rate_asked_and_reduces_to_addition():
    traces = [p.completion for p in make_problems(tasks.MixedAddition(3, mix=0.5), "train", 400)]
    share = sum(map(tasks.digit_share, traces)) / len(traces)
    assert 0.4 < share < 0.6  # about half the columns in each notation
    only_digits = make_problems(tasks.MixedAddition(3, mix=0.0), "train", 50)
    assert [p.completion for p in only_digits] == [Addition(3).solve(*map(int, p.prompt[:-1].split("+"))).completion
                                                   for p in only_digits]  # fmt: skip
    assert all(tasks.digit_share(p.completion) == 0 for p in make_problems(tasks.MixedAddition(3, 1.0), "train", 50))
    with pytest.raises(ValueError, match="mix"):
        tasks.MixedAddition(3, mix=1.5)


@pytest.mark.parametrize(
    "text, share",
    [
        ("<think>7+5=12 c1</think><answer>12</answer>", 1.0),
        ("<think>H+F=BC cB</think><answer>12</answer>", 0.0),
        ("<think>7+5=12 c1 E+I+B=BD cB</think><answer>132</answer>", 5 / 11),  # 5 digits, 6 letter numerals
        ("<think>7+5=12 c1</think><answer>ABC</answer>", 1.0),  # only the trace counts
        ("<think>c x</think><answer>1</answer>", 0.0),  # no numeral at all
        ("7+5=12<answer>12</answer>", 0.0),  # no trace
        ("<think>1</think><think>A</think>", 0.0),  # two traces: none is read
        ("</think>1<think>", 0.0),
    ],
)
def test_digit_share_by_hand(text, share):
    assert tasks.digit_share(text) == pytest.approx(share)


def test_chat_addition_reads_the_last_number_of_a_reply():
    task = tasks.get_task("addition-chat")
    p = task.solve(7, 12)
    assert p == Problem("What is 7+12? Answer with the number only.", "19", "19")
    replies = {"19": True, "7 + 12 = 19.": True, "The answer is 019": True, "7+12": False, "nineteen": False, "": False}
    assert {text: is_correct(task, p, text) for text in replies} == replies
    assert task.extract_answer("no digits") is None and format_ok(p.completion) is False
    assert len(make_problems(task, "heldout", 41)) == 41  # all of them: 41 of the 441 questions are held out
    with pytest.raises(ValueError, match="ask for fewer"):
        make_problems(task, "heldout", 42)
