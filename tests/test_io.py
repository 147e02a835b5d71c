"""Safe writing (``minirl._io``): a crash at any point of a checkpoint write leaves one complete copy, a run never
writes into a folder it did not make, and an optimizer round-trips through safetensors and JSON without pickle."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from minirl import _io

MARKER = "marker.json"


def fill_with(version: int):
    def fill(folder):
        (folder / "a.txt").write_text(f"a{version}")
        (folder / "sub").mkdir()
        (folder / "sub" / "b.txt").write_text(f"b{version}")
        (folder / MARKER).write_text(json.dumps({"version": version}))

    return fill


def version_of(folder) -> int:
    """The version of a complete copy; an incomplete one fails here."""
    v = json.loads((folder / MARKER).read_text())["version"]
    assert (folder / "a.txt").read_text() == f"a{v}" and (folder / "sub" / "b.txt").read_text() == f"b{v}"
    return v


class Killed(BaseException):
    """Stands for the process being killed: nothing after it runs, not even except-clauses for Exception."""


def test_write_folder_replaces_a_checkpoint_and_keeps_permissions(tmp_path):
    path = tmp_path / "ckpt"
    _io.write_folder(path, fill_with(1), MARKER)
    _io.write_folder(path, fill_with(2), MARKER)
    assert version_of(path) == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert oct(path.stat().st_mode & 0o777) == "0o755" and oct((path / "a.txt").stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("call", ["os.replace#1", "os.replace#2", "shutil.rmtree#1", "fill"])
def test_a_kill_at_any_point_leaves_a_complete_copy(tmp_path, monkeypatch, call):
    """Kill the write at each of its steps: moving the old copy aside, moving the new one in, removing the old one,
    or while filling. Afterwards ``recover_folder`` finds a complete copy, the old one or the new one."""
    path = tmp_path / "ckpt"
    _io.write_folder(path, fill_with(1), MARKER)
    name, _, nth = call.partition("#")
    fill = fill_with(2)
    if name == "fill":

        def fill(folder):
            (folder / "a.txt").write_text("half")
            raise Killed

    else:
        module, func = name.split(".")
        real, calls = getattr(globals()[module], func), []

        def dying(*args, **kwargs):
            calls.append(1)
            if len(calls) == int(nth):
                raise Killed
            return real(*args, **kwargs)

        monkeypatch.setattr(_io.os if module == "os" else _io.shutil, func, dying)
    with pytest.raises(Killed):
        _io.write_folder(path, fill, MARKER)
    monkeypatch.undo()
    assert version_of(_io.recover_folder(path)) in (1, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # nothing left behind after recovery
    _io.write_folder(path, fill_with(3), MARKER)  # and the next write works
    assert version_of(path) == 3


def test_the_aside_copy_is_never_deleted_while_it_is_the_only_complete_one(tmp_path):
    path = tmp_path / "ckpt"
    _io.write_folder(path, fill_with(1), MARKER)
    os.replace(path, tmp_path / ".ckpt.old")  # a kill between the two renames
    _io.write_folder(path, fill_with(2), MARKER)  # the next write recovers first, then replaces
    assert version_of(path) == 2


def test_a_foreign_folder_is_never_replaced_or_claimed(tmp_path):
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match="not written by minirl.*Choose a new or empty folder"):
        _io.write_folder(mine, fill_with(1), MARKER)
    with pytest.raises(FileExistsError, match="chapter1.tex"):
        _io.claim_folder(mine)
    assert [p.name for p in mine.iterdir()] == ["chapter1.tex"]
    assert (mine / "chapter1.tex").read_text() == "years of work"
    assert oct(mine.stat().st_mode & 0o777) != "0o700"
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        _io.claim_folder(tmp_path / "file")


def test_claim_folder_accepts_new_empty_and_its_own_folders(tmp_path):
    run = _io.claim_folder(tmp_path / "new" / "run")
    assert (run / _io.RUN_MARKER).exists()
    (run / "history.csv").write_text("step\n")
    assert _io.claim_folder(run) == run  # a folder minirl made can be used again
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (_io.claim_folder(empty) / _io.RUN_MARKER).exists()


def test_optimizer_state_round_trips_without_pickle(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
    tensors, meta = _io.optimizer_state(opt)
    save_file(tensors, tmp_path / "opt.safetensors")
    (tmp_path / "opt.json").write_text(json.dumps(meta))
    twin = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    twin.load_state_dict(model.state_dict())
    opt2 = torch.optim.AdamW(twin.parameters(), lr=0.5)
    meta = json.loads((tmp_path / "opt.json").read_text())
    _io.load_optimizer_state(opt2, load_file(tmp_path / "opt.safetensors"), meta)
    assert opt2.param_groups[0]["lr"] == 1e-3  # the saved learning rate, not the new optimizer's
    x = torch.randn(5, 3)
    for m, o in ((model, opt), (twin, opt2)):  # one more step on each: identical parameters
        o.zero_grad()
        m(x).pow(2).mean().backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))


def test_recover_removes_unfinished_temporaries_only(tmp_path):
    path = tmp_path / "ckpt"
    _io.write_folder(path, fill_with(1), MARKER)
    (tmp_path / ".ckpt.tmp-abc").mkdir()
    (tmp_path / "other").mkdir()
    _io.recover_folder(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "other"]
    shutil.rmtree(tmp_path / "other")


def test_the_working_folder_is_never_replaced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / MARKER).write_text("{}")  # even a folder that looks like a checkpoint
    for where in (".", "..", str(tmp_path)):
        with pytest.raises(ValueError, match="the folder you are working in"):
            _io.write_folder(where, fill_with(1), MARKER)
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER]
