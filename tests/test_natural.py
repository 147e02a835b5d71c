"""TRPO's machinery against independent computations: the Fisher matrix built from per-state score Jacobians with
the exact expectation over actions, the full Hessian of the KL, a direct linear solve, a brute-force search over the
trust-region ellipse, and hand-made line-search cases."""

import math

import pytest
import torch
from torch.func import functional_call

from minirl.algos.trpo import actor_parameters
from minirl.natural import (
    backtracking_line_search,
    conjugate_gradient,
    fisher_vector_product,
    mean_kl,
    natural_step_size,
    surrogate,
)
from minirl.policies import Policy, PolicySpec

B, D = 12, 4  # states, observation size


def small_policy(discrete: bool, seed: int = 0) -> Policy:
    """A float64 policy small enough for explicit P x P matrices (P = 139 categorical, 128 Gaussian)."""
    torch.manual_seed(seed)
    spec = PolicySpec(obs_dim=D, act_dim=3 if discrete else 2, discrete=discrete, hidden=(8, 8), log_std_init=-0.3)
    policy = Policy(spec).double()
    with torch.no_grad():  # a policy far from uniform, so that the Fisher is not nearly isotropic
        policy.actor[-1].weight.mul_(100.0)
    return policy


def states(seed: int = 1) -> torch.Tensor:
    return torch.randn(B, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def explicit_fisher(policy: Policy, obs: torch.Tensor) -> torch.Tensor:
    """F = 1/B sum_s J_s^T M_s J_s, (P, P), from per-state Jacobians J_s of the distribution's parameters.

    Categorical: the parameters are log pi(.|s) (A,), M_s = diag(pi(.|s)), i.e. sum_a pi(a|s) grad log pi grad log pi^T,
    the exact expectation over actions. Gaussian: the parameters are (mu(s), log sigma) (2A,), whose Fisher is
    diag(1 / sigma^2, 2) per action dimension (the exact expectation over a ~ N(mu, sigma^2)).
    """
    params = actor_parameters(policy)
    fisher = 0
    for s in range(obs.shape[0]):
        dist = policy.distribution(obs[s : s + 1])
        if policy.spec.discrete:
            outputs = torch.log_softmax(dist.logits[0], -1)  # (A,)
            metric = torch.diag(outputs.exp())
        else:
            outputs = torch.cat([dist.loc[0], policy.log_std])  # (2A,)
            metric = torch.diag(torch.cat([dist.scale[0] ** -2, torch.full_like(policy.log_std, 2.0)]))
        jac = torch.stack(
            [flat(torch.autograd.grad(o, params, retain_graph=True, allow_unused=True)) for o in outputs]
        )  # (A or 2A, P): the score Jacobian of state s
        fisher = fisher + jac.T @ metric.detach() @ jac
    return (fisher / obs.shape[0]).detach()


def kl_of_flat(policy: Policy, obs: torch.Tensor):
    """theta (P,) -> mean KL(pi_old || pi_theta), built with functional_call so that torch.func can take its Hessian."""
    names = [name for name, _ in policy.named_parameters() if not name.startswith("critic.")]
    shapes = [p.shape for p in actor_parameters(policy)]
    with torch.no_grad():
        old_dist = policy.distribution(obs)

    def kl(theta: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(theta, [math.prod(s) for s in shapes])
        params = {n: c.reshape(s) for n, c, s in zip(names, chunks, shapes)}
        out = functional_call(policy.actor, {k[len("actor.") :]: v for k, v in params.items() if k != "log_std"}, obs)
        if policy.spec.discrete:
            dist = torch.distributions.Categorical(logits=out)
        else:
            dist = torch.distributions.Normal(out, params["log_std"].exp().expand_as(out))
        return mean_kl(old_dist, dist)

    return kl


@pytest.mark.parametrize("discrete", [True, False], ids=["categorical", "gaussian"])
@pytest.mark.parametrize("damping", [0.0, 1e-2])
def test_fvp_equals_explicit_fisher_and_hessian_of_kl_times_v(discrete, damping):
    policy, obs = small_policy(discrete), states()
    params = actor_parameters(policy)
    theta = flat(p.detach() for p in params)
    P = theta.numel()
    Fvp = fisher_vector_product(mean_kl(policy.distribution(obs), policy.distribution(obs)), params, damping)

    F = explicit_fisher(policy, obs) + damping * torch.eye(P, dtype=torch.float64)
    H = torch.autograd.functional.hessian(kl_of_flat(policy, obs), theta) + damping * torch.eye(P, dtype=torch.float64)
    assert torch.allclose(F, H, rtol=1e-8, atol=1e-12)  # at theta_old the Hessian of the KL is the Fisher
    for seed in range(3):
        v = torch.randn(P, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        Fv = Fvp(v)
        assert torch.allclose(Fv, F @ v, rtol=1e-8, atol=1e-12)
        assert torch.allclose(Fv, H @ v, rtol=1e-8, atol=1e-12)
    assert Fvp(v).norm() > 1e-3  # not trivially zero


def test_fvp_is_not_the_empirical_fisher():
    """The Fisher takes the exact expectation over actions; the outer product of sampled scores differs."""
    policy, obs = small_policy(True), states()
    params = actor_parameters(policy)
    dist = policy.distribution(obs)
    act = dist.sample()
    scores = torch.stack([flat(torch.autograd.grad(lp, params, retain_graph=True)) for lp in dist.log_prob(act)])
    empirical = scores.T @ scores / B
    Fvp = fisher_vector_product(mean_kl(dist, policy.distribution(obs)), params)
    v = torch.randn(scores.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(Fvp(v), empirical @ v, rtol=1e-2)


def test_fvp_names_bad_input():
    policy, obs = small_policy(True), states()
    params = actor_parameters(policy)
    with pytest.raises(ValueError, match="kl must be a scalar"):
        fisher_vector_product(torch.zeros((), dtype=torch.float64), params)
    Fvp = fisher_vector_product(mean_kl(policy.distribution(obs), policy.distribution(obs)), params)
    with pytest.raises(ValueError, match="v must have P = 139"):
        Fvp(torch.zeros(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="damping"):
        fisher_vector_product(mean_kl(policy.distribution(obs), policy.distribution(obs)), params, damping=-1.0)


def random_spd(n: int, seed: int, cond: float = 100.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=g))
    eig = torch.logspace(0, math.log10(cond), n, dtype=torch.float64)
    return q @ torch.diag(eig) @ q.T


@pytest.mark.parametrize("n,seed", [(2, 0), (5, 1), (20, 2), (60, 3)])
def test_cg_matches_direct_solve_on_random_spd(n, seed):
    A = random_spd(n, seed)
    b = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(100 + seed))
    calls = []

    def Avp(v):
        calls.append(1)
        return A @ v

    x = conjugate_gradient(Avp, b, iters=2 * n, tol=1e-24)
    assert torch.allclose(x, torch.linalg.solve(A, b), rtol=1e-8, atol=1e-10)
    assert len(calls) <= 2 * n  # the matrix is used only through products, at most one per iteration


def test_cg_error_in_the_a_norm_never_grows_and_tol_stops_early():
    A, n = random_spd(30, 7, cond=1e3), 30
    b = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    exact = torch.linalg.solve(A, b)
    errors = []
    conjugate_gradient(lambda v: A @ v, b, iters=n, tol=0.0,
                       callback=lambda i, x, r: errors.append(((x - exact) @ A @ (x - exact)).item()))
    assert len(errors) == n
    assert all(e2 <= e1 * (1 + 1e-9) for e1, e2 in zip(errors, errors[1:]))  # CG minimises the A-norm error
    assert conjugate_gradient(lambda v: A @ v, torch.zeros(n, dtype=torch.float64)).abs().max() == 0  # b = 0: x = 0
    with pytest.raises(ValueError, match="not positive definite"):
        conjugate_gradient(lambda v: -v, b)
    with pytest.raises(ValueError, match="iters"):
        conjugate_gradient(lambda v: v, b, iters=0)


@pytest.mark.parametrize("discrete", [True, False], ids=["categorical", "gaussian"])
def test_cg_with_fvp_matches_solve_on_the_fisher(discrete):
    policy, obs = small_policy(discrete), states()
    params = actor_parameters(policy)
    damping = 0.1
    Fvp = fisher_vector_product(mean_kl(policy.distribution(obs), policy.distribution(obs)), params, damping)
    F = explicit_fisher(policy, obs) + damping * torch.eye(sum(p.numel() for p in params), dtype=torch.float64)
    g = torch.randn(F.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    x = conjugate_gradient(Fvp, g, iters=200, tol=1e-24)
    assert torch.allclose(x, torch.linalg.solve(F, g), rtol=1e-6, atol=1e-8)


def test_natural_step_solves_the_trust_region_problem_by_brute_force():
    """max g^T d s.t. d^T F d / 2 <= delta, two parameters: the best of 200k points on the ellipse agrees."""
    F = torch.tensor([[2.0, 0.7], [0.7, 0.5]], dtype=torch.float64)
    g = torch.tensor([1.0, -0.4], dtype=torch.float64)
    delta = 0.02
    s = conjugate_gradient(lambda v: F @ v, g, iters=2, tol=0.0)
    d = natural_step_size(s, F @ s, delta) * s
    assert math.isclose((d @ F @ d / 2).item(), delta, rel_tol=1e-12)  # on the boundary of the trust region
    angle = torch.linspace(0, 2 * math.pi, 200_001, dtype=torch.float64)
    circle = torch.stack([angle.cos(), angle.sin()])  # (2, M)
    boundary = torch.linalg.cholesky(F).T.inverse() @ circle * math.sqrt(2 * delta)  # d^T F d / 2 = delta
    best = boundary[:, (g @ boundary).argmax()]
    assert torch.allclose(d, best, atol=1e-4)
    assert (g @ d).item() >= (g @ boundary).max().item() - 1e-12
    assert not torch.allclose(d / d.norm(), g / g.norm(), atol=0.05)  # the natural direction is not the gradient's
    with pytest.raises(ValueError, match="delta"):
        natural_step_size(s, F @ s, 0.0)


def test_surrogate_value_and_gradient_at_the_old_policy():
    logp = torch.randn(8, dtype=torch.float64, requires_grad=True)
    adv = torch.randn(8, dtype=torch.float64)
    L = surrogate(logp, logp.detach(), adv)
    (grad,) = torch.autograd.grad(L, logp)
    assert torch.isclose(L, adv.mean())
    assert torch.allclose(grad, adv / 8)  # the policy gradient: mean_t A_t grad log pi
    with pytest.raises(ValueError, match="shapes must match"):
        surrogate(logp, logp[:4], adv)


def quadratic_problem():
    """theta in R^2: KL = |theta|^2 and L = theta_0 - 4 theta_0^2, so L improves only for 0 < theta_0 < 1/4."""
    return lambda theta: ((theta[0] - 4 * theta[0] ** 2).item(), (theta @ theta).item())


def test_line_search_shrinks_until_kl_and_surrogate_pass():
    evaluate = quadratic_problem()
    old = torch.zeros(2, dtype=torch.float64)
    result = backtracking_line_search(evaluate, old, torch.tensor([1.0, 0.0], dtype=torch.float64), 0.0, delta=0.1)
    fractions = [t.fraction for t in result.tries]
    # fractions 0.8^k for k = 0..5 give KL = 0.8^(2k) > 0.1; k = 6 (0.262) has KL 0.069 but L = -0.013 (no gain);
    # k = 7 (0.210) has KL 0.044 and L = 0.034 > 0: accepted
    assert result.accepted and len(result.tries) == 8
    assert math.isclose(result.fraction, 0.8**7) and fractions == [0.8**k for k in range(8)]
    assert [t.accepted for t in result.tries] == [False] * 7 + [True]
    assert any(t.kl <= 0.1 and t.surrogate <= 0.0 for t in result.tries)  # a KL-safe step that did not improve L
    assert all(t.kl <= 0.1 and t.surrogate > 0 for t in result.tries if t.accepted)
    assert torch.allclose(result.params, torch.tensor([0.8**7, 0.0], dtype=torch.float64))


def test_line_search_keeps_the_old_parameters_when_nothing_passes():
    evaluate = quadratic_problem()
    old = torch.zeros(2, dtype=torch.float64)
    result = backtracking_line_search(evaluate, old, torch.tensor([-1.0, 0.0], dtype=torch.float64), 0.0, 0.1,
                                      shrink=0.5, max_iters=6)
    assert not result.accepted and result.fraction == 0.0 and len(result.tries) == 6
    assert torch.equal(result.params, old)
    with pytest.raises(ValueError, match="shrink"):
        backtracking_line_search(evaluate, old, old, 0.0, 0.1, shrink=1.0)
