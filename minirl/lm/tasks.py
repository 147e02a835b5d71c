"""Synthetic tasks whose answers a program can check, written in the R1 template (``notebooks/08_tiny_lm.ipynb``).

A problem is a prompt (``347+585=``) and a target completion that reasons inside ``<think>...</think>`` and answers
inside ``<answer>...</answer>``, the template DeepSeek-R1 was trained to follow:

    347+585=<think>7+5=12 c1 4+8+1=13 c1 3+5+1=9 c0</think><answer>932</answer>

A task is any object with ``name``, ``longest`` (its longest target completion), ``max_new_tokens``,
``draw(rng) -> Problem``, ``extract_answer(text) -> str | None`` and ``same_answer(given, expected) -> bool``; two
families ship here, :class:`Addition` and :class:`Sorting`, with two variants of the sums: :class:`PlainAddition`,
written without the tags (a model that never saw them, for notebook 11), and :class:`MixedAddition`, whose traces mix
two notations for the numbers (language mixing, for notebook 12). :class:`ChatAddition` asks a question in words, for
a real instruct model reading it through its chat template (``tokenizer.render_prompt``).

Everything here is text, so it works with any tokenizer. ``max_new_tokens`` counts the course's character tokens;
``token_budget(task, tokenizer)`` counts the same room in the tokens of any other tokenizer.

Train and held-out splits are fixed by a hash of the prompt, not by the seed: a problem is held out for every seed
or for none, so no train set ever shares a problem with any held-out set. Extraction and checking take any string
(empty, unclosed or repeated tags, numbers with thousands of digits) and answer False or None, never an exception.
"""

import random
import re
import zlib
from dataclasses import dataclass

from minirl._validate import one_of

SPLITS = ("train", "heldout")
HELDOUT_PERCENT = 10  # share of all possible prompts reserved for evaluation
SLACK = 8  # new tokens allowed beyond the longest target and its eos: room for a trace a little longer


@dataclass(frozen=True)
class Problem:
    """One task instance: ``prompt``, the target ``completion`` (trace and answer), and the bare ``answer``."""

    prompt: str
    completion: str
    answer: str


def template(think: str, answer: str) -> str:
    """The R1 completion: ``<think>{think}</think><answer>{answer}</answer>``."""
    return f"<think>{think}</think><answer>{answer}</answer>"


class Addition:
    """``digits``-digit addition with a written carry trace, units column first.

    ``347+585=`` -> ``<think>7+5=12 c1 4+8+1=13 c1 3+5+1=9 c0</think><answer>932</answer>``: each column writes its
    digits, the carry coming in (from the second column on) and the carry going out.
    """

    def __init__(self, digits: int = 3):
        if not isinstance(digits, int) or not 1 <= digits <= 9:
            raise ValueError(f"digits must be an integer in [1, 9], got {digits!r}")
        self.digits = digits
        self.name = f"addition{digits}"
        self.longest = self.solve(10**digits - 1, 10**digits - 1).completion
        self.max_new_tokens = token_count(self.longest) + SLACK

    def draw(self, rng: random.Random) -> Problem:
        low, high = 10 ** (self.digits - 1), 10**self.digits - 1
        return self.solve(rng.randint(low, high), rng.randint(low, high))

    def solve(self, a: int, b: int) -> Problem:
        steps, carry = [], 0
        for i, (x, y) in enumerate(zip(reversed(str(a)), reversed(str(b)))):
            total = int(x) + int(y) + carry
            lhs = f"{x}+{y}" if i == 0 else f"{x}+{y}+{carry}"
            carry = total // 10
            steps.append(f"{lhs}={total} c{carry}")
        answer = str(a + b)
        return Problem(f"{a}+{b}=", self.write(" ".join(steps), answer), answer)

    write = staticmethod(template)  # how a trace and an answer become the completion: the R1 template

    @staticmethod
    def extract_answer(text: str) -> str | None:
        """The answer inside ``<answer>...</answer>`` (``tasks.extract_answer``)."""
        return extract_answer(text)

    @staticmethod
    def same_answer(given: str, expected: str) -> bool:
        """True when ``given`` is the number ``expected``, leading zeros and surrounding spaces allowed."""
        given = given.strip()
        return given.isascii() and given.isdigit() and given.lstrip("0") == expected.lstrip("0")


class Sorting:
    """Sort ``length`` numbers below 100 in increasing order, taking out the smallest one at a time.

    ``sort 42 7 88 15=`` -> ``<think>42 7 88 15>7; 42 88 15>15; 42 88>42</think><answer>7 15 42 88</answer>``.
    """

    def __init__(self, length: int = 4):
        if not isinstance(length, int) or not 2 <= length <= 8:
            raise ValueError(f"length must be an integer in [2, 8], got {length!r}")
        self.length = length
        self.name = f"sorting{length}"
        self.longest = self.solve([99] * length).completion
        self.max_new_tokens = token_count(self.longest) + SLACK

    def draw(self, rng: random.Random) -> Problem:
        return self.solve([rng.randint(0, 99) for _ in range(self.length)])

    def solve(self, nums: list[int]) -> Problem:
        rest, steps = list(nums), []
        while len(rest) > 1:
            smallest = min(rest)
            steps.append(f"{' '.join(map(str, rest))}>{smallest}")
            rest.remove(smallest)
        answer = " ".join(map(str, sorted(nums)))
        return Problem(f"sort {' '.join(map(str, nums))}=", template("; ".join(steps), answer), answer)

    extract_answer = staticmethod(Addition.extract_answer)

    @staticmethod
    def same_answer(given: str, expected: str) -> bool:
        """True when ``given`` lists the numbers of ``expected`` in the same order, separated by whitespace."""
        got, want = given.split(), expected.split()
        return len(got) == len(want) and all(
            g.isascii() and g.isdigit() and g.lstrip("0") == w.lstrip("0") for g, w in zip(got, want)
        )


class PlainAddition(Addition):
    """:class:`Addition` without the R1 tags: ``347+585=`` -> ``7+5=12 c1 4+8+1=13 c1 3+5+1=9 c0 so 932``.

    A model trained on it never saw ``<think>`` or ``<answer>``, so the tag-based rewards and evaluation score it 0;
    ``plain_answer`` reads the number after the last `` so ``.
    """

    def __init__(self, digits: int = 3):
        super().__init__(digits)
        self.name = f"addition{digits}-plain"

    @staticmethod
    def write(think: str, answer: str) -> str:
        """The trace, then `` so `` and the answer, no tags."""
        return f"{think} so {answer}"

    @staticmethod
    def plain_answer(text: str) -> str | None:
        """The text after the last `` so `` (None when there is none): the answer of a plain completion."""
        return text.rsplit(" so ", 1)[1] if " so " in text else None


LETTERS = "ABCDEFGHIJ"  # the second notation of MixedAddition: A=0, B=1, ..., J=9
TO_LETTERS = str.maketrans("0123456789", LETTERS)


class MixedAddition(Addition):
    """:class:`Addition` whose trace writes each column's numbers in digits or, with probability ``mix``, in letter
    numerals (``A`` = 0 ... ``J`` = 9): ``347+585=`` -> ``<think>7+5=12 c1 E+I+B=BD cB 3+5+1=9 c0</think>...``.

    A toy of the language mixing DeepSeek-R1-Zero showed (English and Chinese in one chain of thought): two notations
    that mean the same, chosen column by column. The answer is always in digits, so accuracy does not depend on the
    notation; ``rewards.consistency_reward`` scores the share of the trace written in digits.
    """

    def __init__(self, digits: int = 3, mix: float = 0.5):
        if not isinstance(mix, (int, float)) or not 0 <= mix <= 1:
            raise ValueError(f"mix must be a probability in [0, 1], got {mix!r}")
        super().__init__(digits)
        self.mix = mix
        self.name = f"addition{digits}-mixed"

    def draw(self, rng: random.Random) -> Problem:
        problem = super().draw(rng)
        think = problem.completion[len("<think>") : problem.completion.index("</think>")]
        columns = re.findall(r"\S+ c\d", think)  # "4+8+1=13 c1": a column's sum and the carry it passes on
        think = " ".join(c if rng.random() >= self.mix else letters(c) for c in columns)
        return Problem(problem.prompt, self.write(think, problem.answer), problem.answer)


def letters(text: str) -> str:
    """``text`` with every digit written as a letter numeral: ``"4+8+1=13"`` -> ``"E+I+B=BD"``."""
    return text.translate(TO_LETTERS)


class ChatAddition:
    """A sum of two numbers from 0 to ``high``, asked in words, answered with the number alone:
    ``What is 7+12? Answer with the number only.`` -> ``19``.

    Meant for a real instruct model reading the question through its chat template (``tokenizer.render_prompt``);
    SmolLM2-135M-Instruct answers 36.6% of the held-out ones right when greedy. It often writes a sentence around the
    number, so the answer is the last integer in the completion.
    """

    def __init__(self, high: int = 20):
        if not isinstance(high, int) or not 1 <= high <= 999:
            raise ValueError(f"high must be an integer in [1, 999], got {high!r}")
        self.high = high
        self.name = f"addition-chat{high}"
        self.longest = str(2 * high)
        self.max_new_tokens = token_count(self.longest) + SLACK

    def draw(self, rng: random.Random) -> Problem:
        return self.solve(rng.randint(0, self.high), rng.randint(0, self.high))

    @staticmethod
    def solve(a: int, b: int) -> Problem:
        return Problem(f"What is {a}+{b}? Answer with the number only.", str(a + b), str(a + b))

    @staticmethod
    def extract_answer(text: str) -> str | None:
        """The last run of digits in ``text`` (``"3 + 5 = 8."`` -> ``"8"``), or None when there is none."""
        numbers = re.findall(r"[0-9]+", text)
        return numbers[-1] if numbers else None

    same_answer = staticmethod(Addition.same_answer)


TASKS = {"addition": Addition, "sorting": Sorting, "addition-plain": PlainAddition, "addition-mixed": MixedAddition,
         "addition-chat": ChatAddition}  # fmt: skip


def get_task(name: str):
    """A task by family name with its default size: ``get_task("addition")`` is ``Addition(digits=3)``."""
    return TASKS[one_of("task", name, tuple(TASKS))]()


def split_of(prompt: str) -> str:
    """``"heldout"`` for a fixed ``HELDOUT_PERCENT`` of all prompts (chosen by a CRC32 hash), ``"train"`` otherwise."""
    return "heldout" if zlib.crc32(prompt.encode()) % 100 < HELDOUT_PERCENT else "train"


def make_problems(task, split: str, n: int, seed: int = 0) -> list[Problem]:
    """``n`` distinct problems of ``split``, the same list for the same task, split, n and seed."""
    one_of("split", split, SPLITS)
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    rng = random.Random(f"{task.name}/{split}/{seed}")
    problems, seen, draws = [], set(), 0
    while len(problems) < n:
        draws += 1
        if draws > 100 * n + 1000:
            raise ValueError(
                f"could not draw {n} distinct {split} problems of {task.name}: it has fewer; ask for fewer (the "
                f"trainers' eval_n, --eval-n on the command line, counts held-out problems)"
            )
        problem = task.draw(rng)
        if problem.prompt not in seen and split_of(problem.prompt) == split:
            seen.add(problem.prompt)
            problems.append(problem)
    return problems


_FORMAT = re.compile(r"<think>(.*)</think><answer>(.*)</answer>", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def format_ok(text: str) -> bool:
    """True when ``text`` is exactly ``<think>...</think><answer>...</answer>``, each tag once, nothing around it."""
    return _FORMAT.fullmatch(text) is not None and all(text.count(tag) == 1 for tag in _TAGS)


def extract_answer(text: str) -> str | None:
    """What stands between ``<answer>`` and ``</answer>``, or None unless each of the two appears exactly once, in
    that order. A completion that writes several answers gets none: listing guesses must not earn a reward."""
    return inside(text, "<answer>", "</answer>")


def inside(text: str, open_tag: str, close_tag: str) -> str | None:
    """What stands between ``open_tag`` and ``close_tag``, or None unless each appears exactly once, in that order."""
    if text.count(open_tag) != 1 or text.count(close_tag) != 1:
        return None
    start, end = text.index(open_tag) + len(open_tag), text.index(close_tag)
    return text[start:end] if start <= end else None


def is_correct(task, problem: Problem, text: str) -> bool:
    """True when the answer ``task.extract_answer`` reads in the completion ``text`` is the problem's answer (format
    not required)."""
    given = task.extract_answer(text)
    return given is not None and task.same_answer(given, problem.answer)


def token_count(completion: str) -> int:
    """Tokens of ``completion`` under the character tokenizer, counting each tag as one and the closing eos."""
    for tag in _TAGS:
        completion = completion.replace(tag, "#")
    return len(completion) + 1


def token_budget(task, tokenizer) -> int:
    """New tokens to allow for ``task`` under ``tokenizer``: its longest target in that tokenizer's tokens, the eos,
    and ``SLACK``. Under the course's character tokenizer it is ``task.max_new_tokens``."""
    return len(tokenizer(task.longest, add_special_tokens=False)["input_ids"]) + 1 + SLACK


def digit_share(text: str) -> float:
    """The share of the numerals inside ``<think>...</think>`` written as digits rather than letter numerals (A-J);
    0.0 when the completion has no such trace or the trace holds no numeral."""
    trace = inside(text, "<think>", "</think>")
    if trace is None:
        return 0.0
    digits = sum(ch.isascii() and ch.isdigit() for ch in trace)
    numerals = digits + sum(ch in LETTERS for ch in trace)
    return digits / numerals if numerals else 0.0
