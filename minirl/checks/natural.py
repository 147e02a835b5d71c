"""Checks of TRPO's machinery: conjugate gradient and the Fisher-vector product (``minirl.natural``).

Shapes
    P   parameters (the length of every vector), B states, D observation features, A actions
"""

import torch

from minirl import natural
from minirl.checks.core import Case, generator, run


def _spd(eigenvalues: list[float], seed: int) -> torch.Tensor:
    """A symmetric positive-definite matrix (P, P) with the given eigenvalues and random eigenvectors."""
    P = len(eigenvalues)
    Q, _ = torch.linalg.qr(torch.randn(P, P, generator=generator(seed), dtype=torch.float64))  # (P, P) orthogonal
    return Q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ Q.T


class _Products:
    """v -> A v: the solver sees A only through products; the reference reads ``A`` itself."""

    def __init__(self, A: torch.Tensor):
        self.A = A

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        return self.A @ v


def _solve(Avp: _Products, b, iters, tol):
    """x = A^{-1} b by a direct solve when CG may take P steps (it is exact then); else the package's first steps."""
    if iters >= Avp.A.shape[0]:
        return torch.linalg.solve(Avp.A, b)
    return natural.conjugate_gradient(Avp, b, iters, tol)


def _with_products(f, A, b, iters, tol):
    return f(_Products(A), b, iters, tol)


def check_conjugate_gradient(fn) -> None:
    """Check ``fn(Avp, b, iters=10, tol=1e-10)`` (the signature of ``minirl.natural.conjugate_gradient``) against a
    direct solve ``torch.linalg.solve(A, b)`` on symmetric positive-definite systems with P <= iters, and against the
    package's conjugate gradient when it may take fewer steps than P (``notebooks/04_trpo.ipynb``)."""
    gen = generator(4)
    b = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0], dtype=torch.float64)  # (P,)
    steps = ("start from x = 0, r = p = b; each step: alpha = r.r / p.(A p), x += alpha p, r -= alpha A p, then "
             "p = r_new + (r_new.r_new / r.r) p. Get A p by calling Avp(p): A itself is never formed")
    exact = ("CG solves a P x P system exactly in P steps. If you are close but not equal, check that beta uses the "
             "NEW residual, r_new.r_new / r_old.r_old, and that p is updated after r")
    cases = [
        Case("A = identity: x = b", dict(A=torch.eye(5, dtype=torch.float64), b=b, iters=10, tol=1e-10), steps),
        Case("diagonal A", dict(A=torch.diag(torch.tensor([1.0, 2.0, 4.0, 0.5, 3.0], dtype=torch.float64)), b=b,
                                iters=10, tol=1e-10), steps),
        Case("a random SPD system, iters = P", dict(A=_spd([3.0, 2.0, 1.0, 0.5, 0.2], 1), b=b, iters=5, tol=1e-10),
             exact),
        Case("ill-conditioned: eigenvalues from 0.01 to 100", dict(A=_spd([100.0, 10.0, 1.0, 0.1, 0.01], 2), b=b,
                                                                   iters=10, tol=1e-12), exact),
        Case("b = 0: x = 0, without dividing by zero", dict(A=_spd([3.0, 2.0, 1.0, 0.5, 0.2], 1),
                                                            b=torch.zeros(5, dtype=torch.float64), iters=10,
                                                            tol=1e-10),
             "stop as soon as r.r <= tol, before computing alpha: with b = 0, r.r is 0 and alpha would be 0 / 0"),
        Case("iters = 2 < P: only two steps", dict(A=_spd([3.0, 2.0, 1.0, 0.5, 0.2], 1), b=b, iters=2, tol=1e-10),
             "take at most `iters` steps, each one call of Avp; stop earlier only when r.r <= tol"),
        Case("tol = 1.0 stops early", dict(A=_spd([3.0, 2.0, 1.0, 0.5, 0.2], 1), b=b, iters=4, tol=1.0),
             "stop when the squared residual r.r falls to tol or below (tol is compared with r.r, not |r|)"),
    ]
    for i, P in enumerate((8, 12)):
        eigenvalues = (torch.rand(P, generator=gen) * 5 + 0.1).tolist()
        cases.append(Case(f"random SPD system {i + 1}, P = {P}", dict(A=_spd(eigenvalues, 10 + i),
                                                                      b=torch.randn(P, generator=gen,
                                                                                    dtype=torch.float64),
                                                                      iters=P, tol=1e-12), exact))
    run("check_conjugate_gradient", fn, _solve, cases, call=_with_products)


class _Policy:
    """A small policy at theta = theta_old, rebuilt for every call so each gets a fresh graph of the mean KL."""

    def __init__(self, kind: str, n_params: int, seed: int, states: int = 6, features: int = 3, actions: int = 4):
        self.kind, self.n_params, self.seed = kind, n_params, seed
        self.shape = (states, features, actions)

    def build(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(mean KL(pi_old || pi_theta) over the states, with its graph to the parameters; the parameters)."""
        gen = generator(self.seed)
        B, D, A = self.shape
        obs = torch.randn(B, D, generator=gen, dtype=torch.float64)  # (B, D)
        W = torch.randn(D, A, generator=gen, dtype=torch.float64).requires_grad_(True)  # (D, A)
        b = torch.randn(A, generator=gen, dtype=torch.float64).requires_grad_(True)  # (A,)
        params = [W, b][: self.n_params]
        out = obs @ W + (b if self.n_params == 2 else 0)  # (B, A) logits, or Gaussian means
        if self.kind == "categorical":
            dist = torch.distributions.Categorical(logits=out)
            old = torch.distributions.Categorical(logits=out.detach())
        else:
            scale = torch.full_like(out, 0.5)
            dist, old = torch.distributions.Normal(out, scale), torch.distributions.Normal(out.detach(), scale)
        return natural.mean_kl(old, dist), params

    def __repr__(self) -> str:
        B, D, A = self.shape
        out = "logits" if self.kind == "categorical" else "means (std 0.5)"
        params = "[W, b]" if self.n_params == 2 else "[W]"
        return (f"{self.kind} policy, {out} = obs @ W{' + b' * (self.n_params == 2)}, obs ({B}, {D}), W ({D}, {A}); "
                f"kl = mean_kl(pi_old, pi_theta) at theta = theta_old, params = {params}")


def _products(f, policy, damping, vs):
    """(F + damping I) v for every row v of ``vs`` (n, P), from one product map built on a fresh KL, as CG uses it."""
    kl, params = policy.build()
    Fvp = f(kl, params, damping)
    return torch.stack([Fvp(v) for v in vs])  # (n, P)


def check_fisher_vector_product(fn) -> None:
    """Check ``fn(kl, params, damping=0.0)``, which returns the map v -> (F + damping I) v, against
    ``minirl.natural.fisher_vector_product`` on small categorical and Gaussian policies (``notebooks/04_trpo.ipynb``):
    F v = grad_theta((grad_theta KL) . v), TRPO Appendix C.1."""
    gen = generator(14)
    double = ("F v = grad_theta((grad_theta KL) . v): take grad KL once with create_graph=True, flatten it into one "
              "(P,) vector, dot it with v, and differentiate that again; return the result flattened to (P,)")
    flatten = ("with several parameter tensors, concatenate their flattened gradients in the order of params "
               "(torch.cat([g.reshape(-1) for g in grads])), both for grad KL and for F v")
    again = ("CG calls Fvp many times: keep the graph of grad KL alive between calls (retain_graph=True in the "
             "second torch.autograd.grad), and compute grad KL once, outside Fvp")

    def vectors(P, n=1):
        return torch.randn(n, P, generator=gen, dtype=torch.float64)  # (n, P): n vectors v

    cases = [
        Case("categorical policy, params = [W], damping 0", dict(policy=_Policy("categorical", 1, 0), damping=0.0,
                                                                 vs=vectors(12)), double),
        Case("params = [W, b]: two tensors", dict(policy=_Policy("categorical", 2, 1), damping=0.0, vs=vectors(16)),
             flatten),
        Case("damping 0.1: (F + 0.1 I) v", dict(policy=_Policy("categorical", 2, 2), damping=0.1, vs=vectors(16)),
             "add damping * v to F v"),
        Case("three products from one Fvp", dict(policy=_Policy("categorical", 2, 3), damping=0.01,
                                                 vs=vectors(16, 3)), again),
        Case("Gaussian policy", dict(policy=_Policy("gaussian", 2, 4), damping=0.0, vs=vectors(16)), double),
    ]
    for i in range(2):
        cases.append(Case(f"random vectors {i + 1}", dict(policy=_Policy("categorical", 2, 20 + i), damping=0.05,
                                                          vs=vectors(16, 2)), f"{double}; {again}"))
    run("check_fisher_vector_product", fn, natural.fisher_vector_product, cases, call=_products,
        outputs=("F v, one row per vector v",))
