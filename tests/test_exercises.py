"""The exercises: each solution notebook passes its checks, and the student version that ``make exercises`` writes
(with nbgrader's preprocessors) fails each check as "not implemented yet". Only the exercise cells run, after the
notebook's import statements: the whole notebooks run under nbval, and CI time is tight."""

import ast
import importlib.util
from pathlib import Path

import nbformat
import pytest

from minirl.checks import CheckFailed

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("exercises", ROOT / "tools" / "exercises.py")
exercises = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(exercises)

NOTEBOOKS = [p.name for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
             if exercises.has_exercises(nbformat.read(p, as_version=4))]


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory) -> Path:
    """The student versions, written by the code behind ``make exercises``."""
    out = tmp_path_factory.mktemp("exercises")
    written = exercises.write_exercises(ROOT / "notebooks", out)
    assert sorted(p.name for p in written) == NOTEBOOKS
    return out


def role(cell) -> str | None:
    """"solution" or "check" for the code cells of an exercise, else None."""
    marks = cell.metadata.get("nbgrader", {})
    if cell.cell_type != "code":
        return None
    return "solution" if marks.get("solution") else "check" if marks.get("grade") else None


def import_statements(nb) -> str:
    """Every top-level import of the notebook's code cells: what the exercise cells may use."""
    lines = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            tree = ast.parse(cell.source)
            lines += [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    return "\n".join(lines)


def exercise_cells(nb) -> list[tuple[str, str]]:
    """(solution source, check source) of each exercise, in the notebook's order."""
    cells = [(role(c), c.source) for c in nb.cells if role(c)]
    assert [r for r, _ in cells] == ["solution", "check"] * (len(cells) // 2), "each solution cell, then its check"
    return [(cells[i][1], cells[i + 1][1]) for i in range(0, len(cells), 2)]


def test_every_notebook_from_01_to_12_has_an_exercise():
    assert [name[:2] for name in NOTEBOOKS] == [f"{i:02d}" for i in range(1, 13)]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_solutions_pass_their_checks(name, one_thread, capsys):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    namespace = {}
    exec(import_statements(nb), namespace)
    for solution, check in exercise_cells(nb):
        exec(solution, namespace)
        exec(check, namespace)
    out = capsys.readouterr().out
    assert out.count(": pass (") >= len(exercise_cells(nb)) and "fails" not in out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_student_version_has_stubs_and_fails_each_check(name, student_dir, one_thread):
    solution_nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    student = nbformat.read(student_dir / name, as_version=4)
    assert len(student.cells) == len(solution_nb.cells)
    for cell, original in zip(student.cells, solution_nb.cells):
        assert not cell.get("outputs") and "BEGIN SOLUTION" not in cell.source
        if role(cell) == "solution":
            assert "raise NotImplementedError()" in cell.source and cell.source != original.source
        else:
            assert cell.source == original.source  # only the solutions change
    namespace = {}
    exec(import_statements(student), namespace)
    for solution, check in exercise_cells(student):
        exec(solution, namespace)
        with pytest.raises(CheckFailed, match="is not implemented yet: replace the `raise NotImplementedError"):
            exec(check, namespace)
