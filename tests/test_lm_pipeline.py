"""The R1 pipeline at classroom scale (minirl.lm.pipeline): filters and compute counts against hand-made cases, and
learning tests that a broken stage would miss, each with a sabotaged twin (marked slow) that must miss it."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from minirl.lm import build_tokenizer, pipeline
from minirl.lm.tasks import Problem, format_ok, get_task

TASK = get_task("addition")
TOK = build_tokenizer()  # sets the completion budget; the fake sampler below writes the texts
P = TASK.solve(347, 585)  # 347+585=<think>7+5=12 c1 4+8+1=13 c1 3+5+1=9 c0</think><answer>932</answer>
Q = TASK.solve(100, 200)


# --- filters ---


@pytest.mark.parametrize(
    "text, right, readable",
    [
        (P.completion, True, True),
        ("<think>whatever</think><answer>932</answer>", True, True),  # the verifier checks the answer, not the trace
        ("junk<think>x</think><answer>932</answer>", True, False),  # right answer, unreadable shape
        ("<think>x</think><answer>933</answer>", False, True),
        ("<answer>932</answer>", True, False),
        ("<think>x</think><answer>932</answer><answer>932</answer>", False, False),  # two answers earn nothing
        ("", False, False),
    ],
)
def test_filters_on_hand_made_completions(text, right, readable):
    assert pipeline.keep_fn("correct")(TASK, P, text) is right
    assert pipeline.verified(TASK, P, text) is (right and readable)
    assert pipeline.keep_fn("all")(TASK, P, text) is True


def test_unknown_filter_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="verified"):
        pipeline.keep_fn("best")


def fake_sampler(monkeypatch, texts: list[str]):
    """Make pipeline.sample return ``texts`` in order, whatever the model (a batch of any size takes the next ones)."""
    queue = list(texts)

    def sample(model, tokenizer, prompts, max_new_tokens, **kw):
        out = [queue.pop(0) for _ in prompts]
        return SimpleNamespace(text=out)

    monkeypatch.setattr(pipeline, "sample", sample)
    return SimpleNamespace(parameters=lambda: iter([torch.zeros(1)]))


def test_rejection_sample_keeps_verified_distinct_completions_per_prompt(monkeypatch):
    right_p, right_q = P.completion, Q.completion
    texts = [
        right_p, right_p, "<think>x</think><answer>931</answer>", "x<answer>932</answer>",  # P: 2 right, 1 unreadable
        "<think>x</think><answer>1</answer>", "<think>y</think><answer>300</answer>", right_q, "",  # Q: 2 verified
    ]  # fmt: skip
    model = fake_sampler(monkeypatch, texts)
    traces = pipeline.rejection_sample(model, TOK, TASK, [P, Q], k=4, per_prompt=2, batch_size=3)
    assert traces.sampled == 8
    assert traces.correct == 5  # right_p twice, the unreadable one, and Q's two
    assert traces.readable == 6
    assert traces.examples == [(P.prompt, right_p), (Q.prompt, "<think>y</think><answer>300</answer>"),
                               (Q.prompt, right_q)]  # fmt: skip
    assert traces.problems == [P, Q, Q] and traces.solved == 2
    model = fake_sampler(monkeypatch, texts)
    one = pipeline.rejection_sample(model, TOK, TASK, [P, Q], k=4, per_prompt=1)
    assert [p for p, _ in one.examples] == [P.prompt, Q.prompt]
    model = fake_sampler(monkeypatch, texts)
    everything = pipeline.rejection_sample(model, TOK, TASK, [P, Q], k=4, keep="all", per_prompt=4)
    assert len(everything.examples) == 7  # 8 rows, one duplicate of right_p


@pytest.mark.parametrize("bad", [dict(k=0), dict(per_prompt=0), dict(problems=[])])
def test_rejection_sample_refuses_bad_arguments(bad):
    kwargs = dict(model=None, tokenizer=None, task=TASK, problems=[P], k=2) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        pipeline.rejection_sample(**kwargs)


# --- compute and inheritance ---


def test_sft_compute_counts_three_passes_per_real_token():
    from minirl.lm import build_tokenizer

    tok = build_tokenizer()
    examples = [("1+2=", "ab"), ("10+20=", "abcd")]  # bos + prompt + completion + eos: 1+4+2+1 and 1+6+4+1 tokens
    assert pipeline.sft_compute(tok, examples, steps=5, batch_size=4) == pytest.approx(3 * 10 * 5 * 4)


def test_grpo_compute_counts_sampling_once_and_training_three_times():
    rows = [{"length": 10.0, "rows_computed": 4.0}, {"length": 20.0, "rows_computed": 0.0}]
    # step 1: 2 x 3 rows of 5 + 10 tokens sampled, 4 rows trained; step 2: 6 rows of 25 sampled, none trained
    want = 6 * 15 + 3 * 4 * 15 + 6 * 25
    assert pipeline.grpo_compute(rows, prompt_tokens=5.0, group_size=2, prompts_per_step=3) == want


def test_shared_errors_against_a_hand_count():
    teacher = torch.tensor([1.0, 1, 0, 0, 0, 1, 1, 1])  # wrong on problems 2, 3, 4
    student = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1])  # wrong on 1, 2, 3
    got = pipeline.shared_errors(teacher, student)
    assert got["p_wrong"] == pytest.approx(3 / 8)
    assert got["p_wrong_given_teacher_wrong"] == pytest.approx(2 / 3)
    assert got["lift"] == pytest.approx((2 / 3) / (3 / 8))
    assert got["shared"] == pytest.approx(2 / 8)
    assert got["shared_if_independent"] == pytest.approx(3 / 8 * 3 / 8)


def test_carries_counts_the_columns_that_carry():
    assert pipeline.carries(P) == 2 and pipeline.carries(Q) == 0 and pipeline.carries(TASK.solve(999, 999)) == 3


@pytest.mark.parametrize("field, value", [("k", 0), ("keep", "best"), ("lr", -1.0), ("task", "chess"), ("steps", 1.5)])
def test_distill_config_is_checked(field, value):
    with pytest.raises((ValueError, TypeError), match=field):
        pipeline.check_config(dataclasses.replace(pipeline.DistillConfig(), **{field: value}))


@pytest.mark.parametrize("field, value", [("traces", 0), ("lr", 0.0), ("task", "chess"), ("steps", 2.5)])
def test_cold_start_config_is_checked(field, value):
    with pytest.raises((ValueError, TypeError), match=field):
        pipeline.check_config(dataclasses.replace(pipeline.ColdStartConfig(), **{field: value}))


def test_cold_start_refuses_a_foreign_folder_before_any_work(tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.setattr(pipeline, "load", lambda *a, **k: pytest.fail("loaded a model before refusing the folder"))
    with pytest.raises(FileExistsError, match="not empty"):
        pipeline.cold_start(pipeline.ColdStartConfig(out=str(tmp_path)))
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_cold_start_from_the_command_line_trains_saves_and_reports(tmp_path, capsys, one_thread):
    """A few SFT steps of the small student on the mixed task: saved with its scores, printed before and after."""
    import json

    from minirl.cli import main
    from minirl.lm import load

    out = tmp_path / "cold"
    main(["lm", "cold-start", "--model", str(pipeline.STUDENT), "--task", "addition-mixed", "--traces", "16",
          "--steps", "3", "--batch-size", "8", "--eval-n", "8", "--threads", "1", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert "before: held-out greedy accuracy" in printed and "minirl lm grpo --model" in printed
    record = json.loads((out / "minirl.json").read_text())
    assert record["config"]["traces"] == 16 and record["heldout"]["n"] == 8
    start, _ = load(pipeline.STUDENT, device="cpu")
    model, _ = load(out, device="cpu")
    changed = [not torch.equal(a, b) for a, b in zip(start.parameters(), model.parameters())]
    assert any(changed)


def test_checkpoints_are_what_the_readme_says():
    import json

    teacher = json.loads((pipeline.TEACHER / "minirl.json").read_text())
    student = json.loads((pipeline.STUDENT / "minirl.json").read_text())
    assert teacher["parameters"] >= 7 * student["parameters"]  # "several times the student's parameters"
    assert teacher["heldout"]["greedy_accuracy"] > 0.7 and student["heldout"]["greedy_accuracy"] < 0.3
    mixed = json.loads((pipeline.CHECKPOINTS / "tiny-adder-mixed" / "minirl.json").read_text())
    assert mixed["config"]["task"] == "addition-mixed" and 0.3 < mixed["heldout"]["greedy_digit_share"] < 0.8


# --- learning tests: each stage must move held-out accuracy by a margin a broken stage misses ---

RSFT = pipeline.DistillConfig(student=str(pipeline.CHECKPOINTS / "tiny-adder"), prompts=300, k=2, steps=60,
                              eval_n=200, threads=1)  # fmt: skip
DISTILL = pipeline.DistillConfig(prompts=300, k=2, steps=150, eval_n=200, threads=1)
RSFT_GAIN, DISTILL_GAIN = 0.25, 0.23  # measured once: +36 points (RSFT), +31 (distillation); see the twins


def check_rejection_sampling_sft(cfg):
    result = pipeline.sft_on_traces(cfg)
    assert all(format_ok(text) for _, text in result.traces.examples)
    assert all(TASK.same_answer(text.split("<answer>")[1][: -len("</answer>")], p.answer)
               for (_, text), p in zip(result.traces.examples, result.traces.problems))  # fmt: skip
    return result


@pytest.mark.learning
def test_rejection_sampling_sft_lifts_the_base_model():
    r = check_rejection_sampling_sft(RSFT)
    print(f"RSFT: kept {len(r.traces.examples)}/{r.traces.sampled}, {r.before.accuracy:.3f} -> {r.after.accuracy:.3f}")
    assert r.after.accuracy >= r.before.accuracy + RSFT_GAIN


@pytest.mark.learning
def test_distilled_student_beats_its_start():
    r = check_rejection_sampling_sft(DISTILL)
    print(f"distill: kept {len(r.traces.examples)}, {r.before.accuracy:.3f} -> {r.after.accuracy:.3f}")
    assert r.after.accuracy >= r.before.accuracy + DISTILL_GAIN


def forgot_the_answer_check(task, problem: Problem, text: str) -> bool:
    """A realistic bug in a filter: it checks that the completion is readable and never asks the verifier."""
    return format_ok(text)


@pytest.mark.slow
def test_sabotaged_distillation_on_unverified_traces_misses_the_margin(monkeypatch):
    """Measured once: 23.5% -> 39.0% (+15.5 points) with the filter that forgot the verifier, against +31 with it."""
    monkeypatch.setattr(pipeline, "verified", forgot_the_answer_check)
    r = pipeline.sft_on_traces(DISTILL)
    print(f"sabotaged distill: kept {len(r.traces.examples)}, {r.before.accuracy:.3f} -> {r.after.accuracy:.3f}")
    assert r.after.accuracy < r.before.accuracy + DISTILL_GAIN


@pytest.mark.slow
def test_sabotaged_rejection_sampling_sft_is_caught(monkeypatch):
    """The accuracy margin alone does NOT see this bug on the base model: measured once, 35.0% -> 64.5% (+29.5
    points) with unverified traces against 71.0% (+36) with verified ones, both above RSFT_GAIN. The learning test's
    check that every kept trace is right (and ``test_rejection_sample_keeps_verified_distinct_completions_per_prompt``)
    is what catches it, so the whole test must fail under the sabotage."""
    monkeypatch.setattr(pipeline, "verified", forgot_the_answer_check)
    with pytest.raises(AssertionError):
        test_rejection_sampling_sft_lifts_the_base_model()
