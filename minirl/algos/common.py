"""Plumbing shared by the gymnasium trainers: the result they return, the metric history, seeding, progress."""

import contextlib
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.optim.adam import adam as functional_adam
from tqdm.auto import tqdm

from minirl._validate import check_finite, check_finite_parameters
from minirl.history import History
from minirl.policies import Policy

__all__ = [
    "DIVERGED",
    "History",
    "TrainResult",
    "adam_step",
    "check_gradient",
    "clip_grad_norm",
    "check_update",
    "explained_variance",
    "one_buffer",
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


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients of ``params`` in place so that their global L2 norm is at most ``max_norm``, and return
    the norm before clipping: ``torch.nn.utils.clip_grad_norm_``'s arithmetic (``tests/test_algos.py`` checks them
    equal). Torch's version also sorts the tensors by device and dtype on every call, which for a small network
    costs more than the arithmetic: about a tenth of a PPO minibatch update."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))  # sqrt of the sum of squared norms
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


@contextlib.contextmanager
def one_buffer(module: torch.nn.Module):
    """Inside the block, every parameter of ``module`` is a view of one flat leaf tensor, and its gradient a view of
    that tensor's gradient; yields the flat tensor, for the optimizer and the gradient clip.

    Why: Adam and the norm clip loop over their tensors, and on CPU each tensor costs a few calls whatever its size.
    A 64-64 actor and critic are 12 tensors of 9,000 numbers in all, so the loop costs more than the arithmetic:
    with one tensor, a PPO minibatch update is a tenth faster. The numbers are the same (Adam is elementwise, and
    ``tests/test_algos.py`` checks a run's weights against the plain path). Backward adds into the gradient views in
    place, so clear them with ``flat.grad.zero_()``, never ``optimizer.zero_grad()`` (that would detach them). On
    exit each parameter gets its own memory back, so the module saves and copies as usual.
    """
    params = list(module.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params]).requires_grad_()  # (P,) all parameters, in order
    flat.grad = torch.zeros_like(flat)
    views, grads, start = [], [], 0
    for p in params:
        end = start + p.numel()
        views.append(flat.detach()[start:end].view_as(p))
        grads.append(flat.grad[start:end].view_as(p))
        start = end
    for p, view, grad in zip(params, views, grads):
        p.data, p.grad = view, grad
    try:
        yield flat
    finally:
        for p in params:
            p.data, p.grad = p.data.clone(), None


def adam_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``, by torch's functional ``torch.optim.adam.adam`` when ``optimizer`` is an Adam over one
    tensor (``one_buffer``) that has taken its first step: the same kernel on the same state, the same numbers
    (``tests/test_algos.py`` checks them equal). Anything else (amsgrad, differentiable, a GradScaler's), and the
    first step that makes Adam's state, goes through ``optimizer.step()``. Step hooks registered on the optimizer
    do not run on the functional path.

    Why: ``Optimizer.step`` wraps the arithmetic in bookkeeping (hooks, a profiler range, a loop over groups and
    parameters) that costs about 20-50 us per call on CPU, 3-6% of a PPO minibatch update."""
    groups = optimizer.param_groups
    group, p = groups[0], groups[0]["params"][0]
    functional = type(optimizer) is torch.optim.Adam and len(groups) == 1 and len(group["params"]) == 1
    functional &= not (group["amsgrad"] or group["differentiable"]) and getattr(optimizer, "grad_scale", None) is None
    if not functional or not optimizer.state[p] or p.grad is None:
        optimizer.step()
        return
    state = optimizer.state[p]
    beta1, beta2 = group["betas"]
    with torch.no_grad():  # as in Optimizer.step: the update is not part of any graph
        functional_adam(
            [p],
            [p.grad],
            [state["exp_avg"]],
            [state["exp_avg_sq"]],
            [],
            [state["step"]],
            foreach=group["foreach"],
            fused=group["fused"],
            capturable=group["capturable"],
            differentiable=False,
            decoupled_weight_decay=group["decoupled_weight_decay"],
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
        )


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
