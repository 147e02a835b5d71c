"""The two install routes list the same dependencies, and the commands the README promises exist."""

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def pyproject_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + project["optional-dependencies"]["dev"]


def environment_pip_requirements() -> list[str]:
    """The entries under ``- pip:`` in environment.yml (a flat list, read without a YAML parser)."""
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    entries = []
    for line in lines[start + 1 :]:
        if not line.strip() or len(line) - len(line.lstrip()) < indent:
            break
        entries.append(line.strip()[2:].strip())
    return [e for e in entries if e != "-e ."]


def normalise(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_matches_pyproject():
    pyproject = sorted(map(normalise, pyproject_requirements()))
    conda = sorted(map(normalise, environment_pip_requirements()))
    assert pyproject == conda, (
        "environment.yml and pyproject.toml list different dependencies:\n"
        f"  only in pyproject.toml: {sorted(set(pyproject) - set(conda))}\n"
        f"  only in environment.yml: {sorted(set(conda) - set(pyproject))}"
    )


def test_environment_yml_installs_the_package_and_python_version_agrees():
    text = (ROOT / "environment.yml").read_text()
    assert "- -e ." in text
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert f"python{requires}" in text


def test_readme_names_the_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("lab:", "test:", "full:"):
        assert target in makefile
