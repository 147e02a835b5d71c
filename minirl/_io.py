"""Writing folders safely: minirl only writes where it may, and a crash never leaves a half-written checkpoint.

Three rules, shared by every checkpoint minirl writes (gymnasium policies, language models, trainer state):

- **Only our own folders.** ``claim_folder`` refuses a non-empty folder that minirl did not make (it has no marker
  file), so a run never deletes or replaces a user's files.
- **Whole or not at all.** ``write_folder`` fills a temporary sibling folder and moves it into place. A folder cannot
  replace another in one step, so the old one is renamed aside first and removed last; ``recover_folder`` finishes
  or undoes a swap that a crash interrupted, so at every moment one complete copy can be found.
- **No code in a checkpoint.** State is tensors (safetensors) and JSON; ``optimizer_state`` and
  ``load_optimizer_state`` carry an optimizer through them without pickle.
"""

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

RUN_MARKER = ".minirl-run"  # in every output folder a minirl run made


def _aside(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def _temporaries(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f".{path.name}.tmp-*"))


def recover_folder(path: str | os.PathLike) -> Path:
    """Finish or undo a ``write_folder`` that was interrupted; return ``path``.

    After a crash between the two renames only the aside copy (complete: it was the previous checkpoint) exists, and
    it is moved back. When both exist, ``path`` is the newer complete copy and the aside one is removed. Temporary
    folders of unfinished writes are removed: they were never complete.
    """
    path = Path(path)
    old = _aside(path)
    if old.exists():
        if path.exists():
            shutil.rmtree(old)
        else:
            os.replace(old, path)
    for tmp in _temporaries(path):
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def replaceable(path: Path, marker: str) -> bool:
    """True when ``path`` is absent, an empty folder, or a folder holding ``marker`` (one that minirl wrote)."""
    if not path.exists():
        return True
    return path.is_dir() and (not any(path.iterdir()) or (path / marker).exists())


def refuse_foreign(path: Path, marker: str, what: str) -> None:
    """Raise unless ``replaceable(path, marker)``, naming the files found and the fix."""
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} is a file, not a folder; choose a new folder for the {what}")
    if not replaceable(path, marker):
        found = sorted(p.name for p in path.iterdir())
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise FileExistsError(
            f"{path} is not empty ({shown}) and was not written by minirl, so minirl will not write the {what} "
            f"there: nothing of yours is deleted or replaced. Choose a new or empty folder (for example runs/NAME)."
        )


def claim_folder(path: str | os.PathLike, what: str = "run") -> Path:
    """Make ``path`` an output folder of minirl's: create it, or accept it when empty or already minirl's.

    Raises ``FileExistsError`` for a non-empty folder without the marker, before any work starts.
    """
    path = Path(path)
    refuse_foreign(path, RUN_MARKER, what)
    path.mkdir(parents=True, exist_ok=True)
    marker = path / RUN_MARKER
    if not marker.exists():
        marker.write_text(json.dumps({"written_by": "minirl", "what": what}) + "\n")
    return path


def write_folder(path: str | os.PathLike, fill: Callable[[Path], None], marker: str) -> Path:
    """Write the folder ``path`` whole: ``fill(tmp)`` writes the files (``marker`` among them) into a temporary folder,
    which then replaces ``path``. An exception or a kill at any point leaves a complete copy, old or new, that
    ``recover_folder`` puts back at ``path``. Refuses to replace a non-empty folder without ``marker``."""
    path = Path(path).resolve()
    if path == Path.cwd() or path in Path.cwd().parents:
        raise ValueError(
            f"cannot write a checkpoint as {path}: it is the folder you are working in (or holds it), and writing a "
            "checkpoint replaces its folder; give a subfolder such as runs/NAME"
        )
    recover_folder(path)
    refuse_foreign(path, marker, "checkpoint")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        fill(tmp)
        if not (tmp / marker).exists():
            raise RuntimeError(f"a checkpoint must contain {marker}; fill() did not write it")
        for file in tmp.rglob("*"):
            file.chmod(0o755 if file.is_dir() else 0o644)
        tmp.chmod(0o755)  # mkdtemp makes the folder private; a checkpoint is for everyone
        old = _aside(path)
        if path.exists():
            os.replace(path, old)  # a folder cannot be replaced in one step: move the old one aside first
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """An optimizer's state as ``(tensors, meta)``: tensors for safetensors, the rest as JSON-ready values."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, slots in sd["state"].items():
        for name, value in slots.items():
            if torch.is_tensor(value):
                tensors[f"state.{index}.{name}"] = value.detach().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer_state(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Restore what ``optimizer_state`` saved into ``optimizer`` (built over the same parameters)."""
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    for key, value in meta["scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
