"""minirl: a notebook course in policy-gradient RL, from REINFORCE to GRPO, and its reference implementation.

The math lives in ``returns`` (returns, GAE, group advantages) and ``losses`` (policy-gradient, PPO-clip, value
and entropy losses, KL estimators, loss aggregation) and ``natural`` (Fisher-vector products, conjugate gradient,
line search); ``tabular`` solves small MDPs exactly; ``algos`` holds one
trainer per algorithm on gymnasium tasks; ``lm`` is the language-model half (imported on first use, since it
loads transformers); ``course`` holds the fast/full switch; ``plotting`` the figures.
"""

import importlib

from minirl import course  # isort: skip  (first: it sets how torch threads wait, before torch is imported)
from minirl import algos, losses, natural, plotting, returns, tabular
from minirl.course import budget, fast_mode
from minirl.policies import Policy
from minirl.rollout import evaluate

__all__ = [
    "Policy",
    "algos",
    "budget",
    "course",
    "evaluate",
    "fast_mode",
    "lm",
    "losses",
    "natural",
    "plotting",
    "returns",
    "tabular",
]


def __getattr__(name: str):
    if name == "lm":
        return importlib.import_module("minirl.lm")
    raise AttributeError(f"module 'minirl' has no attribute {name!r}")
__version__ = "0.1.0"
