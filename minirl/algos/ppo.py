"""PPO with GAE on gymnasium tasks, Schulman et al. 2017 (``notebooks/05_ppo.ipynb``).

Shapes: T steps per env, N envs, D observation size; ``b_`` tensors are flattened to (T * N,), ``mb_`` tensors are
one minibatch of them.

The details of "The 37 Implementation Details of Proximal Policy Optimization" (Huang et al., ICLR blog track 2022)
that apply are named in comments as (detail k). The defaults are the rl-baselines3-zoo CartPole-v1 settings.
"""

import time
from dataclasses import dataclass

import torch

from minirl import _validate, backprop
from minirl._validate import check_finite, finite_checked
from minirl.algos.common import (
    DIVERGED,
    History,
    TrainResult,
    adam_step,
    check_gradient,
    check_update,
    clip_grad_norm,
    explained_variance,
    one_buffer,
    progress_bar,
    running_mean,
    seed_everything,
)
from minirl.losses import (
    clip_fraction,
    entropy,
    entropy_grad,
    kl,
    ppo_clip_loss,
    ppo_clip_loss_and_grad,
    value_loss,
    value_loss_and_grad,
)
from minirl.policies import Policy, PolicySpec, spec_for
from minirl.returns import gae
from minirl.rollout import Collector, make_envs


@dataclass
class PPOConfig:
    env_id: str = "CartPole-v1"  # any gymnasium task with Discrete or 1-D Box actions
    total_steps: int = 100_000  # environment steps, summed over all envs
    seed: int = 0  # seeds torch, numpy and the envs (env i gets seed + i)
    num_envs: int = 8  # N parallel envs (detail 1: vectorized architecture)
    n_steps: int = 32  # T steps per env per rollout; one batch holds N * T transitions
    gamma: float = 0.98  # discount gamma; usually 0.9-0.999
    lam: float = 0.8  # GAE lambda, Schulman et al. 2016; usually 0.8-0.99 (detail 5)
    lr: float = 1e-3  # Adam learning rate; usually 1e-4-3e-3
    anneal_lr: bool = True  # decay the learning rate linearly to 0 (detail 4)
    epochs: int = 20  # K passes over each batch; usually 3-30
    minibatch_size: int = 256  # transitions per gradient step (detail 6: mini-batch updates)
    clip_low: float = 0.2  # epsilon of the clipped surrogate, Schulman et al. 2017 Eq. 7; usually 0.1-0.3 (detail 8)
    clip_high: float | None = None  # upper clip 1 + clip_high; None means symmetric (clip_high = clip_low)
    anneal_clip: bool = True  # decay the clip range linearly to 0, as the zoo settings do
    clip_vf: float | None = None  # clip the value update to +-clip_vf around the old value (detail 9); None: off
    ent_coef: float = 0.0  # entropy bonus coefficient c2 (detail 10); usually 0-0.01
    vf_coef: float = 0.5  # value loss coefficient c1 (detail 10)
    max_grad_norm: float = 0.5  # global gradient-norm clip (detail 11)
    norm_adv: bool = True  # normalise advantages per minibatch (detail 7)
    target_kl: float | None = None  # stop the epochs early once the approximate KL exceeds this; None: never
    obs_norm: bool = False  # standardise and clip observations by running statistics (continuous details 6-7)
    hidden: tuple[int, ...] = (64, 64)  # hidden sizes of the separate actor and critic MLPs (detail 13)
    log_std_init: float = 0.0  # initial log std of a Gaussian policy
    async_envs: bool = False  # step the envs in subprocesses (AsyncVectorEnv) instead of in turn
    hand_grad: bool = False  # the update's gradient by the chain rule written out (discrete actions), not autograd


def mean_entropy(policy: Policy, dist: torch.distributions.Distribution) -> torch.Tensor:
    """Mean entropy of pi(.|s) over a minibatch: ``losses.entropy`` of the logits for discrete actions."""
    return (entropy(dist.logits) if policy.spec.discrete else policy.entropy(dist)).mean()


def minibatches(n: int, size: int) -> list[torch.Tensor] | list[slice]:
    """One epoch's minibatches of a batch of ``n`` transitions: a fresh permutation cut into pieces of ``size``
    (detail 6). When one minibatch holds the whole batch (the zoo's CartPole settings: 8 x 32 = 256), a permutation
    would only reorder the sum inside the loss, so the batch is taken as it is: ``[slice(None)]``, no gathers."""
    if size >= n:
        return [slice(None)]
    return list(torch.randperm(n).split(size))


def check_config(cfg: PPOConfig) -> None:
    """Raise on a setting PPO cannot run with, naming the field and what it allows (numbers from NumPy are fine)."""
    _validate.check_config(
        cfg,
        positive=("total_steps", "num_envs", "n_steps", "lr", "epochs", "minibatch_size", "max_grad_norm"),
        nonneg=("seed", "ent_coef", "vf_coef"),
        unit=("gamma", "lam"),
    )
    # optional fields: None turns them off, a number must be > 0 (a clip range of 0 freezes the policy)
    for name in ("clip_low", "clip_high", "clip_vf", "target_kl"):
        value = getattr(cfg, name)
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be > 0 (or None where allowed), got {value!r}")
    if not cfg.clip_low < 1:
        raise ValueError(f"clip_low must be in (0, 1), the ratio is clipped below at 1 - clip_low; got {cfg.clip_low}")


def check_hand_grad(cfg: PPOConfig, spec: PolicySpec) -> None:
    """Raise if ``cfg.hand_grad`` asks for the written-out gradient of a policy it does not cover (continuous
    actions: ``hand_backward`` differentiates a categorical policy)."""
    if cfg.hand_grad and not spec.discrete:
        raise ValueError(
            f"hand_grad=True computes the gradient of a categorical policy, but {cfg.env_id} has continuous actions; "
            "use hand_grad=False (autograd) for it"
        )


def minibatch_advantages(adv: torch.Tensor, cfg: PPOConfig) -> torch.Tensor:
    """A minibatch's advantages (mb,), standardised when ``cfg.norm_adv`` (detail 7)."""
    if cfg.norm_adv and len(adv) > 1:
        return (adv - adv.mean()) / (adv.std() + 1e-8)
    return adv


def autograd_backward(
    policy: Policy, mb_b: dict[str, torch.Tensor], cfg: PPOConfig, clip: tuple[float, float | None]
) -> tuple[torch.Tensor, ...]:
    """The PPO loss on one minibatch ``mb_b`` (the keys of ``update``'s batch, the advantages already standardised
    by ``minibatch_advantages``) and its gradient by ``backward()``, added into the parameters' ``.grad``. Returns
    the clipped-surrogate loss and the value loss (0-d), log pi(a|s) (mb,) and, for logging the entropy, the
    logits (mb, A) of a discrete policy or H(pi(.|s)) (mb,)."""
    # obs are stored as the policy saw them (normalised at collection): the ratio starts at 1
    dist = policy.distribution(mb_b["obs"], normalized=True)
    logp = policy.log_prob(dist, mb_b["act"])  # (mb,)
    pg_loss = ppo_clip_loss(logp, mb_b["logp"], mb_b["adv"], *clip).mean()
    val = policy.value(mb_b["obs"], normalized=True)  # (mb,)
    v_loss = value_loss(val, mb_b["ret"], mb_b["val"], cfg.clip_vf).mean()
    loss = pg_loss + cfg.vf_coef * v_loss
    if cfg.ent_coef > 0:  # the entropy bonus; at 0 it is only logged, and backward skips it
        loss = loss - cfg.ent_coef * mean_entropy(policy, dist)
    loss.backward()
    with torch.no_grad():
        ent = dist.logits.detach() if policy.spec.discrete else policy.entropy(dist)
    return pg_loss.detach(), v_loss.detach(), logp.detach(), ent


@torch.inference_mode()  # no_grad, and no autograd bookkeeping at all: 5-7% faster here
def hand_backward(
    policy: Policy, mb_b: dict[str, torch.Tensor], cfg: PPOConfig, clip: tuple[float, float | None]
) -> tuple[torch.Tensor, ...]:
    """``autograd_backward`` with the chain rule written out (``cfg.hand_grad``; discrete actions): the same loss,
    the same gradients within rounding (``tests/test_algos.py`` checks them), in about 0.6x the time of autograd's
    whole minibatch step on 64-64 MLPs, where autograd's bookkeeping costs more than the arithmetic (and
    ``minirl.backprop`` computes tanh and the first layer's weight gradient with faster kernels).

    The loss is L = mean(clip loss) + c1 mean(value loss) - c2 mean(H) over the n transitions, z are the actor's
    logits and logp = log_softmax(z)[a]:

        dL/dlogp = d clip loss / d logp / n                       (mb,)
        dL/dz    = dL/dlogp * (onehot(a) - pi) - c2 / n * dH/dz  (mb, A)
        dL/dV    = c1 / n * d value loss / d V                   (mb,)

    and ``minirl.backprop.backward`` carries dL/dz and dL/dV through the actor's and the critic's layers."""
    actor = backprop.forward(policy.actor, mb_b["obs"])  # [obs, ..., z (mb, A)]
    critic = backprop.forward(policy.critic, mb_b["obs"])  # [obs, ..., V (mb, 1)]
    n, act = len(mb_b["obs"]), mb_b["act"].long().unsqueeze(-1)  # act (mb, 1)
    logpi = torch.log_softmax(actor[-1], dim=-1)  # (mb, A) log pi(.|s)
    logp = logpi.gather(-1, act).squeeze(-1)  # (mb,)
    pg_loss, g_logp = ppo_clip_loss_and_grad(logp, mb_b["logp"], mb_b["adv"], *clip)  # (mb,) each
    val = critic[-1].squeeze(-1)  # (mb,)
    v_loss, g_val = value_loss_and_grad(val, mb_b["ret"], mb_b["val"], cfg.clip_vf)  # (mb,) each

    g_logp = (g_logp / n).unsqueeze(-1)  # (mb, 1) dL/dlogp
    g_z = logpi.exp().mul_(-g_logp).scatter_add_(-1, act, g_logp)  # (mb, A): g_logp * (onehot(a) - pi)
    if cfg.ent_coef > 0:
        g_z -= cfg.ent_coef / n * entropy_grad(actor[-1])
    g_val = cfg.vf_coef / n * g_val  # dL/dV
    backprop.backward(policy.actor, actor, g_z)
    backprop.backward(policy.critic, critic, g_val.unsqueeze(-1))
    return pg_loss.mean(), v_loss.mean(), logp, logpi


def update(
    policy: Policy,
    flat: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    b: dict[str, torch.Tensor],
    cfg: PPOConfig,
    clip: tuple[float, float | None],
    step: int,
) -> dict[str, torch.Tensor]:
    """K epochs of minibatch steps on one batch ``b`` (obs (T*N, D), act, logp, adv, ret, val (T*N,)); ``flat`` holds
    the policy's parameters (``one_buffer``). Returns the logged diagnostics as 0-d tensors."""
    clip_low, clip_high = clip
    batch_size = b["obs"].shape[0]
    # The batch is checked for NaN once here, so the losses skip their own scan on each minibatch of it (about a
    # tenth of an update's time); a NaN born inside the loop still stops it at check_gradient.
    check_finite(step, DIVERGED, advantages=b["adv"], returns=b["ret"], old_logp=b["logp"])
    stats = {"pg_loss": [], "v_loss": [], "grad_norm": []}  # one 0-d tensor per minibatch
    seen_logp, seen_old_logp = [], []  # (mb,) per minibatch: log pi(a|s) before its step, and at collection
    seen_ent = []  # per minibatch, before its step: the logits (mb, A) of a discrete policy, else H(pi(.|s)) (mb,)
    check_hand_grad(cfg, policy.spec)
    backward = hand_backward if cfg.hand_grad else autograd_backward
    with finite_checked():
        whole = None  # the whole batch as one minibatch (see minibatches), its advantages standardised once
        for _ in range(cfg.epochs):
            n_before = len(seen_logp)
            for mb in minibatches(batch_size, cfg.minibatch_size):
                if isinstance(mb, slice):  # the whole batch: the same minibatch in every epoch
                    whole = whole or dict(b, adv=minibatch_advantages(b["adv"], cfg))
                    mb_b = whole
                else:
                    mb_b = {key: value[mb] for key, value in b.items()}
                    mb_b["adv"] = minibatch_advantages(mb_b["adv"], cfg)
                flat.grad.zero_()  # in place: the parameters' gradients are views of it
                pg_loss, v_loss, logp, ent = backward(policy, mb_b, cfg, clip)
                grad_norm = clip_grad_norm([flat], cfg.max_grad_norm)  # the norm before clipping
                check_gradient(step, grad_norm)  # stop before a NaN reaches the parameters
                adam_step(optimizer)  # optimizer.step(), with less per-call overhead

                logged = {"pg_loss": pg_loss, "v_loss": v_loss, "grad_norm": grad_norm}
                for key, value in logged.items():
                    stats[key].append(value)  # read once per update, not per minibatch
                seen_logp.append(logp)
                seen_old_logp.append(mb_b["logp"])
                seen_ent.append(ent)
            if cfg.target_kl is not None:
                epoch_logp, epoch_old = torch.cat(seen_logp[n_before:]), torch.cat(seen_old_logp[n_before:])
                if kl(epoch_old, epoch_logp, "k3").mean() > cfg.target_kl:
                    break  # early stop of the epochs once the policy has moved far enough
        # detail 12: KL(old || new) by k3 on samples of the old policy, the clip fraction and the entropy, over every
        # transition the update stepped on (each minibatch's policy before its step); computed here in one call each
        # instead of once per minibatch, which cost about 5% of an update
        logp, old_logp = torch.cat(seen_logp), torch.cat(seen_old_logp)
        logged = {key: torch.stack(values).mean() for key, values in stats.items()}
        ent = torch.cat(seen_ent)  # (n, A) logits or (n,) entropies
        logged["entropy"] = (entropy(ent) if policy.spec.discrete else ent).mean()
        logged["approx_kl"] = kl(old_logp, logp, "k3").mean()
        logged["clip_frac"] = clip_fraction(logp, old_logp, clip_low, clip_high).mean()
    return logged


def train(cfg: PPOConfig, progress: bool = False) -> TrainResult:
    """Train a PPO agent; returns ``.policy``, ``.history`` (one row per rollout) and ``.config``."""
    check_config(cfg)
    seed_everything(cfg.seed)
    envs = make_envs(cfg.env_id, cfg.num_envs, cfg.seed, asynchronous=cfg.async_envs)
    spec = spec_for(envs, hidden=tuple(cfg.hidden), obs_norm=cfg.obs_norm, log_std_init=cfg.log_std_init)
    try:
        check_hand_grad(cfg, spec)
    except ValueError:
        envs.close()
        raise
    policy = Policy(spec)
    collector = Collector(envs, cfg.seed)
    batch_size = cfg.num_envs * cfg.n_steps
    n_updates = max(1, cfg.total_steps // batch_size)
    history, returns = History(), []
    bar = progress_bar(n_updates * batch_size, progress, f"PPO {cfg.env_id}")

    with one_buffer(policy) as flat:  # the parameters as one tensor, for Adam and the clip (see one_buffer)
        optimizer = torch.optim.Adam([flat], lr=cfg.lr, eps=1e-5, fused=True)  # detail 3: epsilon 1e-5
        for k in range(n_updates):
            frac = 1.0 - k / n_updates
            lr = cfg.lr * frac if cfg.anneal_lr else cfg.lr
            for group in optimizer.param_groups:
                group["lr"] = lr
            clip_low = cfg.clip_low * frac if cfg.anneal_clip else cfg.clip_low
            clip_high = None if cfg.clip_high is None else (cfg.clip_high * frac if cfg.anneal_clip else cfg.clip_high)

            # --- rollout ---
            t0 = time.perf_counter()
            step = (k + 1) * batch_size  # env steps so far, for the history and for errors
            batch = collector.collect(policy, cfg.n_steps)
            returns += batch.episode_returns

            # --- advantages ---
            adv, ret = gae(batch.rew, batch.val, batch.next_val, batch.terminated, batch.truncated, cfg.gamma, cfg.lam)
            b = {
                "obs": batch.obs.reshape(batch_size, -1),  # (T*N, D)
                "act": batch.act.reshape(batch_size, *batch.act.shape[2:]),  # (T*N,) or (T*N, A)
                "logp": batch.logp.reshape(-1),  # (T*N,) each
                "adv": adv.reshape(-1),
                "ret": ret.reshape(-1),
                "val": batch.val.reshape(-1),
            }
            t1 = time.perf_counter()

            # --- update ---
            logged = update(policy, flat, optimizer, b, cfg, (clip_low, clip_high), step)
            t2 = time.perf_counter()
            check_update(step, policy)

            # --- log ---
            history.log(
                step=step,
                return_mean=running_mean(returns),
                episodes=len(returns),
                lr=lr,
                clip=clip_low,
                explained_var=explained_variance(b["val"], b["ret"]),
                rollout_s=t1 - t0,
                update_s=t2 - t1,
                **{key: value.item() for key, value in logged.items()},
            )
            bar.update(batch_size)
            bar.set_postfix(ret=f"{running_mean(returns):.1f}")
    bar.close()
    envs.close()
    return TrainResult(policy=policy, history=history, config=cfg)
