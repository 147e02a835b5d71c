"""TRPO with GAE on gymnasium tasks, Schulman et al. 2015 (``notebooks/04_trpo.ipynb``).

Each update takes one natural-gradient step of the policy inside a KL trust region, then fits the critic separately:

    g = grad L(theta_old),  s = CG(F, g) ~ F^{-1} g,  beta = sqrt(2 delta / s^T F s)
    theta = theta_old + shrink^k beta s   for the first k with KL(old || new) <= delta and L(theta) > L(theta_old)

With ``line_search=False`` the full step beta s is always taken: the natural policy gradient with a KL-scaled step
(Kakade 2001), which trusts the quadratic model of the KL blindly.

Shapes: T steps per env, N envs, D observation size, P actor parameters; ``b_`` tensors are flattened to (T * N,),
``mb_`` tensors are one minibatch of them. The defaults are the rl-baselines3-zoo CartPole-v1 settings for
sb3-contrib's TRPO (hyperparams/trpo.yml), with sb3-contrib's defaults where the zoo sets nothing.
"""

import time
from dataclasses import dataclass, field

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from minirl import _validate
from minirl._validate import check_finite, finite_checked
from minirl.algos.common import (
    DIVERGED,
    History,
    TrainResult,
    check_gradient,
    check_update,
    explained_variance,
    progress_bar,
    running_mean,
    seed_everything,
)
from minirl.losses import value_loss
from minirl.natural import (
    LineSearchTry,
    backtracking_line_search,
    conjugate_gradient,
    fisher_vector_product,
    mean_kl,
    natural_step_size,
    surrogate,
)
from minirl.policies import Policy, spec_for
from minirl.returns import gae
from minirl.rollout import Collector, make_envs


@dataclass
class TRPOConfig:
    env_id: str = "CartPole-v1"  # any gymnasium task with Discrete or 1-D Box actions
    total_steps: int = 100_000  # environment steps, summed over all envs
    seed: int = 0  # seeds torch, numpy and the envs (env i gets seed + i)
    num_envs: int = 2  # N parallel envs
    n_steps: int = 512  # T steps per env per rollout; one batch holds N * T transitions
    gamma: float = 0.99  # discount gamma; usually 0.9-0.999
    lam: float = 0.98  # GAE lambda, Schulman et al. 2016; usually 0.9-0.99
    delta: float = 0.01  # KL radius of the trust region, TRPO Eq. 12 (target_kl in sb3-contrib); usually 0.001-0.05
    cg_iters: int = 15  # conjugate-gradient iterations per update (products F v); usually 10-25
    cg_damping: float = 1e-3  # lambda in (F + lambda I) v, keeps CG stable; usually 1e-3-0.1
    line_search: bool = True  # backtrack until KL <= delta and L improves; off: the plain natural policy gradient
    backtrack_coef: float = 0.8  # step shrink factor per failed line-search try
    backtrack_iters: int = 10  # line-search tries before keeping the old policy
    value_lr: float = 1e-3  # Adam learning rate of the critic (learning_rate in sb3-contrib)
    value_epochs: int = 20  # passes of the critic over each batch (n_critic_updates in sb3-contrib)
    minibatch_size: int = 512  # transitions per critic gradient step (batch_size in sb3-contrib)
    norm_adv: bool = True  # standardise the advantages over the whole batch
    obs_norm: bool = False  # standardise observations with running statistics saved in the policy
    hidden: tuple[int, ...] = (64, 64)  # hidden sizes of the separate actor and critic MLPs
    log_std_init: float = 0.0  # initial log std of a Gaussian policy
    async_envs: bool = False  # step the envs in subprocesses (AsyncVectorEnv) instead of in turn


def check_config(cfg: TRPOConfig) -> None:
    """Raise on a setting TRPO cannot run with, naming it and what it allows (numbers from NumPy are fine)."""
    _validate.check_config(
        cfg,
        positive=(
            "total_steps",
            "num_envs",
            "n_steps",
            "delta",
            "cg_iters",
            "backtrack_iters",
            "value_lr",
            "value_epochs",
            "minibatch_size",
        ),
        nonneg=("seed", "cg_damping"),
        unit=("gamma", "lam"),
    )
    if not 0 < cfg.backtrack_coef < 1:
        raise ValueError(f"backtrack_coef must be in (0, 1), got {cfg.backtrack_coef!r}")
    if cfg.num_envs * cfg.n_steps < 2:
        raise ValueError("num_envs * n_steps must be >= 2 to standardise the advantages")


def actor_parameters(policy: Policy) -> list[torch.nn.Parameter]:
    """The parameters of pi(a|s): the actor MLP and, for a Gaussian, log std; never the critic's."""
    return [p for name, p in policy.named_parameters() if not name.startswith("critic.")]


@dataclass
class PolicyStep:
    """What one natural-gradient step did, measured on its batch."""

    old_surrogate: float  # L(theta_old) = mean(adv)
    new_surrogate: float  # L(theta_new)
    kl: float  # mean KL(pi_old || pi_new), measured exactly over the batch's states
    beta: float  # sqrt(2 delta / s^T F s), the step length along s
    accepted: bool  # False: the line search found no step and the policy is unchanged
    fraction: float  # share of the full step beta * s that was taken
    step_norm: float  # |theta_new - theta_old|
    entropy: float  # mean entropy of pi_old over the batch
    tries: list[LineSearchTry] = field(default_factory=list)  # the line search's record (empty without one)


def policy_step(
    policy: Policy, b_obs: torch.Tensor, b_act: torch.Tensor, b_adv: torch.Tensor, cfg: TRPOConfig
) -> PolicyStep:
    """One TRPO (or, with ``cfg.line_search=False``, natural policy gradient) update of the actor, in place.

    b_obs (B, D) as the policy saw them (``rollout.Batch.obs``), b_act (B,) or (B, A), b_adv (B,) from the
    current policy, which plays pi_old.
    """
    actor_params = actor_parameters(policy)
    with torch.no_grad():
        old_dist = policy.distribution(b_obs, normalized=True)  # pi_old, a constant from here on
    dist = policy.distribution(b_obs, normalized=True)
    logp = policy.log_prob(dist, b_act)  # (B,)
    # old log-probs recomputed at theta_old (not the rollout's): the ratio is exactly 1 there, also with obs_norm
    old_logp = logp.detach()
    old_surrogate = surrogate(logp, old_logp, b_adv)  # L(theta_old) = mean(adv)
    g = torch.cat([x.reshape(-1) for x in torch.autograd.grad(old_surrogate, actor_params, retain_graph=True)])  # (P,)
    Fvp = fisher_vector_product(mean_kl(old_dist, dist), actor_params, cfg.cg_damping)
    s = conjugate_gradient(Fvp, g, cfg.cg_iters)  # (P,) ~ F^{-1} g, the natural gradient direction
    beta = natural_step_size(s, Fvp(s), cfg.delta)  # (beta s)^T F (beta s) / 2 = delta
    old_params = parameters_to_vector(actor_params).detach()  # (P,)

    @torch.no_grad()
    def measure(params: torch.Tensor) -> tuple[float, float]:
        vector_to_parameters(params, actor_params)
        new_dist = policy.distribution(b_obs, normalized=True)
        new_surrogate = surrogate(policy.log_prob(new_dist, b_act), old_logp, b_adv)
        return new_surrogate.item(), mean_kl(old_dist, new_dist).item()

    if cfg.line_search:
        search = backtracking_line_search(
            measure, old_params, beta * s, old_surrogate.item(), cfg.delta, cfg.backtrack_coef, cfg.backtrack_iters
        )
        new_params, accepted, fraction, tries = search.params, search.accepted, search.fraction, search.tries
    else:  # natural policy gradient: the full step, whatever KL it really reaches
        new_params, accepted, fraction, tries = old_params + beta * s, True, 1.0, []
    new_surrogate, kl = measure(new_params)  # also writes the chosen parameters into the actor
    ent = policy.entropy(old_dist)  # (B,)
    return PolicyStep(
        old_surrogate=old_surrogate.item(),
        new_surrogate=new_surrogate,
        kl=kl,
        beta=beta,
        accepted=accepted,
        fraction=fraction,
        step_norm=float((new_params - old_params).norm()),
        entropy=ent.mean().item(),
        tries=tries,
    )


def train(cfg: TRPOConfig, progress: bool = False) -> TrainResult:
    """Train a TRPO agent; returns ``.policy``, ``.history`` (one row per rollout) and ``.config``."""
    check_config(cfg)
    seed_everything(cfg.seed)
    envs = make_envs(cfg.env_id, cfg.num_envs, cfg.seed, asynchronous=cfg.async_envs)
    spec = spec_for(envs, hidden=tuple(cfg.hidden), obs_norm=cfg.obs_norm, log_std_init=cfg.log_std_init)
    policy = Policy(spec)
    critic_opt = torch.optim.Adam(policy.critic.parameters(), lr=cfg.value_lr, eps=1e-5, fused=True)
    collector = Collector(envs, cfg.seed)
    batch_size = cfg.num_envs * cfg.n_steps
    n_updates = max(1, cfg.total_steps // batch_size)
    history, returns = History(), []
    bar = progress_bar(n_updates * batch_size, progress, f"TRPO {cfg.env_id}")

    for update in range(n_updates):
        # --- rollout ---
        t0 = time.perf_counter()
        step_count = (update + 1) * batch_size  # env steps so far, for the history and for errors
        batch = collector.collect(policy, cfg.n_steps)
        returns += batch.episode_returns

        # --- advantages ---
        adv, ret = gae(batch.rew, batch.val, batch.next_val, batch.terminated, batch.truncated, cfg.gamma, cfg.lam)
        b_obs = batch.obs.reshape(batch_size, -1)  # (T*N, D)
        b_act = batch.act.reshape(batch_size, *batch.act.shape[2:])  # (T*N,) or (T*N, A)
        b_adv, b_ret, b_val = (x.reshape(-1) for x in (adv, ret, batch.val))  # (T*N,)
        if cfg.norm_adv:
            b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)
        t1 = time.perf_counter()

        # --- policy update: one natural-gradient step inside the trust region ---
        step = policy_step(policy, b_obs, b_act, b_adv, cfg)
        t2 = time.perf_counter()

        # --- critic update: several Adam epochs of minibatches on the GAE returns ---
        # The returns are checked for NaN once here, so value_loss skips its own scan on each minibatch of them; a
        # NaN born inside the loop still stops it at check_gradient.
        check_finite(step_count, DIVERGED, returns=b_ret)
        v_losses = []
        with finite_checked():
            for _ in range(cfg.value_epochs):
                for mb in torch.randperm(batch_size).split(cfg.minibatch_size):
                    v_loss = value_loss(policy.value(b_obs[mb], normalized=True), b_ret[mb]).mean()
                    critic_opt.zero_grad()
                    v_loss.backward()
                    grad_norm = torch.nn.utils.get_total_norm([p.grad for p in policy.critic.parameters()])
                    check_gradient(step_count, grad_norm)
                    critic_opt.step()
                    v_losses.append(v_loss.detach())  # 0-d tensors: read once per update, not per minibatch
        t3 = time.perf_counter()
        check_update(step_count, policy, surrogate=step.new_surrogate, kl=step.kl)

        # --- log ---
        history.log(
            step=step_count,
            return_mean=running_mean(returns),
            episodes=len(returns),
            kl=step.kl,
            surrogate_gain=step.new_surrogate - step.old_surrogate,
            step_norm=step.step_norm,
            beta=step.beta,
            accepted=float(step.accepted),
            step_fraction=step.fraction,
            line_search_tries=len(step.tries),
            pg_loss=-step.new_surrogate,
            v_loss=torch.stack(v_losses).mean().item(),
            entropy=step.entropy,
            explained_var=explained_variance(b_val, b_ret),
            rollout_s=t1 - t0,
            policy_s=t2 - t1,
            critic_s=t3 - t2,
            update_s=t3 - t1,
        )
        bar.update(batch_size)
        bar.set_postfix(ret=f"{running_mean(returns):.1f}")
    bar.close()
    envs.close()
    return TrainResult(policy=policy, history=history, config=cfg)
