"""Checks of the losses and KL estimators of ``minirl.losses``.

Shapes
    B   samples (steps, or pairs of completions), L tokens per completion
"""

import torch

from minirl import losses
from minirl.checks.core import Case, NoValue, generator, run, show


def _loss_and_grad(f, logp, old_logp, adv, clip_low, clip_high):
    """The per-sample loss and the gradient of its sum with respect to ``logp``."""
    logp = logp.requires_grad_(True)
    loss = f(logp, old_logp, adv, clip_low, clip_high)
    if not isinstance(loss, torch.Tensor):
        return loss, None  # the loss itself fails the comparison
    grad = None
    if loss.requires_grad:
        (grad,) = torch.autograd.grad(loss.sum(), logp, allow_unused=True)
    if grad is None:
        return loss.detach(), NoValue("expected a gradient, got none: the loss does not reach logp through autograd")
    return loss.detach(), grad


def check_ppo_clip_loss(fn) -> None:
    """Check ``fn(logp, old_logp, adv, clip_low=0.2, clip_high=None)`` against ``minirl.losses.ppo_clip_loss``, its
    values and its gradient in ``logp`` (``notebooks/05_ppo.ipynb``), Schulman et al. 2017 Eq. 7, negated:
    loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A), ratio = exp(logp - old_logp)."""
    gen = generator(5)
    old_logp = torch.log(torch.tensor([0.5, 0.2, 0.4, 0.3]))  # (B,)

    def at(name, ratio, adv, hint, clip_low=0.2, clip_high=None):
        logp = old_logp + torch.log(torch.tensor(ratio))  # (B,) so that exp(logp - old_logp) = ratio
        args = dict(logp=logp, old_logp=old_logp, adv=torch.tensor(adv), clip_low=clip_low, clip_high=clip_high)
        return Case(name, args, hint, dict(logp=f"{show(logp, 11)}  (ratio = exp(logp - old_logp) = {ratio})"))

    formula = ("loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A) with ratio = exp(logp - old_logp):"
               " the objective negated, because optimisers minimise")
    pessimist = ("outside the band the min keeps the smaller objective: for A > 0 and ratio > 1 + clip_high that is "
                 "the clipped term (flat, zero gradient). Taking the min of the negated terms, or the max of the "
                 "objective, picks the other one")
    harmful = ("a ratio that moved the harmful way (A > 0 and ratio < 1 - clip_low, or A < 0 and ratio > 1 + "
               "clip_high) is not clipped: the min keeps ratio * A, and its full gradient pulls it back")
    cases = [
        at("ratios inside the band", [1.0, 1.1, 0.9, 1.15], [1.0, -2.0, 0.5, 1.0], formula),
        at("A > 0, ratio above 1 + eps: clipped", [1.5, 1.3, 2.0, 1.21], [1.0, 2.0, 0.5, 1.0], pessimist),
        at("A < 0, ratio below 1 - eps: clipped", [0.5, 0.7, 0.1, 0.79], [-1.0, -2.0, -0.5, -1.0], pessimist),
        at("A > 0, ratio below 1 - eps: not clipped", [0.5, 0.7, 0.1, 0.79], [1.0, 2.0, 0.5, 1.0], harmful),
        at("A < 0, ratio above 1 + eps: not clipped", [1.5, 1.3, 2.0, 1.21], [-1.0, -2.0, -0.5, -1.0], harmful),
        at("A = 0", [0.5, 1.0, 1.5, 3.0], [0.0, 0.0, 0.0, 0.0], formula),
        at("clip_low = 0.1 (use the argument)", [1.15, 0.85, 1.05, 0.5], [1.0, -1.0, 1.0, 1.0],
           "clip the ratio to [1 - clip_low, 1 + clip_high] with the clip_low given; clip_high=None means "
           "clip_high = clip_low", clip_low=0.1),
        at("clip-higher: clip_high = 0.28 > clip_low = 0.2", [1.25, 1.3, 0.75, 0.5], [1.0, 1.0, -1.0, 1.0],
           "DAPO's clip-higher: the band is [1 - clip_low, 1 + clip_high], asymmetric when clip_high is given",
           clip_high=0.28),
    ]
    for i, shape in enumerate([(16,), (3, 5), (32,)]):
        old = torch.log(torch.rand(shape, generator=gen) * 0.9 + 0.05)
        logp = old + 0.6 * (torch.rand(shape, generator=gen) - 0.5)  # ratios in about [0.74, 1.35]
        args = dict(logp=logp, old_logp=old, adv=torch.randn(shape, generator=gen), clip_low=0.2,
                    clip_high=None if i != 2 else 0.28)
        cases.append(Case(f"random batch {i + 1}, shape {shape}", args, f"{formula}; {pessimist}"))
    grad = ("the gradient flows through ratio = exp(logp - old_logp) only: keep logp in the graph (no .detach(), "
            "no .item(), no torch.tensor(...) around it); the clipped branch is flat where it wins")
    run("check_ppo_clip_loss", fn, losses.ppo_clip_loss, cases, call=_loss_and_grad,
        outputs=("loss", "d loss / d logp"), output_hints={"d loss / d logp": grad})


KL_FORMULAS = {
    "k1": "k1 = -log r = logp - ref_logp",
    "k2": "k2 = (log r)^2 / 2",
    "k3": "k3 = (r - 1) - log r, with r = exp(log r)",
}


def check_kl(fn, kind: str) -> None:
    """Check ``fn(logp, ref_logp, kind)`` for one ``kind`` of "k1", "k2", "k3" against ``minirl.losses.kl``
    (``notebooks/10_grpo.ipynb``; Schulman 2020, "Approximating KL divergence"), with log r = ref_logp - logp."""
    if kind not in KL_FORMULAS:
        raise ValueError(f"kind must be one of {tuple(KL_FORMULAS)}, got {kind!r}")
    gen = generator(10)
    formula = (f"{KL_FORMULAS[kind]}, where log r = ref_logp - logp: the reference's log-prob minus the policy's "
               "(mind the order)")
    logp = torch.tensor([-1.0, -0.5, -2.0])  # (B,)

    def args(ref_logp):
        return dict(logp=logp, ref_logp=torch.tensor(ref_logp), kind=kind)

    cases = [
        Case("equal log-probs: every estimate is 0", args([-1.0, -0.5, -2.0]), formula),
        Case("the reference likes the tokens more (log r > 0)", args([-0.5, -0.1, -0.2]), formula),
        Case("the reference likes the tokens less (log r < 0)", args([-3.0, -0.6, -2.5]), formula),
        Case("far apart (|log r| up to 15)", args([-16.0, -0.5, -0.05]), formula),
        Case("tokens (B, L)", dict(logp=-torch.rand(2, 4, generator=gen) * 3, ref_logp=-torch.rand(2, 4, generator=gen)
                                   * 3, kind=kind), f"{formula}; one estimate per token, the shape of logp"),
    ]
    for i in range(2):
        shape = (6,) if i == 0 else (3, 7)
        random = dict(logp=torch.log_softmax(torch.randn(shape, generator=gen), -1),
                      ref_logp=torch.log_softmax(torch.randn(shape, generator=gen), -1), kind=kind)
        cases.append(Case(f"random log-probs {i + 1}, shape {shape}", random, formula))
    run(f"check_kl ({kind})", fn, losses.kl, cases)


def check_bradley_terry_loss(fn) -> None:
    """Check ``fn(chosen, rejected)`` against ``minirl.losses.bradley_terry_loss`` (``notebooks/09_rlhf_ppo.ipynb``):
    the reward model's loss -log sigmoid(r_chosen - r_rejected) per pair, Ouyang et al. 2022 Eq. 1."""
    gen = generator(9)
    formula = "loss = -log sigmoid(r_chosen - r_rejected), one number per pair"
    sign = ("the loss is small when the chosen score is the higher one: -log sigmoid(chosen - rejected). With the "
            "difference the other way round, the model learns to prefer the rejected completion")
    overflow = ("log(sigmoid(x)) becomes log(0) = -inf once sigmoid(x) underflows (x below about -100 in float32), "
                "and log(1 + exp(-x)) overflows for large -x; torch.nn.functional.logsigmoid(x) (or -softplus(-x)) "
                "stays exact for any x")
    cases = [
        Case("a tie costs log 2", dict(chosen=torch.tensor([0.0, 1.5]), rejected=torch.tensor([0.0, 1.5])), formula),
        Case("chosen ahead, then behind", dict(chosen=torch.tensor([2.0, -1.0, 0.5]),
                                               rejected=torch.tensor([0.0, 1.0, 0.0])), sign),
        Case("both scores shifted by 100", dict(chosen=torch.tensor([102.0, 99.0]),
                                                rejected=torch.tensor([100.0, 100.0])),
             "only the difference of the scores enters: subtract first, then take -log sigmoid"),
        Case("large score gaps (up to 1000)", dict(chosen=torch.tensor([200.0, -200.0, 1000.0, 0.0]),
                                                   rejected=torch.tensor([0.0, 0.0, -1000.0, 1000.0])), overflow),
    ]
    for i in range(2):
        chosen, rejected = torch.randn(2, 8, generator=gen) * 3  # (B,) each
        cases.append(Case(f"random scores {i + 1}", dict(chosen=chosen, rejected=rejected), f"{formula}; {sign}"))
    run("check_bradley_terry_loss", fn, losses.bradley_terry_loss, cases)
