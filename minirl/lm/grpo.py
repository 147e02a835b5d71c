"""GRPO for the language model with rule-based rewards: ``minirl lm grpo`` (``notebooks/10_grpo.ipynb``).

Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath) is PPO without a critic. For each prompt q the
old policy writes G completions o_1..o_G; each gets a reward r_i from rules (``minirl.lm.rewards``); the baseline is
the group's mean reward, so the advantage of every token of o_i is

    A_i       = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)                      Shao et al. 2024, Sec. 4.1.2
    ratio_i,t = pi_theta(o_i,t | q, o_i,<t) / pi_old(o_i,t | q, o_i,<t)
    loss_i,t  = -min(ratio_i,t A_i, clip(ratio_i,t, 1 - clip_low, 1 + clip_high) A_i) + beta * k3_i,t
    loss      = aggregate(loss_i,t over completion tokens, loss_agg)            Shao et al. 2024 Eq. 3 (negated)

with k3 = pi_ref/pi_theta - 1 - log(pi_ref/pi_theta) per token (Eq. 4). ``loss_agg`` chooses the average:
"seq-mean-token-mean" is the paper's 1/G sum_i 1/|o_i| sum_t; "token-mean" weighs every token alike (DAPO, Yu et al.
2025); "seq-mean-token-sum-norm" divides by G * max_new_tokens, a constant (Dr. GRPO, Liu et al. 2025).

A group whose rewards are all equal has A_i = 0 on every row, and with beta = 0 such rows add exactly nothing to the
loss or its gradient; the trainer leaves them out of the forward and backward passes and keeps the denominators of
the whole batch (``denominator_share``), so the update is the same and a step gets cheaper as more groups agree.

Shapes
    N   prompts per step (``prompts_per_step``)
    G   completions per prompt (``group_size``); B = N * G rows, each group's G rows consecutive
    P   prompt tokens (left-padded), C completion tokens (at most ``max_new_tokens``), L = P + C
"""

import dataclasses
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minirl.history import History
from minirl.lm import rewards as rw
from minirl.lm.evaluation import evaluate
from minirl.lm.model import PRETRAINED, load, save
from minirl.lm.sampling import logprobs, sample
from minirl.lm.tasks import Problem, get_task, split_of
from minirl.losses import LOSS_AGGS, aggregate, clip_fraction, kl, ppo_clip_loss
from minirl.returns import GROUP_SCALES, group_advantages


@dataclass
class GRPOConfig:
    """Hyperparameters of ``train``; each field is an option of ``minirl lm grpo``. Defaults follow runs that learned
    on 2 CPU cores (16 prompts x 8 completions, temperature 1, one iteration, lr 1e-4, beta 0)."""

    model: str = str(PRETRAINED)  # checkpoint folder or hub name to start from (and the frozen reference, beta > 0)
    task: str = "addition"  # task family of minirl.lm.tasks: addition (3 digits), sorting, addition-plain
    steps: int = 200  # GRPO steps; each samples B = prompts_per_step * group_size completions and trains on them
    prompts_per_step: int = 16  # N questions per step, fresh training problems each step
    group_size: int = 8  # G completions per question (Shao et al. 2024 used 64); >= 2, a group of one has no baseline
    max_new_tokens: int = 0  # completion budget; 0 takes the task's (a little above its longest target)
    temperature: float = 1.0  # sampling temperature T; log-probs are of the same softmax(logits / T); usually 0.7-1.0
    iterations: int = 1  # mu, gradient steps per batch (Shao et al. 2024 Alg. 1); 1 keeps the ratio at 1 (no clipping)
    clip_low: float = 0.2  # epsilon, the ratio's lower clip 1 - clip_low, Schulman et al. 2017 Eq. 7; usually 0.1-0.3
    clip_high: float | None = None  # upper clip 1 + clip_high; None: symmetric; 0.28 is DAPO's clip-higher
    beta: float = 0.0  # coefficient of the k3 KL to the frozen start model, Shao et al. 2024 Eq. 3 (0.04); 0: no ref
    scale: str = "group"  # advantage denominator: "group" std (GRPO), "batch" std, "none" (Dr. GRPO)
    loss_agg: str = "seq-mean-token-mean"  # seq-mean-token-mean (GRPO), token-mean (DAPO), seq-mean-token-sum-norm
    mask_truncated: bool = False  # leave completions that hit max_new_tokens without eos out of the loss (DAPO)
    drop_zero_variance: bool = False  # leave groups whose rewards are all equal out of the loss (their A_i are 0)
    accuracy_weight: float = 1.0  # weight of the accuracy reward (1 for the right answer in <answer>..</answer>)
    format_weight: float = 0.0  # weight of the strict format reward; logged either way (a bonus made runs collapse)
    lr: float = 1e-4  # AdamW learning rate, constant; 1e-4 learned here, 3e-4 collapsed
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    max_grad_norm: float = 1.0  # clip the global gradient norm to this
    eval_every: int = 25  # steps between greedy held-out evaluations (also at step 0 and at the end); 0: never
    eval_n: int = 200  # held-out problems per evaluation
    out: str | None = None  # folder for checkpoints (model/ and trainer.pt, replaced atomically); None: no saving
    save_every: int = 0  # steps between checkpoints into out; 0: only at the end
    resume: bool = False  # continue from the checkpoint in out if there is one (else start), as an unbroken run would
    seed: int = 0  # prompts and sampling of step s are seeded by (seed, s), so a resumed run draws the same
    threads: int = 0  # torch CPU threads; 0 keeps torch's default
    device: str = "auto"  # "auto" (a GPU when there is one), "cpu", "cuda"


@dataclass
class GRPOResult:
    """``model`` (trained), ``tokenizer``, ``history`` (one row per step; held-out scores on evaluation steps) and
    ``evals`` (one dict per evaluation, step 0 included)."""

    model: object
    tokenizer: object
    history: History
    evals: list[dict] = field(default_factory=list)
    config: GRPOConfig | None = None


def check_config(cfg: GRPOConfig) -> None:
    """Raise a ValueError that names the field and what it allows."""
    if not isinstance(cfg.group_size, int) or cfg.group_size < 2:
        raise ValueError(
            f"group_size must be an int >= 2, got {cfg.group_size!r}: GRPO's baseline is the mean reward of the other "
            "completions to the same prompt, so a group of one always has advantage 0 and nothing is learned"
        )
    for name in ("steps", "prompts_per_step", "iterations"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be an int >= 1, got {getattr(cfg, name)!r}")
    for name in ("max_new_tokens", "eval_every", "save_every", "threads"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be an int >= 0, got {getattr(cfg, name)!r}")
    if cfg.scale not in GROUP_SCALES:
        raise ValueError(f"scale must be one of {GROUP_SCALES}, got {cfg.scale!r}")
    if cfg.loss_agg not in LOSS_AGGS:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {cfg.loss_agg!r}")
    if not (isinstance(cfg.beta, (int, float)) and cfg.beta >= 0):
        raise ValueError(f"beta must be >= 0 (0 skips the reference model), got {cfg.beta!r}")
    if not (isinstance(cfg.lr, (int, float)) and cfg.lr > 0):
        raise ValueError(f"lr must be > 0, got {cfg.lr!r}")
    if cfg.resume and not cfg.out:
        raise ValueError("resume=True needs out, the folder that holds the checkpoint to continue from")


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    loss_agg: str = "seq-mean-token-mean",
    max_len: int | None = None,
) -> torch.Tensor:
    """The GRPO loss of one batch, Shao et al. 2024 Eq. 3 negated, from per-token log-probs.

    Args:
        logp: (B, C) log pi_theta of the completion tokens, with the graph.
        old_logp: (B, C) log pi_old, of the policy that sampled them.
        adv: (B,) one advantage per completion, applied to each of its tokens.
        mask: (B, C) True on the completion tokens that count (eos included).
        ref_logp: (B, C) log pi_ref, needed when beta > 0.
        max_len: the constant of "seq-mean-token-sum-norm" (the completion budget); defaults to C.
    """
    if adv.dim() != 1 or adv.shape[0] != logp.shape[0]:
        raise ValueError(f"adv must be (B,) with B = {logp.shape[0]} completions, got {tuple(adv.shape)}")
    tok_adv = adv[:, None].expand_as(logp)  # (B, C): every token of o_i shares A_i
    loss = ppo_clip_loss(logp, old_logp, tok_adv, clip_low, clip_high)  # (B, C)
    if beta > 0:  # GRPO puts the KL in the loss, not in the reward as RLHF's PPO does (Shao et al. 2024 Eq. 3)
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp, the frozen reference model's log-probs")
        loss = loss + beta * kl(logp, ref_logp.detach(), "k3")  # (B, C)
    return aggregate(loss, mask, loss_agg, max_len)


def denominator_share(cmask: torch.Tensor, live: torch.Tensor, loss_agg: str) -> float:
    """The part of ``aggregate``'s denominator that the ``live`` rows hold: their tokens' share for "token-mean",
    their share of the rows for the other modes.

    Args:
        cmask: (B', C) completion mask of all rows in the loss.
        live: (B',) bool, the rows that go through the forward pass.

    When the other rows add exactly 0 to the summed loss, ``share * aggregate(live rows)`` equals ``aggregate(all)``.
    """
    if loss_agg == "token-mean":
        return (cmask[live].sum() / cmask.sum()).item()
    return live.float().mean().item()


def draw_problems(task, n: int, seed: int, step: int) -> list[Problem]:
    """``n`` training problems for ``step``, the same for the same (seed, step), as a resumed run needs."""
    rng = random.Random(f"grpo/{task.name}/{seed}/{step}")
    problems = []
    while len(problems) < n:
        problem = task.draw(rng)
        if split_of(problem.prompt) == "train":  # never a held-out problem
            problems.append(problem)
    return problems


def reward_parts(cfg: GRPOConfig, task, reward_fn: rw.RewardFn | None) -> dict:
    """Named ``(reward_fn, weight)`` parts for ``rewards.score``; a user's ``reward_fn`` joins as "user", weight 1."""
    parts = {
        "accuracy": (rw.accuracy_reward(task), cfg.accuracy_weight),
        "format": (rw.format_reward, cfg.format_weight),
    }
    if reward_fn is not None:
        parts["user"] = (reward_fn, 1.0)
    return parts


def save_checkpoint(path: Path, model, tokenizer, optimizer, step: int, history: History, evals: list, cfg) -> Path:
    """``path/model`` (``minirl.lm.save``) and ``path/trainer.pt`` (optimizer, step, history), written to a temporary
    folder and renamed into place: an exception midway leaves the previous checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        save(model, tokenizer, tmp / "model", {"grpo_step": step, "config": dataclasses.asdict(cfg)})
        state = {"optimizer": optimizer.state_dict(), "step": step, "rows": history.rows, "evals": evals}
        torch.save(state, tmp / "trainer.pt")
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def train(
    cfg: GRPOConfig,
    progress: bool = False,
    reward_fn: rw.RewardFn | None = None,
    on_batch: Callable[[int, list[str], list[str], dict[str, torch.Tensor]], None] | None = None,
) -> GRPOResult:
    """Run GRPO from ``cfg.model`` for ``cfg.steps`` steps; returns ``.model``, ``.tokenizer``, ``.history``.

    ``reward_fn(prompts, completions, answers) -> (B,)`` adds a reward of your own with weight 1 (logged as
    "reward_user"). ``on_batch(step, prompts, completions, rewards)`` sees every scored batch (``rewards`` maps
    "reward", the total, and each part's name to a (B,) tensor), for looking at the traces as they change.
    With ``cfg.out`` and ``cfg.resume``, training continues from the checkpoint there.
    """
    check_config(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task = get_task(cfg.task)
    max_new = cfg.max_new_tokens or task.max_new_tokens
    G, out = cfg.group_size, Path(cfg.out) if cfg.out else None
    start, history, evals = 0, History(), []
    resuming = cfg.resume and out is not None and (out / "trainer.pt").exists()
    model, tokenizer = load(out / "model" if resuming else cfg.model, device=cfg.device)
    device = next(model.parameters()).device
    ref_model = load(cfg.model, device=cfg.device)[0].requires_grad_(False) if cfg.beta > 0 else None  # frozen pi_ref
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    if resuming:
        state = torch.load(out / "trainer.pt", weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        start, history.rows, evals = state["step"], state["rows"], state["evals"]
    parts = reward_parts(cfg, task, reward_fn)

    def evaluation(step: int) -> dict:
        ev = evaluate(model, tokenizer, task, n=cfg.eval_n, k=0)
        evals.append({"step": step, "heldout_accuracy": ev.accuracy, "heldout_format": ev.format_rate})
        return evals[-1]

    if cfg.eval_every and not evals:
        evaluation(0)
    bar = tqdm(range(start, cfg.steps), desc="grpo", disable=not progress, initial=start, total=cfg.steps)
    for step in bar:
        # --- rollout: G completions per prompt from the old policy, at temperature T ---
        t0 = time.perf_counter()
        problems = draw_problems(task, cfg.prompts_per_step, cfg.seed, step)
        prompts = [p.prompt for p in problems for _ in range(G)]  # (B,) each group's G rows consecutive
        answers = [p.answer for p in problems for _ in range(G)]
        generator = torch.Generator(device).manual_seed(cfg.seed * 1_000_003 + step)
        smp = sample(model, tokenizer, prompts, max_new, temperature=cfg.temperature, generator=generator)
        rew, values = rw.score(parts, prompts, smp.text, answers)  # (B,), {name: (B,)}
        t1 = time.perf_counter()
        if on_batch is not None:
            on_batch(step + 1, prompts, smp.text, {"reward": rew, **values})

        # --- advantages: compare each completion with its group ---
        adv = group_advantages(rew, G, cfg.scale).to(device)  # (B,)
        grouped = rew.view(-1, G)  # (N, G)
        zero_var = (grouped == grouped[:, :1]).all(dim=1)  # (N,) all G rewards equal: A_i = 0 for the group
        keep = torch.ones(len(prompts), dtype=torch.bool)  # (B,) rows that enter the loss
        if cfg.drop_zero_variance:
            keep &= ~zero_var.repeat_interleave(G)
        if cfg.mask_truncated:
            keep &= ~smp.truncated.cpu()
        rows = keep.nonzero().flatten().to(device)  # (B',) rows in the loss
        # With beta = 0 a row whose advantage is 0 (every row of an all-equal group) adds exactly 0 to the loss and to
        # its gradient. Such rows skip the forward and backward passes, and the other rows' loss is scaled by their
        # share of the denominator: the loss and gradient of all B' rows, for less compute once most groups agree.
        live, share = rows, 1.0
        if cfg.beta == 0 and len(rows):
            has_signal = adv[rows] != 0  # (B',)
            live, share = rows[has_signal], denominator_share(smp.completion_mask[rows], has_signal, cfg.loss_agg)
        P = smp.prompt_ids.shape[1]
        b_ids, b_mask = smp.ids[live], smp.mask[live]  # (B'', L)
        b_cmask, b_old_logp, b_adv = smp.completion_mask[live], smp.logp[live], adv[live]  # (B'', C), (B'', C), (B'',)
        b_ref_logp = None
        if ref_model is not None and len(live):
            with torch.no_grad():
                b_ref_logp = logprobs(ref_model, b_ids, b_mask, cfg.temperature)[:, P:]  # (B'', C)

        # --- update: mu gradient steps on the batch, reusing the old log-probs ---
        stats = {"loss": [], "clip_frac": [], "kl_ref": [], "kl_old": []}
        model.train()
        for _ in range(cfg.iterations if len(rows) else 0):  # nothing kept: no update this step
            optimizer.zero_grad(set_to_none=True)
            if len(live):
                logp = logprobs(model, b_ids, b_mask, cfg.temperature)[:, P:]  # (B'', C)
                loss = share * grpo_loss(
                    logp,
                    b_old_logp,
                    b_adv,
                    b_cmask,
                    b_ref_logp,
                    cfg.beta,
                    cfg.clip_low,
                    cfg.clip_high,
                    cfg.loss_agg,
                    max_new,
                )
                loss.backward()
            else:  # every advantage is 0: a zero gradient, on which AdamW still applies its momentum
                for p in model.parameters():
                    p.grad = torch.zeros_like(p)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            if not len(live):
                stats["loss"].append(0.0)
                continue
            with torch.no_grad():
                stats["loss"].append(loss.item())
                frac = clip_fraction(logp, b_old_logp, cfg.clip_low, cfg.clip_high)  # (B'', C)
                stats["clip_frac"].append(aggregate(frac, b_cmask, "token-mean").item())
                stats["kl_old"].append(aggregate(kl(b_old_logp, logp, "k3"), b_cmask, "token-mean").item())
                if b_ref_logp is not None:
                    stats["kl_ref"].append(aggregate(kl(logp, b_ref_logp, "k3"), b_cmask, "token-mean").item())
        model.eval()
        t2 = time.perf_counter()

        # --- log ---
        cmask = smp.completion_mask
        lengths, right = cmask.sum(1).float().cpu(), values["accuracy"] > 0  # (B,), (B,)
        row = {
            "step": step + 1,
            "reward": rew.mean().item(),
            **{f"reward_{name}": v.mean().item() for name, v in values.items()},
            "accuracy": values["accuracy"].mean().item(),
            "format_rate": values["format"].mean().item(),
            "length": lengths.mean().item(),  # completion tokens, eos included
            "length_correct": lengths[right].mean().item() if right.any() else math.nan,
            "length_wrong": lengths[~right].mean().item() if not right.all() else math.nan,
            "truncated": smp.truncated.float().mean().item(),
            "entropy": -(smp.logp.sum() / cmask.sum()).item(),  # sample estimate of the per-token entropy at T
            "zero_var_groups": zero_var.float().mean().item(),
            "rows_trained": float(len(rows)),  # rows in the loss
            "rows_computed": float(len(live)),  # rows through the forward and backward passes
            "sample_s": t1 - t0,
            "train_s": t2 - t1,
            **{k: sum(v) / len(v) if v else math.nan for k, v in stats.items()},
        }
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            row.update({k: v for k, v in evaluation(step + 1).items() if k != "step"})
        history.log(**row)
        bar.set_postfix({"acc": f"{row['accuracy']:.2f}", "len": f"{row['length']:.0f}"}, refresh=False)
        if out is not None and ((cfg.save_every and (step + 1) % cfg.save_every == 0) or step + 1 == cfg.steps):
            save_checkpoint(out, model, tokenizer, optimizer, step + 1, history, evals, cfg)
    bar.close()
    return GRPOResult(model=model, tokenizer=tokenizer, history=history, evals=evals, config=cfg)
