"""minirl.tabular against independent computations: Bellman backups, power series, finite differences, by hand."""

import pytest
import torch

import minirl.tabular as tab

MDPS = {
    "chain": lambda: tab.chain(n=5, gamma=0.9, slip=0.1),
    "gridworld": lambda: tab.gridworld(rows=3, cols=4, gamma=0.95, slip=0.2),
    "bandit": lambda: tab.bandit(torch.tensor([1.0, -0.5, 2.0]), gamma=0.8),
}


def random_theta(mdp: tab.MDP, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(mdp.R.shape, generator=gen, dtype=torch.float64)


@pytest.fixture(params=[(name, seed) for name in MDPS for seed in (0, 1, 2)], ids=lambda p: f"{p[0]}-{p[1]}")
def case(request):
    name, seed = request.param
    mdp = MDPS[name]()
    theta = random_theta(mdp, seed)
    return mdp, theta, tab.softmax_policy(theta)


def close(a, b, rtol=1e-8, atol=1e-10):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


# --- values ---

def test_state_values_match_iterative_policy_evaluation(case):
    mdp, _, pi = case
    P_pi, r_pi = tab.transition_matrix(mdp, pi), tab.reward_vector(mdp, pi)
    V = torch.zeros(mdp.n_states, dtype=torch.float64)
    for _ in range(2000):  # gamma^2000 < 1e-40: the backups have converged
        V = r_pi + mdp.gamma * P_pi @ V
    close(tab.state_values(mdp, pi), V)


def test_values_satisfy_bellman_and_action_identities(case):
    mdp, _, pi = case
    V, Q, A = tab.state_values(mdp, pi), tab.action_values(mdp, pi), tab.advantages(mdp, pi)
    expected_next = torch.einsum("sa,sax,x->s", pi, mdp.P, V)
    close(V, (pi * mdp.R).sum(-1) + mdp.gamma * expected_next)  # Bellman expectation equation
    close(V, (pi * Q).sum(-1))  # V = E_a[Q]
    close((pi * A).sum(-1), torch.zeros_like(V))  # E_a[A] = 0


def test_visitation_is_the_truncated_power_series(case):
    mdp, _, pi = case
    P_pi = tab.transition_matrix(mdp, pi)
    p_t, series = mdp.mu0.clone(), torch.zeros_like(mdp.mu0)
    for t in range(1000):  # gamma^1000 < 1e-45
        series += mdp.gamma**t * p_t
        p_t = p_t @ P_pi
    d = tab.visitation(mdp, pi)
    close(d, series)
    close(d.sum(), torch.tensor(1 / (1 - mdp.gamma), dtype=torch.float64))  # unnormalised


def test_terminal_states_are_never_left_and_worth_zero():
    mdp = tab.gridworld()
    pi = tab.softmax_policy(random_theta(mdp, 0))
    assert mdp.terminal.sum() == 2
    close(tab.state_values(mdp, pi)[mdp.terminal], torch.zeros(2, dtype=torch.float64))
    close(tab.transition_matrix(mdp, pi)[mdp.terminal][:, mdp.terminal], torch.eye(2, dtype=torch.float64))


# --- the objective and its gradient ---

def test_bandit_objective_by_hand():
    # one state looping to itself: J = sum_t gamma^t E_pi[r] = sum_a pi(a) r(a) / (1 - gamma)
    r, gamma = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64), 0.8
    mdp, theta = tab.bandit(r, gamma=gamma), torch.tensor([[0.3, -1.0, 0.5]], dtype=torch.float64)
    pi = torch.exp(theta) / torch.exp(theta).sum()
    close(tab.objective(mdp, theta), (pi * r).sum() / (1 - gamma))
    # d J / d theta_b = pi(b) (r(b) - sum_a pi(a) r(a)) / (1 - gamma), the softmax derivative by hand
    close(tab.policy_gradient(mdp, theta), pi * (r - (pi * r).sum()) / (1 - gamma))
    close(tab.visitation(mdp, pi[0][None]), torch.tensor([1 / (1 - gamma)], dtype=torch.float64))


def test_autograd_gradient_matches_central_differences(case):
    mdp, theta, _ = case
    eps, fd = 1e-6, torch.zeros_like(theta)
    for idx in torch.cartesian_prod(*(torch.arange(n) for n in theta.shape)):
        step = torch.zeros_like(theta)
        step[tuple(idx)] = eps
        fd[tuple(idx)] = (tab.objective(mdp, theta + step) - tab.objective(mdp, theta - step)) / (2 * eps)
    close(tab.policy_gradient(mdp, theta), fd, rtol=1e-6, atol=1e-8)


def test_policy_gradient_theorem_with_unnormalised_visitation(case):
    mdp, theta, _ = case
    close(tab.policy_gradient_theorem(mdp, theta), tab.policy_gradient(mdp, theta))


def test_policy_gradient_theorem_by_autograd_jacobian(case):
    # grad pi from autograd instead of the closed-form softmax Jacobian
    mdp, theta, pi = case
    jac = torch.autograd.functional.jacobian(tab.softmax_policy, theta)  # (S, A, S, A)
    expected = torch.einsum("s,sa,sakb->kb", tab.visitation(mdp, pi), tab.action_values(mdp, pi), jac)
    close(expected, tab.policy_gradient(mdp, theta))


def test_score_function_matches_autograd_of_log_softmax(case):
    _, theta, _ = case
    jac = torch.autograd.functional.jacobian(lambda t: torch.log_softmax(t, -1), theta)  # (S, A, S, A)
    rows = torch.arange(theta.shape[0])
    close(tab.score_function(theta), jac[rows, :, rows, :])
    close(tab.softmax_jacobian(theta), tab.softmax_policy(theta)[..., None] * tab.score_function(theta))


# --- optimal control ---

@pytest.mark.parametrize("name", MDPS)
def test_value_iteration_satisfies_bellman_optimality(name):
    mdp = MDPS[name]()
    Q, V = tab.value_iteration(mdp)
    close(Q, mdp.R + mdp.gamma * mdp.P @ Q.max(-1).values, atol=1e-8)
    greedy = tab.greedy_policy(Q)
    close(tab.state_values(mdp, greedy), V, atol=1e-8)
    # no softmax policy beats the optimum
    for seed in range(3):
        assert tab.objective(mdp, random_theta(mdp, seed, scale=3.0)) <= mdp.mu0 @ V + 1e-9


def test_value_iteration_reports_non_convergence():
    with pytest.raises(RuntimeError, match="max_iters"):
        tab.value_iteration(tab.chain(), max_iters=3)


# --- finite horizon, exact expectations over trajectories ---

def test_enumerated_trajectories_give_the_finite_horizon_objective_and_gradient():
    mdp, horizon = tab.chain(n=3, gamma=0.9, slip=0.2), 4
    theta = random_theta(mdp, 0).requires_grad_(True)
    traj = tab.enumerate_trajectories(mdp, tab.softmax_policy(theta), horizon)
    close(traj.prob.sum(), torch.tensor(1.0, dtype=torch.float64))
    disc = mdp.gamma ** torch.arange(horizon, dtype=torch.float64)
    ret = (traj.rew * disc).sum(1)  # (N,) G_0
    J_enum = (traj.prob * ret).sum()
    J_H = tab.finite_horizon_objective(mdp, theta, horizon)
    close(J_enum, J_H)
    (grad,) = torch.autograd.grad(J_H, theta)
    # the score-function estimator's exact expectation is the gradient of J_H
    score = tab.score_sums(theta.detach(), traj.obs, traj.act, ret[:, None].expand(-1, horizon))
    close(torch.einsum("n,nsa->sa", traj.prob.detach(), score), grad)


def test_finite_horizon_objective_tends_to_objective():
    mdp = tab.gridworld()
    theta = random_theta(mdp, 1)
    close(tab.finite_horizon_objective(mdp, theta, 1000), tab.objective(mdp, theta))


# --- bad input fails loudly ---

def _chain_fields():
    mdp = tab.chain(n=3)
    return {"P": mdp.P.clone(), "R": mdp.R.clone(), "mu0": mdp.mu0.clone(), "gamma": 0.9}


@pytest.mark.parametrize(
    "field, value, error, match",
    [
        ("P", lambda f: f["P"] * 0.5, ValueError, "P must"),
        ("P", lambda f: f["P"][:, :, :2], ValueError, "P must be"),
        ("R", lambda f: f["R"].clone().fill_(float("nan")), ValueError, "R contains NaN"),
        ("R", lambda f: f["R"].tolist(), TypeError, "R must be a torch.Tensor"),
        ("mu0", lambda f: torch.full((3,), 0.5, dtype=torch.float64), ValueError, "mu0 must .*sum to 1"),
        ("gamma", lambda f: 1.0, ValueError, "gamma must be in \\[0, 1\\)"),
        ("gamma", lambda f: -0.1, ValueError, "gamma must be"),
        ("terminal", lambda f: torch.tensor([True, False, False]), ValueError, "terminal states must be absorbing"),
        ("terminal", lambda f: torch.tensor([True, False]), ValueError, "terminal must have shape"),
    ],
)
def test_bad_mdp_fields_raise_naming_the_field(field, value, error, match):
    fields = _chain_fields()
    fields[field] = value(fields)
    with pytest.raises(error, match=match):
        tab.MDP(**fields)


def test_bad_theta_and_policy_raise():
    mdp = tab.chain(n=3)
    with pytest.raises(ValueError, match="theta must have shape"):
        tab.objective(mdp, torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="theta contains NaN"):
        tab.policy_gradient(mdp, torch.full((3, 2), float("nan"), dtype=torch.float64))
    with pytest.raises(TypeError, match="theta must be a floating-point"):
        tab.softmax_policy(torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="rows pi\\[s, :\\] summing to 1"):
        tab.state_values(mdp, torch.full((3, 2), 0.4, dtype=torch.float64))
    with pytest.raises(ValueError, match="pi must have shape"):
        tab.visitation(mdp, torch.full((2, 2), 0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="horizon must be"):
        tab.enumerate_trajectories(mdp, torch.full((3, 2), 0.5, dtype=torch.float64), 0)
    with pytest.raises(ValueError, match="slip must be"):
        tab.gridworld(slip=1.5)
