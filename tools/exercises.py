"""Write the student version of every notebook that holds exercises: ``make exercises`` (into ``exercises/``).

nbgrader's own preprocessors do the work: ``ClearSolutions`` replaces each solution region (the lines between the
BEGIN and END SOLUTION markers of a cell marked ``solution`` in its ``nbgrader`` metadata) with a stub that raises
``NotImplementedError``; ``ClearHiddenTests`` drops hidden-test regions; ``ClearOutput`` every output.

    python tools/exercises.py [SOURCE [OUT]]      (defaults: notebooks exercises)
"""

import argparse
import copy
from pathlib import Path

import nbformat
from nbgrader.preprocessors import ClearHiddenTests, ClearOutput, ClearSolutions


def has_exercises(nb: nbformat.NotebookNode) -> bool:
    return any(cell.metadata.get("nbgrader", {}).get("solution") for cell in nb.cells)


def student_version(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook with its solutions replaced by stubs, its hidden tests removed and no outputs (a new object)."""
    nb, resources = copy.deepcopy(nb), {}
    for preprocessor in (ClearSolutions(), ClearHiddenTests(), ClearOutput()):
        nb, resources = preprocessor.preprocess(nb, resources)
    return nb


def write_exercises(source: Path, out: Path) -> list[Path]:
    """Write the student version of each notebook of ``source`` with exercises to ``out``; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(source.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if has_exercises(nb):
            nbformat.write(student_version(nb), out / path.name)
            written.append(out / path.name)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Write the student versions of the notebooks with exercises.")
    parser.add_argument("source", nargs="?", type=Path, default=Path("notebooks"), help="the solution notebooks")
    parser.add_argument("out", nargs="?", type=Path, default=Path("exercises"), help="where the student versions go")
    args = parser.parse_args()
    for path in write_exercises(args.source, args.out):
        print(path)
