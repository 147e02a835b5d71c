"""minirl: a notebook course in policy-gradient RL, from REINFORCE to GRPO, and its reference implementation.

The math lives in ``returns`` (returns, GAE, group advantages) and ``losses`` (policy-gradient, PPO-clip, value
and entropy losses, KL estimators, loss aggregation); ``tabular`` solves small MDPs exactly; ``algos`` holds one
trainer per algorithm on gymnasium tasks; ``course`` holds the fast/full switch; ``plotting`` the figures.
"""

from minirl import algos, course, losses, plotting, returns, tabular
from minirl.course import budget, fast_mode
from minirl.policies import Policy
from minirl.rollout import evaluate

__all__ = ["Policy", "algos", "budget", "course", "evaluate", "fast_mode", "losses", "plotting", "returns", "tabular"]
__version__ = "0.1.0"
