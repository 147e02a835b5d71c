"""Static figures for the course's two widgets, so that a page without a live kernel still teaches.

    python tools/widget_figures.py      # writes figures/05_clip_eps.png and figures/07_group_advantages.png

Each figure calls the very function behind the widget, taken from its notebook's code cell (``plot_clip`` in
notebook 05, ``group_to_advantages`` in notebook 07), for a few settings side by side.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import torch  # noqa: E402

from minirl.losses import ppo_clip_loss  # noqa: E402
from minirl.returns import group_advantages  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def notebook_function(notebook: str, name: str, namespace: dict):
    """Run the code cell of ``notebook`` that defines ``name`` (only that cell) and return the function."""
    nb = nbformat.read(ROOT / "notebooks" / notebook, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and f"def {name}(" in c.source)
    source = cell.source.split("\n\n\n")[0]  # the definition; the cell's lines after it draw or assert
    exec(compile(source, f"{notebook}:{name}", "exec"), namespace)  # noqa: S102 -- our own notebook
    return namespace[name]


def clip_figure(path: Path) -> None:
    plot_clip = notebook_function("05_ppo.ipynb", "plot_clip", {"plt": plt, "torch": torch,
                                                                 "ppo_clip_loss": ppo_clip_loss})
    epsilons = (0.1, 0.2, 0.3, 0.5)
    fig, axes = plt.subplots(2, len(epsilons), figsize=(13, 5.6), sharex=True, sharey="row")
    for col, eps in enumerate(epsilons):
        curves = plot_clip(eps, show=False)  # the slider's function: the curves it draws for this epsilon
        for row, name in enumerate(("A > 0", "A < 0")):
            ax, c = axes[row, col], curves[name]
            ax.axvspan(1 - eps, 1 + eps, color="0.9")
            ax.plot(c["ratio"], c["cpi"], "--", color="C0", label=r"$L^{CPI} = \rho A$")
            ax.plot(c["ratio"], c["clip"], color="C3", lw=2, label=r"$L^{CLIP}$")
            ax.axvline(1, color="0.6", lw=0.8)
            if row == 0:
                ax.set_title(rf"$\epsilon$ = {eps}: band [{1 - eps:.1f}, {1 + eps:.1f}]")
            else:
                ax.set_xlabel(r"ratio $\rho = \pi_\theta / \pi_{old}$")
        axes[0, col].legend(fontsize=8, loc="upper left")
    axes[0, 0].set_ylabel("objective, A = +1")
    axes[1, 0].set_ylabel("objective, A = -1")
    fig.suptitle(r"The clipped surrogate for four values of $\epsilon$: beyond the band (grey) on the helpful side "
                 "it is flat, so the sample stops pulling", y=0.99)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def group_figure(path: Path) -> None:
    to_adv = notebook_function("07_grpo_on_cartpole.ipynb", "group_to_advantages",
                               {"plt": plt, "torch": torch, "group_advantages": group_advantages})
    returns = [20.0, 35.0, 60.0, 22.0, 500.0, 41.0]  # the widget's starting values
    cases = [
        ("one episode much better", returns, "group"),
        ("all returns equal: no signal", [50.0] * 6, "group"),
        ('every return x 10, scale="group": the same', [10 * r for r in returns], "group"),
        ('x 10, scale="none" (Dr. GRPO): R_i - mean, x 10 too', [10 * r for r in returns], "none"),
    ]
    fig, axes = plt.subplots(2, len(cases), figsize=(14, 5.2))
    for col, (title, rets, scale) in enumerate(cases):
        adv = to_adv(*rets, scale=scale, plot=False)  # the widget's function
        ret = torch.tensor(rets)
        top, bottom = axes[0, col], axes[1, col]
        top.bar(range(1, 7), ret.numpy(), color="tab:blue")
        top.axhline(ret.mean().item(), color="k", ls="--", label="group mean (the baseline)")
        top.set_title(title, fontsize=10)
        bottom.bar(range(1, 7), adv.numpy(), color=["tab:green" if a > 0 else "tab:red" for a in adv.tolist()])
        bottom.axhline(0, color="k", lw=0.8)
        bottom.set_xlabel("episode i")
        bottom.text(0.02, 0.95, f'scale="{scale}"', transform=bottom.transAxes, va="top", fontsize=9)
        if col == 1:
            bottom.set_ylim(-1, 1)  # all zero: give the empty panel the scale of its neighbours
            bottom.text(0.5, 0.25, "every $A_i$ = 0 (not NaN)", transform=bottom.transAxes, ha="center")
    axes[0, 0].set_ylabel("return $R_i$")
    axes[1, 0].set_ylabel("advantage $A_i$")
    axes[0, 0].legend(fontsize=8, loc="upper left")
    fig.suptitle("How one group's returns become GRPO advantages (the widget of notebook 07, four settings)", y=0.99)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    out = ROOT / "figures"
    clip_figure(out / "05_clip_eps.png")
    group_figure(out / "07_group_advantages.png")
    print("wrote figures/05_clip_eps.png and figures/07_group_advantages.png")


if __name__ == "__main__":
    main()
