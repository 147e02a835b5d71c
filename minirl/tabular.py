"""Small finite MDPs solved exactly: V, Q, A, the discounted visitation, J(theta) and its gradient.

Everything is a float64 torch tensor and every quantity is computed in closed form (a linear solve), so the
identities of the policy-gradient derivation can be asserted to machine precision.
Introduced in ``notebooks/02_policy_gradient_theorem.ipynb``.

Shapes
    S   states
    A   actions
    H   horizon of a finite-horizon episode
    N   trajectories

    P (S, A, S)  transition probabilities P(s'|s,a)      pi (S, A)  policy pi(a|s), rows sum to 1
    R (S, A)     expected reward r(s,a)                  theta (S, A)  softmax logits, pi = softmax(theta)
    mu0 (S,)     start distribution                      V, d (S,);  Q, A (S, A)
"""

from dataclasses import dataclass

import numpy as np
import torch

from minirl._validate import as_tensor, in_range

_ATOL = 1e-6  # tolerance for "sums to 1", loose enough for float32 input


@dataclass(frozen=True)
class MDP:
    """A finite discounted MDP; ``terminal`` marks absorbing, zero-reward states (notebook 02)."""

    P: torch.Tensor  # (S, A, S)
    R: torch.Tensor  # (S, A)
    mu0: torch.Tensor  # (S,)
    gamma: float
    terminal: torch.Tensor | None = None  # (S,) bool

    def __post_init__(self):
        P = as_tensor("P", self.P, ndims=(3,)).double()
        R = as_tensor("R", self.R, ndims=(2,)).double()
        mu0 = as_tensor("mu0", self.mu0, ndims=(1,)).double()
        S, A = R.shape
        if P.shape != (S, A, S) or mu0.shape != (S,):
            raise ValueError(f"P must be (S, A, S) and mu0 (S,) for R of shape (S, A) = {(S, A)}, "
                             f"got P {tuple(P.shape)} and mu0 {tuple(mu0.shape)}")
        if (P < 0).any() or not torch.allclose(P.sum(-1), torch.ones(S, A, dtype=P.dtype), atol=_ATOL):
            raise ValueError("P must be non-negative and each row P[s, a, :] must sum to 1")
        if (mu0 < 0).any() or abs(mu0.sum().item() - 1) > _ATOL:
            raise ValueError(f"mu0 must be non-negative and sum to 1, got sum {mu0.sum().item():.6g}")
        gamma = in_range("gamma", self.gamma, 0.0, 1.0)
        if gamma == 1.0:
            raise ValueError("gamma must be in [0, 1): with gamma = 1 the linear solve for V is singular")
        terminal = self.terminal
        if terminal is not None:
            terminal = as_tensor("terminal", terminal, ndims=(1,), dtype="bool")
            if terminal.shape != (S,):
                raise ValueError(f"terminal must have shape (S,) = {(S,)}, got {tuple(terminal.shape)}")
            t = terminal.nonzero().flatten()
            if not (P[t, :, t] == 1).all() or (R[t] != 0).any():
                raise ValueError("terminal states must be absorbing (P[s, a, s] = 1) with zero reward R")
        for name, value in (("P", P), ("R", R), ("mu0", mu0), ("gamma", gamma), ("terminal", terminal)):
            object.__setattr__(self, name, value)

    @property
    def n_states(self) -> int:
        return self.R.shape[0]

    @property
    def n_actions(self) -> int:
        return self.R.shape[1]


# --- example MDPs ---

def chain(n: int = 5, gamma: float = 0.9, slip: float = 0.1) -> MDP:
    """A chain of n states, actions left (0) and right (1) that slip the other way with prob. ``slip``.

    Start in state 0; reward 1 for each arrival in the rightmost state n - 1 (notebook 02).
    """
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    slip = in_range("slip", slip, 0.0, 1.0)
    P = torch.zeros(n, 2, n, dtype=torch.float64)
    for s in range(n):
        left, right = max(s - 1, 0), min(s + 1, n - 1)
        P[s, 0, left] += 1 - slip
        P[s, 0, right] += slip
        P[s, 1, right] += 1 - slip
        P[s, 1, left] += slip
    mu0 = torch.zeros(n, dtype=torch.float64)
    mu0[0] = 1.0
    return MDP(P=P, R=P[:, :, n - 1].clone(), mu0=mu0, gamma=gamma)


GRID_MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))  # up, right, down, left; state s = row * cols + col


def gridworld(rows: int = 3, cols: int = 4, gamma: float = 0.95, slip: float = 0.2) -> MDP:
    """A grid: start bottom-left, goal top-right (+1 on arrival), a pit below it (-1), both terminal.

    A move goes where asked with prob. 1 - slip and to either side with slip / 2; bumping a wall stays put
    (notebook 02).
    """
    if not (isinstance(rows, int) and isinstance(cols, int) and rows >= 2 and cols >= 2):
        raise ValueError(f"rows and cols must be integers >= 2, got {rows!r} and {cols!r}")
    slip = in_range("slip", slip, 0.0, 1.0)
    S = rows * cols
    goal, pit = cols - 1, 2 * cols - 1
    terminal = torch.zeros(S, dtype=torch.bool)
    terminal[[goal, pit]] = True
    P = torch.zeros(S, 4, S, dtype=torch.float64)
    for s in range(S):
        if terminal[s]:
            P[s, :, s] = 1.0
            continue
        r, c = divmod(s, cols)
        for a in range(4):
            for move, p in ((a, 1 - slip), ((a + 1) % 4, slip / 2), ((a + 3) % 4, slip / 2)):
                dr, dc = GRID_MOVES[move]
                r2, c2 = min(max(r + dr, 0), rows - 1), min(max(c + dc, 0), cols - 1)
                P[s, a, r2 * cols + c2] += p
    arrival = torch.zeros(S, dtype=torch.float64)
    arrival[goal], arrival[pit] = 1.0, -1.0
    R = P @ arrival  # (S, A) expected reward of arriving
    R[terminal] = 0.0
    mu0 = torch.zeros(S, dtype=torch.float64)
    mu0[(rows - 1) * cols] = 1.0
    return MDP(P=P, R=R, mu0=mu0, gamma=gamma, terminal=terminal)


def bandit(rewards: torch.Tensor, gamma: float = 0.9) -> MDP:
    """One state that loops to itself: J(theta) = sum_a pi(a) r(a) / (1 - gamma), a case to check by hand."""
    rewards = as_tensor("rewards", rewards, ndims=(1,)).double()
    A = rewards.shape[0]
    one = torch.ones(1, dtype=torch.float64)
    return MDP(P=torch.ones(1, A, 1, dtype=torch.float64), R=rewards[None], mu0=one, gamma=gamma)


# --- policies ---

def _check_theta(mdp: MDP, theta: torch.Tensor) -> torch.Tensor:
    theta = as_tensor("theta", theta, ndims=(2,))
    if theta.shape != mdp.R.shape:
        raise ValueError(f"theta must have shape (S, A) = {tuple(mdp.R.shape)}, got {tuple(theta.shape)}")
    return theta


def _check_horizon(horizon: int) -> int:
    if not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
    return horizon


def _check_policy(mdp: MDP, pi: torch.Tensor) -> torch.Tensor:
    pi = as_tensor("pi", pi, ndims=(2,))
    if pi.shape != mdp.R.shape:
        raise ValueError(f"pi must have shape (S, A) = {tuple(mdp.R.shape)}, got {tuple(pi.shape)}")
    if (pi < 0).any() or not torch.allclose(pi.sum(-1), torch.ones_like(pi[:, 0]), atol=_ATOL):
        raise ValueError("pi must be non-negative with rows pi[s, :] summing to 1; use softmax_policy(theta)")
    return pi.double()


def softmax_policy(theta: torch.Tensor) -> torch.Tensor:
    """pi(a|s) = exp theta(s,a) / sum_b exp theta(s,b), the tabular softmax policy (notebook 02)."""
    return torch.softmax(as_tensor("theta", theta, ndims=(2,)), dim=-1)  # (S, A)


def softmax_jacobian(theta: torch.Tensor) -> torch.Tensor:
    """d pi(a|s) / d theta(s,b) = pi(a|s) (1[a=b] - pi(b|s)), (S, A, A); zero off row s (notebook 02)."""
    pi = softmax_policy(theta)
    return torch.diag_embed(pi) - pi[:, :, None] * pi[:, None, :]  # (S, A, A)


def score_function(theta: torch.Tensor) -> torch.Tensor:
    """d log pi(a|s) / d theta(s,b) = 1[a=b] - pi(b|s), (S, A, A): the log-derivative trick (notebook 02)."""
    pi = softmax_policy(theta)
    return torch.eye(pi.shape[1], dtype=pi.dtype) - pi[:, None, :]  # (S, A, A)


def greedy_policy(Q: torch.Tensor) -> torch.Tensor:
    """The deterministic policy pi(a|s) = 1[a = argmax_b Q(s,b)], one-hot rows (notebook 02)."""
    Q = as_tensor("Q", Q, ndims=(2,))
    return torch.nn.functional.one_hot(Q.argmax(-1), Q.shape[1]).to(Q.dtype)  # (S, A)


# --- exact evaluation of a policy ---

def transition_matrix(mdp: MDP, pi: torch.Tensor) -> torch.Tensor:
    """P_pi(s, s') = sum_a pi(a|s) P(s'|s,a) (notebook 02)."""
    return torch.einsum("sa,sax->sx", _check_policy(mdp, pi), mdp.P)  # (S, S)


def reward_vector(mdp: MDP, pi: torch.Tensor) -> torch.Tensor:
    """r_pi(s) = sum_a pi(a|s) r(s,a) (notebook 02)."""
    return (_check_policy(mdp, pi) * mdp.R).sum(-1)  # (S,)


def _resolvent(mdp: MDP, pi: torch.Tensor) -> torch.Tensor:
    """I - gamma P_pi, the matrix whose inverse sums gamma^t P_pi^t over all t."""
    return torch.eye(mdp.n_states, dtype=torch.float64) - mdp.gamma * transition_matrix(mdp, pi)


def state_values(mdp: MDP, pi: torch.Tensor) -> torch.Tensor:
    """V = (I - gamma P_pi)^{-1} r_pi: the Bellman equation V = r_pi + gamma P_pi V, solved (notebook 02)."""
    return torch.linalg.solve(_resolvent(mdp, pi), reward_vector(mdp, pi))  # (S,)


def action_values(mdp: MDP, pi: torch.Tensor) -> torch.Tensor:
    """Q(s,a) = r(s,a) + gamma sum_s' P(s'|s,a) V(s') (notebook 02)."""
    return mdp.R + mdp.gamma * mdp.P @ state_values(mdp, pi)  # (S, A)


def advantages(mdp: MDP, pi: torch.Tensor) -> torch.Tensor:
    """A(s,a) = Q(s,a) - V(s) (notebook 02)."""
    return action_values(mdp, pi) - state_values(mdp, pi)[:, None]  # (S, A)


def visitation(mdp: MDP, pi: torch.Tensor) -> torch.Tensor:
    """d(s) = sum_t gamma^t P(s_t = s) = [mu0^T (I - gamma P_pi)^{-1}](s), unnormalised (notebook 02).

    d sums to 1 / (1 - gamma); (1 - gamma) d is the discounted state distribution.
    """
    return torch.linalg.solve(_resolvent(mdp, pi).T, mdp.mu0)  # (S,)


# --- the objective and its gradient ---

def objective(mdp: MDP, theta: torch.Tensor) -> torch.Tensor:
    """J(theta) = sum_s mu0(s) V^{pi_theta}(s), differentiable in theta (notebook 02)."""
    return mdp.mu0 @ state_values(mdp, softmax_policy(_check_theta(mdp, theta)))


def policy_gradient(mdp: MDP, theta: torch.Tensor) -> torch.Tensor:
    """grad_theta J(theta) by autograd through the linear solve, shape (S, A) (notebook 02)."""
    theta = _check_theta(mdp, theta).detach().double().requires_grad_(True)
    (grad,) = torch.autograd.grad(objective(mdp, theta), theta)
    return grad  # (S, A)


def policy_gradient_theorem(mdp: MDP, theta: torch.Tensor) -> torch.Tensor:
    """grad J = sum_s d(s) sum_a Q(s,a) grad pi(a|s): the PG theorem, d unnormalised (notebook 02)."""
    theta = _check_theta(mdp, theta).detach().double()
    pi = softmax_policy(theta)
    # grad pi(a|s) is non-zero only in row s of theta, so the sum over s leaves one row per state
    return torch.einsum("s,sa,sab->sb", visitation(mdp, pi), action_values(mdp, pi), softmax_jacobian(theta))


def finite_horizon_objective(mdp: MDP, theta: torch.Tensor, horizon: int) -> torch.Tensor:
    """J_H(theta) = sum_{t<H} gamma^t mu0^T P_pi^t r_pi: expected H-step return (notebook 02)."""
    pi = softmax_policy(_check_theta(mdp, theta))
    P_pi, r_pi = transition_matrix(mdp, pi), reward_vector(mdp, pi)
    p_t, total = mdp.mu0, torch.zeros((), dtype=torch.float64)
    for t in range(_check_horizon(horizon)):
        total = total + mdp.gamma**t * (p_t @ r_pi)
        p_t = p_t @ P_pi  # P(s_{t+1} = .)
    return total


# --- optimal control ---

def value_iteration(mdp: MDP, tol: float = 1e-10, max_iters: int = 100_000) -> tuple[torch.Tensor, ...]:
    """(Q*, V*) by the Bellman optimality backup Q <- r + gamma P max_a Q, to within tol (notebook 02)."""
    Q = torch.zeros_like(mdp.R)
    for _ in range(max_iters):
        Q_new = mdp.R + mdp.gamma * mdp.P @ Q.max(-1).values  # (S, A)
        if (Q_new - Q).abs().max() < tol:
            return Q_new, Q_new.max(-1).values
        Q = Q_new
    raise RuntimeError(f"value_iteration did not reach tol={tol} in max_iters={max_iters}; raise max_iters")


@dataclass(frozen=True)
class QLearningResult:
    """What ``q_learning`` returns: Q (S, A); visits (S, A), the updates each pair received; snapshots (K, S, A),
    the table after every ``snapshot_every`` steps, at snapshot_steps (K,)."""

    Q: torch.Tensor
    visits: torch.Tensor
    snapshots: torch.Tensor
    snapshot_steps: torch.Tensor


def _greedy_value(q_next) -> float:
    """max_b Q(s', b): the bootstrap that makes Q-learning learn Q* whatever the behaviour policy."""
    return q_next.max()


def q_learning(
    mdp: MDP,
    steps: int = 100_000,
    *,
    epsilon: float = 0.2,
    lr_power: float = 0.7,
    horizon: int = 50,
    exploring_starts: bool = True,
    seed: int = 0,
    snapshot_every: int = 0,
) -> QLearningResult:
    """Tabular Q-learning (Watkins 1989) on transitions sampled from ``mdp`` (notebook 01).

        Q(s,a) <- Q(s,a) + alpha_n [r(s,a) + gamma max_b Q(s',b) - Q(s,a)],    s' ~ P(.|s,a)

    The learner never reads P: it only sees sampled next states, as an agent in an environment would. It acts
    epsilon-greedily on its current Q (``epsilon=1``: uniformly at random), but its target takes the max, so it learns
    Q*, the value of the greedy policy, not of the policy it follows (off-policy), as long as every pair keeps being
    tried. The step size of a pair's n-th update is alpha_n = n^(-lr_power), with lr_power in (0.5, 1]: the
    polynomial rates of Even-Dar and Mansour 2003 (alpha_n = 1/n converges very slowly when gamma is close to 1).

    An episode ends in a terminal state (whose Q stays 0) or is cut after ``horizon`` steps (a cut is not part of
    the MDP, so the target still bootstraps). Episodes start in a uniformly random non-terminal state when
    ``exploring_starts``, else from mu0. The reward of (s, a) is the MDP's expected reward r(s, a), all that Q*
    depends on. Runs a plain Python loop (a few microseconds per step): keep S and A small.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    epsilon = in_range("epsilon", epsilon, 0.0, 1.0)
    if not 0.5 < lr_power <= 1.0:
        raise ValueError(f"lr_power must be in (0.5, 1] for the step sizes to converge, got {lr_power!r}")
    horizon = _check_horizon(horizon)
    if not isinstance(snapshot_every, int) or snapshot_every < 0:
        raise ValueError(f"snapshot_every must be an integer >= 0 (0: no snapshots), got {snapshot_every!r}")

    S, A = mdp.n_states, mdp.n_actions
    cum_P = mdp.P.numpy().cumsum(-1)  # (S, A, S): sample s' by inverting the CDF
    R, gamma = mdp.R.numpy(), mdp.gamma
    terminal = np.zeros(S, dtype=bool) if mdp.terminal is None else mdp.terminal.numpy()
    starts = np.flatnonzero(~terminal)
    cum_mu0 = mdp.mu0.numpy().cumsum()
    rng = np.random.default_rng(seed)  # the loop runs on numpy scalars: torch costs ~10x more per tiny op
    u = rng.random((steps, 3))  # exploration coin, random action, next state; drawn at once for speed

    def start() -> int:
        if exploring_starts:
            return int(starts[rng.integers(len(starts))])
        return min(int(np.searchsorted(cum_mu0, rng.random(), side="right")), S - 1)

    Q, visits = np.zeros((S, A)), np.zeros((S, A), dtype=np.int64)
    snapshots, snapshot_steps = [], []
    s, t = start(), 0
    for k in range(steps):
        a = int(u[k, 1] * A) if u[k, 0] < epsilon else int(Q[s].argmax())
        s2 = min(int(np.searchsorted(cum_P[s, a], u[k, 2], side="right")), S - 1)
        target = R[s, a] + (0.0 if terminal[s2] else gamma * _greedy_value(Q[s2]))
        visits[s, a] += 1
        Q[s, a] += visits[s, a] ** -lr_power * (target - Q[s, a])  # TD error times alpha_n
        s, t = s2, t + 1
        if terminal[s] or t == horizon:
            s, t = start(), 0
        if snapshot_every and (k + 1) % snapshot_every == 0:
            snapshots.append(Q.copy())
            snapshot_steps.append(k + 1)
    return QLearningResult(
        Q=torch.from_numpy(Q),  # (S, A)
        visits=torch.from_numpy(visits),
        snapshots=torch.from_numpy(np.array(snapshots).reshape(-1, S, A)),  # (K, S, A)
        snapshot_steps=torch.tensor(snapshot_steps, dtype=torch.long),  # (K,)
    )


# --- exact expectations over trajectories ---

@dataclass(frozen=True)
class Trajectories:
    """Every H-step trajectory of non-zero probability: obs, act (N, H) long; rew (N, H); prob (N,)."""

    obs: torch.Tensor
    act: torch.Tensor
    rew: torch.Tensor
    prob: torch.Tensor


def enumerate_trajectories(mdp: MDP, pi: torch.Tensor, horizon: int) -> Trajectories:
    """All trajectories s_0 a_0 ... a_{H-1}, P = mu0(s_0) prod_t pi(a_t|s_t) P(s_{t+1}|s_t,a_t) (notebook 02).

    Expectations over them are exact; their number grows like (A S)^H, so keep H small.
    """
    pi = _check_policy(mdp, pi)
    horizon = _check_horizon(horizon)
    obs = mdp.mu0.nonzero()  # (N, 1)
    prob = mdp.mu0[obs[:, 0]]  # (N,)
    act = torch.zeros(len(obs), 0, dtype=torch.long)
    for t in range(horizon):
        s = obs[:, -1]
        if t == horizon - 1:  # the last action, no next state
            n, a = (prob[:, None] * pi[s]).nonzero(as_tuple=True)
            prob = prob[n] * pi[s[n], a]
            obs, act = obs[n], torch.cat([act[n], a[:, None]], 1)
        else:
            n, a, s2 = (prob[:, None, None] * pi[s][:, :, None] * mdp.P[s]).nonzero(as_tuple=True)
            prob = prob[n] * pi[s[n], a] * mdp.P[s[n], a, s2]
            obs, act = torch.cat([obs[n], s2[:, None]], 1), torch.cat([act[n], a[:, None]], 1)
    return Trajectories(obs=obs, act=act, rew=mdp.R[obs, act], prob=prob)


def score_sums(theta: torch.Tensor, obs: torch.Tensor, act: torch.Tensor, weight: torch.Tensor):
    """sum_t weight_t grad log pi(a_t|s_t) per trajectory, (N, S, A): the REINFORCE estimate (notebook 02).

    obs, act (N, H) long; weight (N, H), e.g. the return G_0 at every step, or the reward-to-go.
    """
    theta = as_tensor("theta", theta, ndims=(2,))
    weight = as_tensor("weight", weight, ndims=(2,))
    if not (obs.shape == act.shape == weight.shape):
        raise ValueError(f"obs, act and weight must share shape (N, H), got {tuple(obs.shape)}, "
                         f"{tuple(act.shape)} and {tuple(weight.shape)}")
    S = theta.shape[0]
    rows = torch.nn.functional.one_hot(obs, S).to(weight.dtype) * weight[..., None]  # (N, H, S)
    return torch.einsum("nts,ntb->nsb", rows, score_function(theta)[obs, act])  # (N, S, A)
