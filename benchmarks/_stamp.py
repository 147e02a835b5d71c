"""The line every benchmark table starts with: commit, CPU, date, library versions."""

import datetime
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def stamp(packages: tuple[str, ...] = ("torch", "gymnasium", "stable-baselines3")) -> str:
    root = Path(__file__).resolve().parent.parent
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return (
        f"Commit {commit.strip()}{' (with local changes)' if dirty else ''}; {cpu}; "
        f"{datetime.date.today().isoformat()}; {', '.join(versions)}."
    )
