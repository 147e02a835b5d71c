"""Checks on small MDPs solved exactly (``minirl.tabular``).

Shapes
    S   states, A actions; theta (S, A) the softmax logits of a tabular policy
"""

import torch

from minirl import tabular
from minirl.checks.core import Case, generator, run


def check_policy_gradient_theorem(fn) -> None:
    """Check ``fn(mdp, theta)`` (the signature of ``minirl.tabular.policy_gradient_theorem``), the policy gradient
    theorem grad J = sum_s d(s) sum_a Q(s,a) grad pi(a|s) for a softmax policy, against ``tabular.policy_gradient``:
    autograd through the exact solve of J(theta) (``notebooks/02_policy_gradient_theorem.ipynb``)."""
    gen = generator(2)
    theorem = ("grad J(s, b) = d(s) sum_a Q(s,a) d pi(a|s) / d theta(s,b), with d pi(a|s) / d theta(s,b) = "
               "pi(a|s) (1[a=b] - pi(b|s)): only row s of theta moves pi(.|s)")
    unnormalised = ("d is the discounted visitation, a count: d = mu0^T (I - gamma P_pi)^{-1}, which sums to "
                    "1 / (1 - gamma). The normalised distribution (1 - gamma) d gives a gradient 1 - gamma times too "
                    "short; and mind the transpose: d solves (I - gamma P_pi)^T d = mu0")

    def theta_for(mdp, scale=1.0):
        return scale * torch.randn(mdp.n_states, mdp.n_actions, generator=gen, dtype=torch.float64)  # (S, A)

    bandit = tabular.bandit(torch.tensor([1.0, 0.0, 0.6]), gamma=0.9)
    chain = tabular.chain(n=4, gamma=0.8, slip=0.1)
    grid = tabular.gridworld(rows=3, cols=4, gamma=0.95, slip=0.2)
    cases = [
        Case("a bandit: one state that loops to itself", dict(mdp=bandit, theta=theta_for(bandit)),
             f"{theorem}; {unnormalised}",
             dict(mdp="tabular.bandit(torch.tensor([1.0, 0.0, 0.6]), gamma=0.9)")),
        Case("a chain of 4 states, uniform policy (theta = 0)",
             dict(mdp=chain, theta=torch.zeros(4, 2, dtype=torch.float64)), unnormalised,
             dict(mdp="tabular.chain(n=4, gamma=0.8, slip=0.1)")),
        Case("a chain of 4 states, random theta", dict(mdp=chain, theta=theta_for(chain)), unnormalised,
             dict(mdp="tabular.chain(n=4, gamma=0.8, slip=0.1)")),
        Case("the 3 x 4 gridworld with its two terminal states", dict(mdp=grid, theta=theta_for(grid)),
             f"{unnormalised}; {theorem}", dict(mdp="tabular.gridworld(rows=3, cols=4, gamma=0.95, slip=0.2)")),
        Case("the gridworld, a nearly deterministic policy", dict(mdp=grid, theta=theta_for(grid, 4.0)),
             f"{unnormalised}; {theorem}", dict(mdp="tabular.gridworld(rows=3, cols=4, gamma=0.95, slip=0.2)")),
    ]
    run("check_policy_gradient_theorem", fn, tabular.policy_gradient, cases)
