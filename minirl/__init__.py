"""minirl: a notebook course in policy-gradient RL, from REINFORCE to GRPO, and its reference implementation.

The math lives in ``returns`` (returns, GAE, group advantages) and ``losses`` (policy-gradient, PPO-clip, value
and entropy losses, KL estimators, loss aggregation); ``tabular`` solves small MDPs exactly; ``course`` holds the
fast/full switch; ``plotting`` the figures.
"""

from minirl import course, losses, plotting, returns, tabular
from minirl.course import budget, fast_mode

__all__ = ["budget", "course", "fast_mode", "losses", "plotting", "returns", "tabular"]
__version__ = "0.1.0"
