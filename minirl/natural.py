"""TRPO's machinery: the surrogate, Fisher-vector products, conjugate gradient, the natural step size and a
backtracking line search (Schulman et al. 2015, "Trust Region Policy Optimization", Sec. 6 and Appendix C;
``notebooks/04_trpo.ipynb``).

Shapes
    B   states (and sampled actions) in a batch
    P   policy parameters, flattened into one vector in the order of ``params``

One TRPO step solves, to second order around the old parameters theta_old,

    max_d  g^T d   subject to   d^T F d / 2 <= delta                                       (TRPO Eq. 17)

with g the gradient of the surrogate L and F the Fisher matrix: the Hessian at theta_old of the mean
KL(pi_old || pi_theta). The solution is d = beta s with s = F^{-1} g (the natural gradient, Kakade 2001) and
beta = sqrt(2 delta / s^T F s). F has P^2 entries and is never formed: conjugate gradient needs only products F v,
and double backprop gives each one for about the cost of two backward passes. Because the quadratic model of the KL
is only a model, a backtracking line search then measures the real KL and the real surrogate before accepting.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from minirl._validate import as_tensor, in_range


def surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """The importance-sampled surrogate L(theta) = mean_t ratio_t A_t, ratio_t = pi_theta(a_t|s_t) / pi_old(a_t|s_t)
    (TRPO Eq. 14, estimated from samples of the old policy), a scalar to be maximised.

    logp, old_logp, adv: (B,). At theta = theta_old it equals mean(A) and its gradient is the policy gradient
    mean_t A_t grad log pi(a_t|s_t).
    """
    logp = as_tensor("logp", logp, ndims=(1,))
    old_logp = as_tensor("old_logp", old_logp, ndims=(1,))
    adv = as_tensor("adv", adv, ndims=(1,))
    if not logp.shape == old_logp.shape == adv.shape:
        raise ValueError(f"shapes must match: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, "
                         f"adv {tuple(adv.shape)}")
    return (torch.exp(logp - old_logp.detach()) * adv.detach()).mean()


def mean_kl(old_dist: torch.distributions.Distribution, dist: torch.distributions.Distribution) -> torch.Tensor:
    """Mean over the B states of the exact KL(pi_old(.|s) || pi_theta(.|s)), a scalar (TRPO Eq. 12's constraint).

    Categorical or (diagonal) Normal; a Normal's KL is summed over action dimensions. ``old_dist`` is treated as a
    constant (its parameters are detached), so the gradients flow only through ``dist``.
    """
    if isinstance(old_dist, torch.distributions.Categorical) and isinstance(dist, torch.distributions.Categorical):
        old = torch.distributions.Categorical(logits=old_dist.logits.detach(), validate_args=False)
        return torch.distributions.kl_divergence(old, dist).mean()
    if isinstance(old_dist, torch.distributions.Normal) and isinstance(dist, torch.distributions.Normal):
        old = torch.distributions.Normal(old_dist.loc.detach(), old_dist.scale.detach(), validate_args=False)
        kl = torch.distributions.kl_divergence(old, dist)  # (B, A)
        return kl.sum(-1).mean() if kl.dim() > 1 else kl.mean()
    raise TypeError(f"mean_kl needs two Categorical or two Normal distributions, got {type(old_dist).__name__} "
                    f"and {type(dist).__name__}")


def fisher_vector_product(
    kl: torch.Tensor, params: Sequence[torch.Tensor], damping: float = 0.0
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The map v -> (F + damping I) v, with F the Hessian of ``kl`` in ``params``, by double backprop.

        F v = grad_theta ( (grad_theta KL)^T v )                 (TRPO Appendix C.1)

    Args:
        kl: scalar mean KL(pi_old || pi_theta) over a batch of states, built by ``mean_kl`` with the graph to
            ``params``, evaluated at theta = theta_old. There its value and gradient are 0 and its Hessian is the
            Fisher matrix F = mean_s sum_a pi(a|s) grad log pi(a|s) grad log pi(a|s)^T (the exact expectation over
            actions, not the empirical Fisher of the sampled ones).
        params: the P policy parameters (tensors that require grad), in a fixed order.
        damping: lambda >= 0 added on the diagonal; it keeps F + lambda I positive definite when F is singular
            (it is for a softmax: shifting every logit changes nothing) and CG stable.

    Returns:
        Fvp: a function from v (P,) to (F + damping I) v (P,). The gradient of the KL is computed once, here;
        each call costs one more backward pass through its graph.
    """
    kl = as_tensor("kl", kl)
    if kl.dim() != 0 or not kl.requires_grad:
        raise ValueError("kl must be a scalar with a graph to params; build it with mean_kl(old_dist, dist)")
    params = list(params)
    if not params:
        raise ValueError("params must hold at least one tensor that requires grad")
    damping = in_range("damping", damping, 0.0, float("inf"))
    grads = torch.autograd.grad(kl, params, create_graph=True)
    grad_kl = torch.cat([g.reshape(-1) for g in grads])  # (P,)
    n_params = grad_kl.numel()

    def Fvp(v: torch.Tensor) -> torch.Tensor:
        v = as_tensor("v", v, ndims=(1,))
        if v.numel() != n_params:
            raise ValueError(f"v must have P = {n_params} entries (one per policy parameter), got {v.numel()}")
        hv = torch.autograd.grad(grad_kl @ v.detach(), params, retain_graph=True)  # F v, one tensor per parameter
        return torch.cat([h.reshape(-1) for h in hv]).detach() + damping * v  # (P,)

    return Fvp


def conjugate_gradient(
    Avp: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    iters: int = 10,
    tol: float = 1e-10,
    callback: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Approximately solve A x = b for a symmetric positive-definite A seen only through products A v
    (Hestenes and Stiefel 1952; Nocedal and Wright, Algorithm 5.2). Starts from x = 0.

        r = b - A x,  p = r;  repeat:  alpha = r^T r / p^T A p,  x += alpha p,  r -= alpha A p,
                                      p = r + (r_new^T r_new / r^T r) p

    In exact arithmetic it solves a P x P system in at most P steps; TRPO stops after ``iters`` (usually 10-20),
    which already captures the directions of largest curvature.

    Args:
        Avp: v (P,) -> A v (P,), e.g. ``fisher_vector_product(...)``.
        b: (P,) right-hand side (TRPO: the surrogate's gradient g).
        iters: at most this many products A p.
        tol: stop once the squared residual r^T r = |b - A x|^2 falls below it (1e-10 as in Spinning Up and
            sb3-contrib).
        callback: called as ``callback(i, x, r)`` after iteration i (0-based), e.g. to trace the residual.

    Returns:
        x: (P,) the approximate solution (TRPO: the search direction s ~ F^{-1} g).
    """
    b = as_tensor("b", b, ndims=(1,)).detach()
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    tol = in_range("tol", tol, 0.0, float("inf"))
    x = torch.zeros_like(b)
    r = b.clone()  # residual b - A x, with x = 0
    p = r.clone()  # search direction, A-conjugate to the previous ones
    rr = r @ r
    for i in range(iters):
        if rr <= tol:
            break
        Ap = Avp(p)  # (P,)
        pAp = p @ Ap
        if pAp <= 0:
            raise ValueError(f"A is not positive definite along the CG direction (p^T A p = {pAp.item():.3g}); "
                             "add damping to the Fisher-vector product")
        alpha = rr / pAp
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = r @ r
        if callback is not None:
            callback(i, x, r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def natural_step_size(s: torch.Tensor, Fs: torch.Tensor, delta: float) -> float:
    """beta = sqrt(2 delta / s^T F s): the scale that puts s on the edge of the quadratic trust region,
    (beta s)^T F (beta s) / 2 = delta (TRPO Appendix C).

    s: (P,) the search direction; Fs: (P,) F s (from the same ``Fvp``); delta: the KL radius > 0.
    """
    s = as_tensor("s", s, ndims=(1,))
    Fs = as_tensor("Fs", Fs, ndims=(1,))
    if s.shape != Fs.shape:
        raise ValueError(f"shapes must match: s {tuple(s.shape)}, Fs {tuple(Fs.shape)}")
    delta = in_range("delta", delta, 0.0, float("inf"))
    if delta == 0:
        raise ValueError("delta must be > 0: a KL radius of 0 allows no step")
    sFs = float(s @ Fs)
    if sFs <= 0:
        raise ValueError(f"s^T F s = {sFs:.3g} must be > 0; is s zero, or F not positive definite (add damping)?")
    return (2 * delta / sFs) ** 0.5


@dataclass(frozen=True)
class LineSearchTry:
    """One candidate theta_old + fraction * full_step, as measured."""

    fraction: float  # shrink^k, the share of the full step tried
    surrogate: float  # L(theta) measured at the candidate
    kl: float  # mean KL(pi_old || pi_theta) measured at the candidate
    accepted: bool


@dataclass(frozen=True)
class LineSearchResult:
    params: torch.Tensor  # (P,) the accepted parameters, or the old ones if no try passed
    accepted: bool
    tries: list[LineSearchTry] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        """The share of the full step taken (0.0 when nothing passed)."""
        return self.tries[-1].fraction if self.accepted else 0.0


def backtracking_line_search(
    evaluate: Callable[[torch.Tensor], tuple[float, float]],
    old_params: torch.Tensor,
    full_step: torch.Tensor,
    old_surrogate: float,
    delta: float,
    shrink: float = 0.8,
    max_iters: int = 10,
) -> LineSearchResult:
    """Try theta = theta_old + shrink^k * full_step for k = 0, 1, ...; accept the first candidate whose measured
    KL(pi_old || pi_theta) <= delta and whose surrogate L(theta) > L(theta_old) (TRPO Sec. 6, Appendix C).

    The quadratic model behind the full step can be wrong both ways: the real KL can exceed delta, and the linear
    model of L can promise an improvement that is not there. The search checks both on the batch itself.

    Args:
        evaluate: theta (P,) -> (L(theta), mean KL(pi_old || pi_theta)) on the batch, as floats.
        old_params: (P,) theta_old.
        full_step: (P,) beta * s from ``natural_step_size`` and ``conjugate_gradient``.
        old_surrogate: L(theta_old).
        delta: the KL radius.
        shrink: factor in (0, 1) applied to the step after each failed try (0.8 in sb3-contrib and Spinning Up).
        max_iters: number of tries.

    Returns:
        A LineSearchResult: the accepted parameters (``old_params`` if no try passed), whether one did, and every
        try with its numbers.
    """
    old_params = as_tensor("old_params", old_params, ndims=(1,)).detach()
    full_step = as_tensor("full_step", full_step, ndims=(1,)).detach()
    if old_params.shape != full_step.shape:
        raise ValueError(f"shapes must match: old_params {tuple(old_params.shape)}, full_step "
                         f"{tuple(full_step.shape)}")
    shrink = in_range("shrink", shrink, 0.0, 1.0)
    if not 0 < shrink < 1:
        raise ValueError(f"shrink must be in (0, 1) so that the step gets shorter, got {shrink!r}")
    if not isinstance(max_iters, int) or max_iters < 1:
        raise ValueError(f"max_iters must be an int >= 1, got {max_iters!r}")
    tries = []
    for k in range(max_iters):
        fraction = shrink**k
        params = old_params + fraction * full_step
        value, kl = evaluate(params)
        accepted = kl <= delta and value > old_surrogate
        tries.append(LineSearchTry(fraction=fraction, surrogate=float(value), kl=float(kl), accepted=accepted))
        if accepted:
            return LineSearchResult(params=params, accepted=True, tries=tries)
    return LineSearchResult(params=old_params.clone(), accepted=False, tries=tries)
