"""Losses and KL estimators: pure functions on tensors, shared by the gymnasium algorithms and the LM trainers.

Shapes
    *   any shape: per-sample losses keep the shape of their inputs (a batch (B,) of steps, or (B, L) tokens)
    B   completions, L tokens per completion, A actions or V vocabulary entries

Per-element functions return a loss to be minimised at every sample; ``aggregate`` reduces a (B, L) token loss to a
scalar in the way each paper prescribes.
"""

import torch

from minirl._validate import as_tensor, in_range, one_of, same_shape

KL_KINDS = ("k1", "k2", "k3")
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def policy_gradient_loss(logp: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """The REINFORCE loss -log pi(a|s) * A, per element (``notebooks/03_reinforce_and_baselines.ipynb``).

    Its gradient is minus the score-function estimate of grad J (Williams 1992); ``adv`` is treated as a constant.
    """
    logp = as_tensor("logp", logp)
    adv = as_tensor("adv", adv)
    same_shape(logp=logp, adv=adv)
    return -logp * adv.detach()


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
) -> torch.Tensor:
    """The clipped surrogate of PPO, Schulman et al. 2017 Eq. 7, negated to be minimised (``notebooks/05_ppo.ipynb``).

        ratio = exp(logp - old_logp)
        loss  = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)

    ``clip_high=None`` clips symmetrically (clip_high = clip_low); DAPO's clip-higher (Yu et al. 2025) sets it larger
    so that unlikely tokens with a positive advantage can still grow.
    """
    logp, old_logp, adv = _ratio_inputs(logp, old_logp, adv)
    clip_low, clip_high = _clip_range(clip_low, clip_high)
    ratio = torch.exp(logp - old_logp.detach())
    adv = adv.detach()
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * adv, clipped * adv)


def ppo_clip_loss_and_grad(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ppo_clip_loss`` per element and its derivative d loss / d logp, by hand (``PPOConfig.hand_grad``).

    With d ratio / d logp = ratio, the unclipped term -ratio * A has the gradient -ratio * A, and the clipped term,
    held at a bound, has none. Inside [1 - clip_low, 1 + clip_high] the two terms are equal and the gradient is the
    unclipped one; outside, the min picks the clipped term exactly when the ratio has gone past the bound in the
    direction the advantage pushes it (A > 0 above the range, A < 0 below it), and the gradient there is 0.
    ``tests/test_losses.py`` checks the loss equal to ``ppo_clip_loss`` and the gradient against autograd, the
    range's bounds included.
    """
    logp, old_logp, adv = _ratio_inputs(logp, old_logp, adv)
    clip_low, clip_high = _clip_range(clip_low, clip_high)
    ratio = torch.exp(logp - old_logp)
    unclipped = torch.where(adv > 0, ratio <= 1.0 + clip_high, ratio >= 1.0 - clip_low)  # the min's unclipped term
    kept = torch.where(unclipped, ratio, torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high))
    loss = -(kept * adv)
    return loss, torch.where(unclipped, loss, 0.0)  # where unclipped, kept = ratio and the gradient -ratio * A = loss


def clip_fraction(
    logp: torch.Tensor, old_logp: torch.Tensor, clip_low: float = 0.2, clip_high: float | None = None
) -> torch.Tensor:
    """1.0 where the ratio has left [1 - clip_low, 1 + clip_high], else 0.0, per element (for logging).

    Aggregate it like the loss (``.mean()``, or ``aggregate(..., "token-mean")``) to get the clip fraction.
    """
    logp, old_logp, _ = _ratio_inputs(logp, old_logp, logp)
    clip_low, clip_high = _clip_range(clip_low, clip_high)
    ratio = torch.exp(logp - old_logp).detach()
    return ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).to(logp.dtype)


def value_loss(
    val: torch.Tensor, ret: torch.Tensor, old_val: torch.Tensor | None = None, clip: float | None = None
) -> torch.Tensor:
    """Squared error 0.5 * (V(s) - R)^2 of the critic, per element (``notebooks/05_ppo.ipynb``).

    With ``old_val`` and ``clip``, the PPO2 value clipping of "The 37 Implementation Details of PPO" (detail 9):
    0.5 * max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2).
    """
    val = as_tensor("val", val)
    ret = as_tensor("ret", ret)
    same_shape(val=val, ret=ret)
    ret = ret.detach()
    unclipped = (val - ret) ** 2
    if clip is None:
        return 0.5 * unclipped
    if old_val is None:
        raise ValueError("value_loss: clip needs old_val, the critic's values when the batch was collected")
    old_val = as_tensor("old_val", old_val).detach()
    same_shape(val=val, old_val=old_val)
    clip = in_range("clip", clip, 0.0, float("inf"))
    return 0.5 * torch.maximum(unclipped, (_clipped_value(val, old_val, clip) - ret) ** 2)


def value_loss_and_grad(
    val: torch.Tensor, ret: torch.Tensor, old_val: torch.Tensor | None = None, clip: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``value_loss`` per element and its derivative d loss / d val, by hand (``PPOConfig.hand_grad``): V - R.

    With ``clip``, the max passes the gradient of its larger term: V - R, or (V_clipped - R) times 1 where V is
    inside old_val +- clip (0 where the clip holds it). On a tie each term gets half, as autograd splits it.
    """
    loss = value_loss(val, ret, old_val, clip)  # checks the inputs
    if clip is None:
        return loss, val - ret
    clipped = _clipped_value(val, old_val, clip)
    unclipped_sq, clipped_sq = (val - ret) ** 2, (clipped - ret) ** 2
    w = torch.where(unclipped_sq > clipped_sq, 1.0, torch.where(unclipped_sq < clipped_sq, 0.0, 0.5))  # max's share
    inside = ((val - old_val).abs() <= clip).to(val.dtype)  # where the clamp passes its gradient
    return loss, w * (val - ret) + (1 - w) * (clipped - ret) * inside


def _clipped_value(val: torch.Tensor, old_val: torch.Tensor, clip: float) -> torch.Tensor:
    """V_old + clip(V - V_old, -clip, clip): the critic's value kept within ``clip`` of its value at collection."""
    return old_val + torch.clamp(val - old_val, -clip, clip)


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """The reward model's loss -log sigmoid(r_chosen - r_rejected), per pair (``notebooks/09_rlhf_ppo.ipynb``).

    Bradley and Terry (1952) model a preference as P(chosen beats rejected) = sigmoid(r_chosen - r_rejected); this is
    the negative log-likelihood of the observed label (Ouyang et al. 2022 Eq. 1). Only the difference of the two
    scores matters, so the scores are defined up to a constant. Written with ``logsigmoid`` so that a large gap
    never overflows.

    Args:
        chosen, rejected: (B,) scores of the preferred and the other completion of each pair.

    Returns:
        (B,) losses; ``.mean()`` is the usual objective.
    """
    chosen = as_tensor("chosen", chosen, ndims=(1,))
    rejected = as_tensor("rejected", rejected, ndims=(1,))
    same_shape(chosen=chosen, rejected=rejected)
    return -torch.nn.functional.logsigmoid(chosen - rejected)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy H = -sum_a pi(a) log pi(a) of categorical distributions given by logits (..., A) -> (...)."""
    logits = as_tensor("logits", logits)
    if logits.dim() == 0:
        raise ValueError("logits must have a last dimension over actions (or the vocabulary)")
    logp = torch.log_softmax(logits, dim=-1)  # (..., A)
    return -(logp.exp() * logp).sum(dim=-1)  # (...)


def entropy_grad(logits: torch.Tensor) -> torch.Tensor:
    """d entropy / d logits, (..., A), by hand (``PPOConfig.hand_grad``): -pi(a) * (log pi(a) + H).

    From H = -sum_a pi(a) log pi(a) and d log pi(a) / d z_b = [a = b] - pi(b).
    """
    ent = entropy(logits).unsqueeze(-1)  # (..., 1); checks the logits
    logp = torch.log_softmax(logits, dim=-1)  # (..., A)
    return -logp.exp() * (logp + ent)


def kl(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-sample estimates of KL(pi || pi_ref) from samples a ~ pi (Schulman, "Approximating KL divergence", 2020).

    With log r = ref_logp - logp, the log-ratio at a sample drawn from pi:
        k1 = -log r                 unbiased, high variance, can be negative
        k2 = (log r)^2 / 2          biased, low variance, >= 0
        k3 = (r - 1) - log r        unbiased, low variance, >= 0 (the GRPO paper's KL term, Shao et al. 2024 Eq. 4)
    PPO's approximate KL(old || new) for logging is ``kl(old_logp, logp, "k3")``: samples come from the old policy.
    """
    logp = as_tensor("logp", logp)
    ref_logp = as_tensor("ref_logp", ref_logp)
    same_shape(logp=logp, ref_logp=ref_logp)
    one_of("kind", kind, KL_KINDS)
    log_r = ref_logp - logp
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r**2
    return torch.expm1(log_r) - log_r  # expm1 keeps k3 >= 0 in floating point too


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int | None = None) -> torch.Tensor:
    """Reduce a (B, L) per-token loss over the tokens where ``mask`` is True (``notebooks/11_r1_zero.ipynb``).

        "token-mean":              sum_{i,t} m l / sum_{i,t} m            every token weighs the same (DAPO)
        "seq-mean-token-mean":     1/B sum_i (sum_t m l / sum_t m)        1/G sum 1/|o_i| sum_t (GRPO, Shao et al.)
        "seq-mean-token-sum":      1/B sum_i sum_t m l
        "seq-mean-token-sum-norm": sum_{i,t} m l / (B * max_len)          a constant normaliser (Dr. GRPO, Liu et al.)

    ``max_len`` defaults to L. A mask with no True at all, or a row without tokens in "seq-mean-token-mean", raises:
    an empty completion still holds its eos token, so an empty row means the mask was built wrong.
    """
    loss = as_tensor("loss", loss, ndims=(2,))
    mask = as_tensor("mask", mask, ndims=(2,), dtype="bool")
    same_shape(loss=loss, mask=mask)
    one_of("mode", mode, LOSS_AGGS)
    m = mask.to(loss.dtype)  # (B, L)
    n_tokens = m.sum()
    if n_tokens == 0:
        raise ValueError("mask selects no tokens; a completion mask must include at least the eos token")
    masked = loss * m  # (B, L)
    if mode == "token-mean":
        return masked.sum() / n_tokens
    if mode == "seq-mean-token-mean":
        lengths = m.sum(dim=1)  # (B,)
        if (lengths == 0).any():
            rows = torch.nonzero(lengths == 0).flatten().tolist()
            raise ValueError(f"mask rows {rows} select no tokens; seq-mean-token-mean divides by each row's length")
        return (masked.sum(dim=1) / lengths).mean()
    if mode == "seq-mean-token-sum":
        return masked.sum(dim=1).mean()
    max_len = loss.shape[1] if max_len is None else max_len
    if not isinstance(max_len, int) or max_len < loss.shape[1]:
        raise ValueError(f"max_len must be an int >= the number of token columns {loss.shape[1]}, got {max_len!r}")
    return masked.sum() / (loss.shape[0] * max_len)


def _ratio_inputs(logp, old_logp, adv):
    logp = as_tensor("logp", logp)
    old_logp = as_tensor("old_logp", old_logp)
    adv = as_tensor("adv", adv)
    same_shape(logp=logp, old_logp=old_logp, adv=adv)
    return logp, old_logp, adv


def _clip_range(clip_low: float, clip_high: float | None) -> tuple[float, float]:
    clip_low = in_range("clip_low", clip_low, 0.0, 1.0)
    clip_high = clip_low if clip_high is None else in_range("clip_high", clip_high, 0.0, float("inf"))
    return clip_low, clip_high
