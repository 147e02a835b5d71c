"""Plumbing shared by the gymnasium trainers: the result they return, the metric history, seeding, progress."""

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from minirl._validate import check_finite, check_finite_parameters
from minirl.history import History
from minirl.policies import Policy

__all__ = [
    "DIVERGED",
    "History",
    "TrainResult",
    "check_gradient",
    "check_update",
    "explained_variance",
    "progress_bar",
    "running_mean",
    "seed_everything",
]

# what usually makes a gymnasium trainer's numbers blow up, for the error that stops it
DIVERGED = (
    "a learning rate too high for this task, rewards too large for the network (scale them, e.g. with "
    "gymnasium.wrappers.TransformReward), or a gradient clip too loose (lower max_grad_norm)"
)


@dataclass
class TrainResult:
    """What every ``train(cfg)`` returns: the trained policy, its metric history, and the config it ran with."""

    policy: Policy
    history: History
    config: object = field(repr=False)

    def save(self, path: str | Path) -> Path:
        """Save the policy with its training config (see ``Policy.save``)."""
        cfg = self.config
        return self.policy.save(path, extra={"algo": type(cfg).__module__.rsplit(".", 1)[-1], "config": asdict(cfg)})


def check_gradient(step: int, grad_norm: torch.Tensor) -> None:
    """Stop before ``optimizer.step()`` when the gradient norm (what ``clip_grad_norm_`` returns) is NaN or inf: a
    non-finite loss makes a non-finite gradient, and stepping would write it into every parameter."""
    check_finite(step, DIVERGED, grad_norm=grad_norm)


def check_update(step: int, policy: Policy, **values: float) -> None:
    """Stop training after an update whose logged ``values`` or whose parameters are NaN or inf, naming the env step
    and ``DIVERGED``. Finite gradients can still overflow a parameter (a huge learning rate); called once per update,
    this costs one pass over the parameters, not one per minibatch."""
    check_finite(step, DIVERGED, **values)
    check_finite_parameters(policy, step, DIVERGED)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch: the same seed gives the same run on CPU."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def progress_bar(total_steps: int, enabled: bool, desc: str) -> tqdm:
    """A tqdm bar over environment steps (works in a terminal and in a notebook)."""
    return tqdm(total=total_steps, disable=not enabled, desc=desc, unit="step", dynamic_ncols=True)


def running_mean(values: list[float], window: int = 20) -> float:
    """Mean of the last ``window`` values (NaN when there are none yet)."""
    return float(np.mean(values[-window:])) if values else float("nan")


def explained_variance(val: torch.Tensor, ret: torch.Tensor) -> float:
    """1 - Var(ret - val) / Var(ret): how much of the returns' spread the critic predicts (1 perfect, 0 none,
    negative worse than a constant); NaN when the returns do not vary."""
    var_ret = ret.var()
    return float(1 - (ret - val).var() / var_ret) if var_ret > 0 else float("nan")
