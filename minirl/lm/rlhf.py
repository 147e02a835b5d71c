"""PPO for the LM from a learned reward: RLHF's third stage, ``minirl lm rlhf`` (``notebooks/09_rlhf_ppo.ipynb``).

The setting GRPO was invented to simplify (Ouyang et al. 2022, InstructGPT; Stiennon et al. 2020). Four models:

    policy     pi_theta    the LM being trained, started from the SFT checkpoint (``cfg.model``)
    reference  pi_ref      a frozen copy of that start; the per-token KL to it keeps the policy near what the reward
                           model has seen
    reward     r(q, o)     the frozen Bradley-Terry reward model of ``reward_model.py``, one score per completion
    value      V(s_t)      the critic: a separate model, a copy of the reward model (trunk + scalar head) that is
                           trained here. Separate rather than a head on the policy's trunk, because the value loss
                           would then pull on the policy's weights, and InstructGPT initialised its value function
                           from the reward model the same way: it starts out knowing what scores well. The price is a
                           second trained network, with its gradients and optimizer state: the memory GRPO saves
                           (``memory_table``).

Each completion o = (o_0 .. o_{C_i - 1}) is an episode whose state s_t is the prompt plus o_<t and whose action is the
token o_t. The reward is per token (Ziegler et al. 2019, Ouyang et al. 2022 Eq. 2, made per token):

    r_t = -beta * (log pi_old(o_t | s_t) - log pi_ref(o_t | s_t))   on every completion token
        + r(q, o)                                                     added at the last token, the eos

A completion that ends with eos terminates; one that reaches ``max_new_tokens`` is truncated: it is never scored,
and GAE bootstraps from V(s_C), the critic's value of the state after its last token, the way ``minirl.returns.gae``
treats a time limit on CartPole. Advantages come from that same function over tokens (time-major (C, B) after a
transpose), are whitened over the batch, and PPO runs ``epochs`` passes of ``minibatches`` with the clipped loss
``minirl.losses.ppo_clip_loss`` for the policy and ``minirl.losses.value_loss`` (optionally clipped) for the critic.

Under ``torchrun`` (``minirl.lm.distributed``) each of W processes samples and scores B / W prompts. Whitening and
the log use the statistics of all B completions; every process shuffles the same global order into the same
minibatches, trains on its own rows of each, and divides by the minibatch's token count over all processes (times
W, since DDP averages the W gradients): each update is the one a single process would make on the whole minibatch.

Shapes
    B   completions per step (``prompts_per_step``, one completion per prompt)
    P   prompt tokens (left-padded), C completion tokens (at most ``max_new_tokens``), L = P + C
"""

import copy
import random
import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from minirl import _validate
from minirl.course import use_threads
from minirl.history import History
from minirl.lm import distributed, runs
from minirl.lm import rewards as rw
from minirl.lm.config import RLHFConfig
from minirl.lm.evaluation import evaluate
from minirl.lm.grpo import draw_problems
from minirl.lm.model import load
from minirl.lm.reward_model import ScalarLM, check_same_vocab, last_index, load_scalar_lm
from minirl.lm.sampling import logprobs, sample
from minirl.lm.tasks import TASKS, get_task, token_budget
from minirl.losses import aggregate, clip_fraction, kl, ppo_clip_loss, value_loss
from minirl.returns import gae

__all__ = ["RLHFConfig", "RLHFResult", "check_config", "memory_table", "saved_activation_bytes", "token_gae",
           "token_rewards", "train"]  # fmt: skip


@dataclass
class RLHFResult:
    """``model`` (the trained policy), ``tokenizer``, ``value_model`` (the trained critic), ``history`` (one row per
    step) and ``evals`` (one dict per held-out evaluation, step 0 included)."""

    model: object
    tokenizer: object
    value_model: ScalarLM
    history: History
    evals: list[dict] = field(default_factory=list)
    config: RLHFConfig | None = None


CAUSES = (
    "a learning rate too high (lr, value_lr), a reward model that scores NaN or inf, a starting checkpoint with "
    "non-finite weights, or max_grad_norm too large. Lower the learning rates, or resume from the last checkpoint"
)


def check_config(cfg: RLHFConfig) -> RLHFConfig:
    """Check every field of ``cfg`` before any work; raise naming the field and what it allows."""
    positive = ("steps", "prompts_per_step", "temperature", "epochs", "minibatches", "lr", "value_lr",
                "max_grad_norm", "eval_n")  # fmt: skip
    nonneg = ("max_new_tokens", "beta", "clip_high", "value_clip", "eval_every", "save_every", "threads", "seed")
    _validate.check_config(cfg, positive, nonneg, ("gamma", "lam", "clip_low"), {"task": tuple(TASKS)})
    if not cfg.reward_model:
        raise ValueError(
            "reward_model is required: the folder of a reward model trained on the policy's vocabulary; make one "
            "with `minirl lm reward-model --out runs/rm` (or minirl.lm.reward_model.train)"
        )
    if cfg.minibatches > cfg.prompts_per_step:
        raise ValueError(f"minibatches ({cfg.minibatches}) must be <= prompts_per_step ({cfg.prompts_per_step})")
    if cfg.resume and not cfg.out:
        raise ValueError("resume=True needs out, the folder that holds the checkpoint to continue from")
    return cfg


def token_rewards(
    score: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, ended: torch.Tensor,
    beta: float,
) -> torch.Tensor:  # fmt: skip
    """The per-token reward of RLHF's PPO: -beta * (log pi - log pi_ref) on each completion token, plus the reward
    model's score at the last token of each completion that ended with eos.

    Args:
        score: (B,) the reward model's score of each completion.
        logp, ref_logp: (B, C) log-probs of the sampled tokens under the sampling policy and the reference.
        mask: (B, C) True on completion tokens, eos included.
        ended: (B,) True where the completion ended with eos; a truncated one gets no score (GAE bootstraps instead).

    Returns:
        (B, C) rewards, 0 outside the mask.
    """
    mask = mask.bool()
    rew = -beta * kl(logp, ref_logp, "k1") * mask  # (B, C); k1 = log pi - log pi_ref, the sampled log-ratio
    last = last_index(mask)  # (B,) the eos column of a finished row
    rows = torch.arange(len(score), device=score.device)
    return rew.index_put((rows, last), rew[rows, last] + torch.where(ended, score, torch.zeros_like(score)))


def token_gae(
    rew: torch.Tensor, val: torch.Tensor, next_val: torch.Tensor, mask: torch.Tensor, ended: torch.Tensor,
    gamma: float, lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """GAE over the tokens of each completion with ``minirl.returns.gae``: (B, C) in, (B, C) ``adv`` and ``ret`` out.

    Each row is one episode. At its last token it terminates (``ended``: the eos, nothing follows, no bootstrap) or is
    truncated (the token budget: bootstrap from ``next_val`` there, V(s_C)). Columns after a row's end are padding:
    zero reward and value, marked terminated, so they get advantage 0 and never leak into the row.

    Args:
        rew: (B, C) per-token rewards (``token_rewards``).
        val: (B, C) V(s_t), the critic's value before token t.
        next_val: (B, C) V(s_{t+1}), the value after token t; at a truncated row's last token, the bootstrap.
        mask: (B, C) completion mask, eos included; ended: (B,) bool.
    """
    mask = mask.bool()
    cols = torch.arange(mask.shape[1], device=mask.device)[None, :]  # (1, C)
    last = last_index(mask)[:, None]  # (B, 1)
    at_end = cols == last  # (B, C)
    terminated = (at_end & ended[:, None]) | ~mask  # eos, and every padding column
    truncated = at_end & ~ended[:, None]
    zero = torch.zeros_like(rew)
    rew, val, next_val = (torch.where(mask, x, zero) for x in (rew, val, next_val))
    adv, ret = gae(rew.T, val.T, next_val.T, terminated.T, truncated.T, gamma, lam)  # time-major (C, B)
    return adv.T, ret.T  # (B, C)


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the entries where ``mask`` is True, on every process together; 0 elsewhere."""
    mask = mask.bool()
    mean, var = distributed.moments(x[mask])
    std = var.sqrt() if distributed.all_sum(mask.sum()) > 1 else torch.ones_like(mean)  # one entry: no spread
    return torch.where(mask, (x - mean) / (std + eps), torch.zeros_like(x))


def build_value_model(cfg: RLHFConfig, reward_model: ScalarLM, tokenizer, device) -> ScalarLM:
    """The critic: a trainable copy of the reward model, or the scalar model in ``cfg.value_model``."""
    if cfg.value_model is None:
        return copy.deepcopy(reward_model).requires_grad_(True)
    value, value_tok = load_scalar_lm(cfg.value_model, device=device)
    check_same_vocab("value model", tokenizer, value_tok, value)
    return value


def train(cfg: RLHFConfig, progress: bool = False, reward_fn: rw.RewardFn | None = None) -> RLHFResult:
    """Run PPO from ``cfg.model`` against the reward model ``cfg.reward_model`` for ``cfg.steps`` steps.

    ``reward_fn(prompts, completions, answers) -> (B,)`` replaces the reward model's score at the eos with a rule of
    your own (``rewards.accuracy_reward(task)``: PPO on the verifier itself, as GRPO uses it); the reward model then
    only starts the critic.

    Returns ``.model``, ``.tokenizer``, ``.value_model``, ``.history`` and ``.evals`` (greedy held-out accuracy,
    checked by the task's verifier, which the training never sees). With ``cfg.out`` and ``cfg.resume``, training
    continues from the checkpoint there. Under ``torchrun``, ``reward_fn`` sees the rows of its own process.
    """
    check_config(cfg)
    world = distributed.init(cfg.device)
    mine = distributed.shard(cfg.prompts_per_step, "prompts_per_step")  # this process's prompts
    with distributed.main_first():  # rank 0 first: it may repair a checkpoint that a crash left half-written
        out, saved, resumes = runs.start_run(cfg, "rlhf")
    use_threads(cfg.threads)
    task = get_task(cfg.task)
    verifier = rw.accuracy_reward(task)  # logged only: PPO learns from the reward model

    # --- the four models ---
    policy, tokenizer = load(saved.model_path() if saved else cfg.model, device=distributed.device(cfg.device))
    max_new = cfg.max_new_tokens or token_budget(task, tokenizer)  # in this tokenizer's tokens
    device = next(policy.parameters()).device
    ref_model = load(cfg.model, device=device)[0].requires_grad_(False)  # frozen pi_ref
    reward_model, rm_tokenizer = load_scalar_lm(cfg.reward_model, device=device)
    check_same_vocab("reward model", tokenizer, rm_tokenizer, reward_model)
    reward_model.requires_grad_(False)  # frozen r(q, o)
    value_model = build_value_model(cfg, reward_model, tokenizer, device)  # trained V(s_t)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
    value_optimizer = torch.optim.AdamW(value_model.parameters(), lr=cfg.value_lr, weight_decay=0.0)
    start, history, evals = 0, History(), []
    if saved is not None:
        runs.load_weights(value_model, saved.model_path("value"))
        saved.load_optimizer("policy", optimizer)
        saved.load_optimizer("value", value_optimizer)
        start, history.rows, evals = saved.step, saved.state["rows"], saved.state["evals"]
    ddp_policy, ddp_value = distributed.wrap(policy), distributed.wrap(value_model)  # training forwards only

    def evaluation(step: int) -> dict:  # every process scores the same problems: the others would wait anyway
        ev = evaluate(policy, tokenizer, task, n=cfg.eval_n, k=0)
        evals.append({"step": step, "heldout_accuracy": ev.accuracy, "heldout_format": ev.format_rate})
        return evals[-1]

    if cfg.eval_every and not evals:
        evaluation(0)
    show = progress and distributed.is_main()
    bar = tqdm(range(start, cfg.steps), desc="rlhf", disable=not show, initial=start, total=cfg.steps)
    for step in bar:
        # --- rollout: one completion per prompt from the old policy; the frozen models score it ---
        t0 = time.perf_counter()
        problems = draw_problems(task, cfg.prompts_per_step, cfg.seed, step)[mine]  # the same B everywhere; a share
        prompts, answers = [p.prompt for p in problems], [p.answer for p in problems]
        seed = cfg.seed * 1_000_003 + step + 1_000_000_007 * distributed.rank()  # each process its own completions
        generator = torch.Generator(device).manual_seed(seed)
        smp = sample(policy, tokenizer, prompts, max_new, temperature=cfg.temperature, generator=generator)
        ids, mask, cmask, old_logp = smp.ids, smp.mask, smp.completion_mask, smp.logp  # (B, L), (B, L), (B, C), (B, C)
        ended = ~smp.truncated  # (B,) finished with eos
        P = smp.prompt_ids.shape[1]
        C = cmask.shape[1]
        with torch.no_grad(), distributed.autocast(device):
            ref_logp = logprobs(ref_model, ids, mask, cfg.temperature)[:, P:]  # (B, C)
            score = reward_model.score(ids, mask).float()  # (B,) at each row's last real token; fp32 under bf16
            v_all = value_model(ids, mask).float()  # (B, L), V of the state after each token
        if reward_fn is not None:
            score = rw.check_rewards("reward_fn", reward_fn(prompts, smp.text, answers), len(prompts)).to(device)
        _validate.check_finite(step + 1, CAUSES, reward_model_score=score, value=v_all)
        old_val = v_all[:, P - 1 : P - 1 + C]  # (B, C) V(s_t): the state before token t ends at column P - 1 + t
        next_val = v_all[:, P : P + C]  # (B, C) V(s_{t+1}); at column C - 1 the bootstrap V(s_C) of a truncated row
        correct = rw.check_rewards("accuracy", verifier(prompts, smp.text, answers), len(prompts))  # (B,) logged only
        t1 = time.perf_counter()

        # --- advantages: per-token rewards, GAE over tokens, whitening ---
        rew = token_rewards(score, old_logp, ref_logp, cmask, ended, cfg.beta)  # (B, C)
        adv, ret = token_gae(rew, old_val, next_val, cmask, ended, cfg.gamma, cfg.lam)  # (B, C), (B, C)
        if cfg.whiten:
            adv = whiten(adv, cmask)  # (B, C)

        # --- update: epochs x minibatches of PPO-clip for the policy, value regression for the critic ---
        sums = []  # per minibatch: both losses / W, then clip and kl_old summed over this process's tokens, tokens
        order_rng = random.Random(f"rlhf/{cfg.seed}/{step}")
        all_lengths = distributed.gather(cmask.sum(1).cpu())  # (W * B,) completion tokens of every process's rows
        policy.train()
        value_model.train()
        for _ in range(cfg.epochs):
            order = list(range(cfg.prompts_per_step))  # one global order, the same on every process
            order_rng.shuffle(order)
            for g_mb in torch.tensor(order).chunk(cfg.minibatches):  # (b,) rows of all processes
                ours = g_mb[(g_mb >= mine.start) & (g_mb < mine.stop)]  # those of this process, in the same order
                # DDP averages the W gradients: W times this process's share of the minibatch's tokens makes the
                # average the gradient of the token mean over the whole minibatch (exactly 1 with one process)
                here = int(all_lengths[ours].sum())
                weight = world * here / int(all_lengths[g_mb].sum())
                mb = (ours - mine.start).to(device)  # (b',) local rows
                if not len(mb):  # DDP needs a backward pass from every process: one row, at weight 0
                    mb = torch.zeros(1, dtype=torch.long, device=device)
                mb_ids, mb_mask, mb_cmask = ids[mb], mask[mb], cmask[mb]  # (b', L), (b', L), (b', C)
                with distributed.autocast(device):
                    logp = logprobs(ddp_policy, mb_ids, mb_mask, cfg.temperature)[:, P:]  # (b', C)
                    val = ddp_value(mb_ids, mb_mask)[:, P - 1 : P - 1 + C].float()  # (b', C)
                pg = ppo_clip_loss(logp, old_logp[mb], adv[mb], cfg.clip_low, cfg.clip_high)  # (b', C) Eq. 7
                policy_loss = weight * aggregate(pg, mb_cmask, "token-mean")
                vl = value_loss(val, ret[mb], old_val[mb], cfg.value_clip)  # (b', C)
                v_loss = weight * aggregate(vl, mb_cmask, "token-mean")
                _validate.check_finite(step + 1, CAUSES, policy_loss=policy_loss, value_loss=v_loss)
                optimizer.zero_grad(set_to_none=True)
                value_optimizer.zero_grad(set_to_none=True)
                (policy_loss + v_loss).backward()  # two separate models: each loss reaches only its own weights
                for name, model, opt in (("policy", policy, optimizer), ("value", value_model, value_optimizer)):
                    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    _validate.check_finite(step + 1, CAUSES, **{f"{name}_gradient_norm": norm})
                    opt.step()
                    _validate.check_finite_parameters(model, step + 1, CAUSES)
                with torch.no_grad():  # summed here and over processes at the log: no device sync per minibatch
                    m = mb_cmask.to(logp.dtype) * (here > 0)  # (b', C); the weight-0 row of an idle process counts 0
                    frac = clip_fraction(logp, old_logp[mb], cfg.clip_low, cfg.clip_high)  # (b', C)
                    old_kl = kl(old_logp[mb], logp, "k3")  # (b', C)
                    sums.append(torch.stack([policy_loss.detach() / world, v_loss.detach() / world,
                                             (frac * m).sum(), (old_kl * m).sum(), m.sum()]))  # fmt: skip
        policy.eval()
        value_model.eval()
        t2 = time.perf_counter()

        # --- log: over the rows of every process ---
        tot = distributed.all_sum(torch.stack(sums)).cpu()  # (epochs * minibatches, 5)
        stats = {"policy_loss": tot[:, 0], "value_loss": tot[:, 1], "clip_frac": tot[:, 2] / tot[:, 4],
                 "kl_old": tot[:, 3] / tot[:, 4]}  # fmt: skip
        lengths = distributed.gather(cmask.sum(1).float())  # (W * B,)
        seq_kl = distributed.gather((kl(old_logp, ref_logp, "k1") * cmask).sum(1))  # (W * B,) log pi/pi_ref of o|q
        resid_mean, resid_var = distributed.moments((ret - old_val)[cmask])  # of the critic's errors, every token
        ret_var = distributed.moments(ret[cmask])[1]
        row = {
            "step": step + 1,
            "score": distributed.gather(score).mean().item(),  # the learned reward, before the KL penalty
            # what PPO maximises: score - beta * KL, summed per row
            "reward": distributed.gather((rew * cmask).sum(1)).mean().item(),
            "kl_ref": seq_kl.mean().item(),  # per completion, summed over tokens (k1)
            "accuracy": distributed.gather(correct).mean().item(),  # verified on the training samples; not trained on
            "length": lengths.mean().item(),  # completion tokens, eos included
            "truncated": distributed.gather(smp.truncated.float()).mean().item(),
            # sample estimate of the per-token entropy at T
            "entropy": -(distributed.all_sum(old_logp.sum()) / distributed.all_sum(cmask.sum())).item(),
            "explained_variance": (1 - resid_var / ret_var.clamp(min=1e-8)).item(),  # of the critic
            "sample_s": t1 - t0,
            "train_s": t2 - t1,
            **{k: sum(v.tolist()) / len(v) for k, v in stats.items()},
        }
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            row.update({k: v for k, v in evaluation(step + 1).items() if k != "step"})
        history.log(**row)
        bar.set_postfix({"score": f"{row['score']:.2f}", "acc": f"{row['accuracy']:.2f}"}, refresh=False)
        saving = (cfg.save_every and (step + 1) % cfg.save_every == 0) or step + 1 == cfg.steps
        if out is not None and saving and distributed.is_main():  # one writer: every process holds the same state
            state = {"step": step + 1, "rows": history.rows, "evals": evals, "resumes": resumes}
            runs.save_run(out, {"model": policy, "value": value_model}, tokenizer,
                          {"policy": optimizer, "value": value_optimizer}, state, cfg, "rlhf")  # fmt: skip
    bar.close()
    return RLHFResult(policy, tokenizer, value_model, history, evals, cfg)


# --- memory: what each of the four models costs (the comparison with GRPO in notebook 09) ---


def saved_activation_bytes(fn) -> tuple[object, int]:
    """Run ``fn()`` and count the bytes of the tensors autograd saves for the backward pass (the activations that a
    training forward keeps alive until ``backward``). Returns ``(fn(), bytes)``; tensors saved twice count twice."""
    total = 0

    def pack(t: torch.Tensor):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return result, total


def memory_table(models: dict[str, torch.nn.Module], trained: tuple[str, ...], activations: dict[str, int],
                 adam_slots: int = 2) -> dict[str, dict[str, int]]:  # fmt: skip
    """Bytes per model: ``params``, ``grads`` and ``optimizer`` (AdamW's ``adam_slots`` moments, fp32 like the
    weights) for the models in ``trained``, the counted ``activations``, and their ``total``; plus a "sum" row."""
    table = {}
    for name, model in models.items():
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        train_it = name in trained
        row = {"params": params, "grads": params if train_it else 0, "optimizer": adam_slots * params if train_it
               else 0, "activations": activations.get(name, 0)}  # fmt: skip
        row["total"] = sum(row.values())
        table[name] = row
    table["sum"] = {k: sum(r[k] for r in table.values()) for k in ("params", "grads", "optimizer", "activations",
                                                                    "total")}  # fmt: skip
    return table
