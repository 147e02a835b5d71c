"""The fast/full switch and figure saving."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from minirl import plotting
from minirl.course import budget, fast_mode


@pytest.mark.parametrize(("value", "fast"), [("1", True), ("true", True), ("0", False), ("", False), ("no", False)])
def test_fast_mode_reads_the_switch(monkeypatch, value, fast):
    monkeypatch.setenv("MINIRL_FAST", value)
    assert fast_mode() is fast
    assert budget(fast=10, full=1000) == (10 if fast else 1000)


def test_fast_mode_unset_means_full(monkeypatch):
    monkeypatch.delenv("MINIRL_FAST", raising=False)
    assert fast_mode() is False


def test_fast_mode_rejects_unclear_values(monkeypatch):
    monkeypatch.setenv("MINIRL_FAST", "maybe")
    with pytest.raises(ValueError, match="MINIRL_FAST must be one of"):
        fast_mode()


def test_save_figure_writes_only_in_full_mode(monkeypatch, tmp_path):
    monkeypatch.setattr(plotting, "FIGURES", tmp_path)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    monkeypatch.setenv("MINIRL_FAST", "1")
    assert plotting.save_figure(fig, "line") is None
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("MINIRL_FAST", "0")
    path = plotting.save_figure(fig, "line")
    assert path == tmp_path / "line.png" and path.read_bytes().startswith(b"\x89PNG")
    plt.close(fig)


def test_save_figure_crash_keeps_previous_file(monkeypatch, tmp_path):
    monkeypatch.setattr(plotting, "FIGURES", tmp_path)
    monkeypatch.setenv("MINIRL_FAST", "0")
    fig, _ = plt.subplots()
    before = plotting.save_figure(fig, "keep").read_bytes()

    def crash(*args, **kwargs):
        with open(args[0], "wb") as f:
            f.write(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(fig, "savefig", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        plotting.save_figure(fig, "keep")
    assert (tmp_path / "keep.png").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep.png"]
    plt.close(fig)
