"""The course's figures.

``save_figure`` writes into the repository's ``figures/`` folder in full mode only, so a CI run (fast mode) never
overwrites the figures the README shows. Introduced in ``notebooks/00_welcome.ipynb``.
"""

import os
import tempfile
from pathlib import Path

from minirl.course import fast_mode

FIGURES = Path(__file__).resolve().parent.parent / "figures"


def save_figure(fig, name: str) -> Path | None:
    """Save ``fig`` as ``figures/<name>.png`` in full mode; in fast mode do nothing and return None.

    The file is written to a temporary name and renamed, so a crash never leaves a half-written figure.
    """
    if fast_mode():
        return None
    FIGURES.mkdir(exist_ok=True)
    path = FIGURES / f"{name}.png"
    fd, tmp = tempfile.mkstemp(dir=FIGURES, suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        os.chmod(tmp, 0o644)  # mkstemp makes the file private; a figure is for everyone
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def plot_history(history, keys: tuple[str, ...] = ("return_mean",), x: str = "step", title: str = ""):
    """One panel per metric of a training ``History`` against ``x`` (environment steps by default)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        ax.plot(history[x], history[key], lw=1.6)
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel(key.replace("_", " "))
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
