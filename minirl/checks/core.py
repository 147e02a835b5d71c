"""What every check shares: named cases, the call of the student's function, the comparison and the report.

A check runs its cases in order, simplest first. Each case is one situation (an episode that ends, a group whose
rewards are all equal) with the hint a student needs when that case is the first to fail. The first mismatch stops
the check with a ``CheckFailed`` that shows the case, its inputs, the expected and the returned value, and the hint.
"""

import copy
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

RTOL, ATOL = 1e-4, 1e-5  # the same math in another order differs by ~1e-7 relative in float32; a bug by far more


class CheckFailed(AssertionError):
    """A student's function disagrees with the reference. An AssertionError, so pytest and nbgrader count a failure."""


@dataclass(frozen=True)
class NoValue:
    """What a check's ``call`` returns in place of a result that could not be computed, and why."""

    reason: str


@dataclass
class Case:
    """One situation to test. ``args`` go positionally, in order, to the student's function and to the reference."""

    name: str  # the situation in words: "an episode ends by termination"
    args: dict[str, Any]  # argument name -> value, in the order of the signature
    hint: str  # what to look at when this case is the first to fail, in a student's words
    shown: dict[str, str] = field(default_factory=dict)  # how to print an argument that is not a tensor or number


def generator(seed: int) -> torch.Generator:
    """A fixed seed for every check: the same cases on every run, on every machine."""
    return torch.Generator().manual_seed(seed)


def run(
    check: str,
    fn: Callable,
    reference: Callable,
    cases: list[Case],
    call: Callable | None = None,
    outputs: tuple[str, ...] = ("output",),
    output_hints: dict[str, str] | None = None,
) -> None:
    """Compare ``fn`` with ``reference`` on every case: print one line when all agree, else raise CheckFailed.

    ``call(f, *args)`` applies a function to a case's arguments (default ``f(*args)``); a check that needs more than
    one call per case (a returned function applied to a vector, a gradient) wraps it there. ``outputs`` names the
    parts of a tuple result, and ``output_hints`` replaces the case's hint when that part is the one that differs.
    """
    call = call or (lambda f, *args: f(*args))
    for case in cases:
        expected = call(reference, *_fresh(case.args))
        got = _student_call(check, fn, call, case)
        problem, part = compare(expected, got, outputs)
        if problem:
            hint = (output_hints or {}).get(part, case.hint)
            raise CheckFailed(_report(check, fn, case, problem, hint))
    print(f"{check}: pass ({len(cases)} cases)")


def compare(expected, got, outputs: tuple[str, ...] = ("output",)) -> tuple[str | None, str | None]:
    """(a description of the first difference, the name of the output that differs), or (None, None)."""
    if len(outputs) > 1:
        if not isinstance(got, tuple) or len(got) != len(outputs):
            return f"expected a tuple ({', '.join(outputs)}), got {_type(got)}", outputs[0]
        for name, e, g in zip(outputs, expected, got):
            problem = _compare_one(name, e, g)
            if problem:
                return problem, name
        return None, None
    problem = _compare_one(outputs[0], expected, got)
    return (problem, outputs[0]) if problem else (None, None)


def _compare_one(name: str, expected, got) -> str | None:
    if isinstance(expected, torch.Tensor):
        return _compare_tensor(name, expected, got)
    if isinstance(expected, bool):
        if not isinstance(got, (bool, np.bool_)):
            return f"{name}: expected True or False, got {_type(got)}; return a bool (wrap a condition in bool(...))"
        return None if bool(got) == expected else f"{name}: expected {expected}, got {bool(got)}"
    if isinstance(expected, list):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"{name}: expected a list of {len(expected)} numbers (one per item), got {_type(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            if not isinstance(g, (int, float, np.number)) or not np.isclose(g, e, rtol=RTOL, atol=ATOL):
                return (f"{name}:\n    expected {expected}\n    got      {list(got)}\n"
                        f"    first difference at item {i}: expected {e}, got {g!r}")
        return None
    raise TypeError(f"no comparison for a reference result of type {type(expected).__name__}")


def _compare_tensor(name: str, expected: torch.Tensor, got) -> str | None:
    if isinstance(got, NoValue):
        return f"{name}: {got.reason}"
    if got is None:
        return f"{name}: expected a torch.Tensor of shape {tuple(expected.shape)}, got None; is a `return` missing?"
    if not isinstance(got, torch.Tensor):
        return (f"{name}: expected a torch.Tensor of shape {tuple(expected.shape)}, got {_type(got)}; "
                "build the result with torch operations")
    if got.shape != expected.shape:
        return f"{name}: shape expected {tuple(expected.shape)}, got {tuple(got.shape)}\n{_pair(expected, got)}"
    if got.dtype != expected.dtype:
        return (f"{name}: dtype expected {_dtype(expected)}, got {_dtype(got)}; keep the inputs' dtype (make new "
                "tensors with torch.zeros_like(x) or dtype=x.dtype, convert masks with .to(x.dtype))")
    got = got.detach().cpu()
    if expected.dtype == torch.bool:
        bad = got != expected
    else:
        bad = ~torch.isclose(got, expected, rtol=RTOL, atol=ATOL)
    if not bad.any():
        return None
    index = tuple(torch.nonzero(bad)[0].tolist())
    e, g = expected[index].item(), got[index].item()
    return f"{name}:\n{_pair(expected, got)}\n    first difference at index {index}: expected {e:.6g}, got {g:.6g}"


def _pair(expected: torch.Tensor, got: torch.Tensor) -> str:
    return f"    expected {show(expected, 13)}\n    got      {show(got, 13)}"


def show(x, indent: int = 4) -> str:
    """A value printed compactly: a tensor as its shape, dtype and (rounded) entries; long things shortened.
    ``indent`` is the column where the text starts, so that a matrix's rows line up."""
    if isinstance(x, torch.Tensor):
        head = f"{tuple(x.shape)} {_dtype(x)} "
        pad = indent + len(head)  # the column of the first "[", where the next rows line up
        text = np.array2string(x.detach().cpu().numpy(), precision=4, suppress_small=True, threshold=60,
                               edgeitems=3, max_line_width=max(40, 110 - pad))
        return head + text.replace("\n", "\n" + " " * pad)
    text = repr(x)
    return text if len(text) <= 300 else text[:300] + "..."


def _fresh(args: dict[str, Any]) -> list:
    """Copies of the arguments, so that a function that writes into its inputs cannot change the next call's."""
    return [a.clone() if isinstance(a, torch.Tensor) else copy.copy(a) for a in args.values()]


def _student_call(check: str, fn: Callable, call: Callable, case: Case):
    name = getattr(fn, "__name__", "your function")
    try:
        return call(fn, *_fresh(case.args))
    except NotImplementedError as err:
        if not str(err):  # the stub nbgrader leaves; torch's own NotImplementedErrors carry a message
            raise CheckFailed(
                f"{check}: {name} is not implemented yet: replace the `raise NotImplementedError()` with your code"
            ) from None
        problem = f"{name} raised NotImplementedError: {err}{_where(fn, err)}"
    except Exception as err:
        problem = f"{name} raised {type(err).__name__}: {err}{_where(fn, err)}"
    raise CheckFailed(_report(check, fn, case, problem, case.hint))


def _where(fn: Callable, err: Exception) -> str:
    """The line of the student's code where ``err`` was raised, when it was raised in the student's file."""
    code = getattr(fn, "__code__", None)
    frames = [f for f in traceback.extract_tb(err.__traceback__) if code and f.filename == code.co_filename]
    if not frames:
        return ""
    return f"\n  at line {frames[-1].lineno} of {fn.__name__}" + (f": {frames[-1].line}" if frames[-1].line else "")


def _report(check: str, fn: Callable, case: Case, problem: str, hint: str) -> str:
    name = getattr(fn, "__name__", "your function")
    inputs = "\n".join(f"    {k} = {case.shown.get(k) or show(v, len(k) + 7)}" for k, v in case.args.items())
    return f"{check}: {name} fails on case '{case.name}'\n  inputs:\n{inputs}\n  {problem}\n  hint: {hint}"


def _dtype(x: torch.Tensor) -> str:
    return str(x.dtype).removeprefix("torch.")


def _type(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__} {show(x)}"
