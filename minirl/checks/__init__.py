"""Check a student's implementation of the course's equations against the package's reference.

Each ``check_*`` runs a fixed list of cases, simplest first, then edge cases (episode ends, truncation, all-equal
groups, masks, overflow) and random ones. It prints one line, ``check_gae: pass (11 cases)``, or raises
``CheckFailed`` (an AssertionError) at the first case that differs: its name, its inputs, the expected and the
returned value, and a hint. A function that still raises nbgrader's stub ``NotImplementedError`` is reported as not
implemented yet.

In a notebook (each check's docstring names the notebook that introduces the equation)::

    from minirl import checks
    checks.check_gae(my_gae)

From a grading script: ``python -m minirl.checks student.py`` (see ``minirl/checks/__main__.py``).
"""

from minirl.checks.core import CheckFailed
from minirl.checks.lm import check_format_reward, check_token_logprobs, check_token_rewards, check_verified
from minirl.checks.losses import KL_FORMULAS, check_bradley_terry_loss, check_kl, check_ppo_clip_loss
from minirl.checks.natural import check_conjugate_gradient, check_fisher_vector_product
from minirl.checks.returns import check_discounted_returns, check_gae, check_group_advantages, check_td_target
from minirl.checks.tabular import check_policy_gradient_theorem


def check_kl_all(fn) -> None:
    """``check_kl`` for each of k1, k2 and k3: ``fn(logp, ref_logp, kind)`` must handle all three."""
    for kind in KL_FORMULAS:
        check_kl(fn, kind)


# the function a student defines -> its check, in the order of the notebooks
EXERCISES = {
    "td_target": check_td_target,  # 01
    "policy_gradient_theorem": check_policy_gradient_theorem,  # 02
    "discounted_returns": check_discounted_returns,  # 03
    "fisher_vector_product": check_fisher_vector_product,  # 04
    "conjugate_gradient": check_conjugate_gradient,  # 04
    "ppo_clip_loss": check_ppo_clip_loss,  # 05
    "gae": check_gae,  # 06
    "group_advantages": check_group_advantages,  # 07
    "token_logprobs": check_token_logprobs,  # 08
    "bradley_terry_loss": check_bradley_terry_loss,  # 09
    "token_rewards": check_token_rewards,  # 09
    "kl": check_kl_all,  # 10
    "format_reward": check_format_reward,  # 11
    "verified": check_verified,  # 12
}

__all__ = ["EXERCISES", "CheckFailed", *sorted(f.__name__ for f in EXERCISES.values()), "check_kl"]
