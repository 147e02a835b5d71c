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
The rows that remain go through the model in chunks of similar completion length (``length_chunks``), each cut to
its longest completion, so that the padding after short completions is never computed, and a row that repeats
another (the same prompt and completion, as a policy that has found an answer writes often) is computed once.

Under ``torchrun`` (``minirl.lm.distributed``) each of W processes takes N / W prompts with their whole groups and
samples its own completions; the rewards are gathered, so group statistics and the log are those of all W * N groups,
and each process scales its loss by W times its part of the global denominator, so that DDP's average of the W
gradients is the gradient of the loss over every process's rows.

Shapes
    N   prompts per step (``prompts_per_step``)
    G   completions per prompt (``group_size``); B = N * G rows, each group's G rows consecutive
    P   prompt tokens (left-padded), C completion tokens (at most ``max_new_tokens``), L = P + C
"""

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from minirl import _validate
from minirl.course import use_threads
from minirl.history import History
from minirl.lm import decoding, distributed, runs
from minirl.lm import rewards as rw
from minirl.lm.config import GRPOConfig
from minirl.lm.evaluation import evaluate
from minirl.lm.model import load
from minirl.lm.sampling import completion_logprobs, sample
from minirl.lm.sft import SCHEDULES, lr_at
from minirl.lm.tasks import TASKS, Problem, get_task, split_of, token_budget
from minirl.lm.tokenizer import render_prompt
from minirl.losses import LOSS_AGGS, aggregate, clip_fraction, kl, ppo_clip_loss
from minirl.returns import GROUP_SCALES, group_advantages


@dataclass
class GRPOResult:
    """``model`` (trained), ``tokenizer``, ``history`` (one row per step; held-out scores on evaluation steps) and
    ``evals`` (one dict per evaluation, step 0 included)."""

    model: object
    tokenizer: object
    history: History
    evals: list[dict] = field(default_factory=list)
    config: GRPOConfig | None = None


__all__ = ["GRPOConfig", "GRPOResult", "check_config", "denominator_share", "draw_problems", "grpo_loss",
           "length_chunks", "reward_parts", "train"]  # fmt: skip

CHUNK_ROWS = 32  # rows per training forward (``length_chunks``)

CAUSES = (
    "a learning rate too high (lr), a reward that is NaN, inf or huge, a starting checkpoint with non-finite "
    "weights, or max_grad_norm too large to tame a bad batch. Lower lr, check the reward function, or resume from "
    "the last checkpoint (it holds finite weights only)"
)


def check_config(cfg: GRPOConfig) -> GRPOConfig:
    """Check every field of ``cfg`` (type and range) before any work; raise naming the field and what it allows."""
    positive = ("steps", "prompts_per_step", "group_size", "temperature", "iterations", "lr", "max_grad_norm")
    nonneg = ("max_new_tokens", "clip_high", "beta", "weight_decay", "eval_every", "save_every", "threads", "seed",
              "warmup_steps")  # fmt: skip
    choices = {"task": tuple(TASKS), "scale": GROUP_SCALES, "loss_agg": LOSS_AGGS, "schedule": SCHEDULES}
    _validate.check_config(cfg, positive + ("eval_n",), nonneg, unit=("clip_low",), choices=choices)
    if cfg.group_size < 2:
        raise ValueError(
            f"group_size must be an int >= 2, got {cfg.group_size!r}: GRPO's baseline is the mean reward of the other "
            "completions to the same prompt, so a group of one always has advantage 0 and nothing is learned"
        )
    if cfg.resume and not cfg.out:
        raise ValueError("resume=True needs out, the folder that holds the checkpoint to continue from")
    return cfg


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


def length_chunks(cmask: torch.Tensor, rows: int) -> list[torch.Tensor]:
    """The rows of a batch sorted by completion length and cut into chunks of about ``rows``: (B_j,) row indices each.

    Args:
        cmask: (B, C) completion mask, True from column 0 to each row's eos.

    A chunk then needs only as many columns as its longest completion; the rest of the batch's padding is never
    computed.
    """
    order = cmask.sum(dim=1).argsort(stable=True)  # (B,) shortest first
    return list(order.tensor_split(max(1, math.ceil(len(order) / rows))))


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
        "consistency": (rw.consistency_reward, cfg.consistency_weight),
    }
    if reward_fn is not None:
        parts["user"] = (reward_fn, 1.0)
    return parts


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
    With ``cfg.out`` and ``cfg.resume``, training continues from the checkpoint there. Under ``torchrun``,
    ``reward_fn`` and ``on_batch`` see the rows of their own process.
    """
    check_config(cfg)
    world = distributed.init(cfg.device)
    mine = distributed.shard(cfg.prompts_per_step, "prompts_per_step")  # this process's prompts, groups kept whole
    # claim the output folder and read its checkpoint before any work: a refusal costs nothing
    with distributed.main_first():  # rank 0 first: it may repair a checkpoint that a crash left half-written
        out, saved, resumes = runs.start_run(cfg, "grpo")
    use_threads(cfg.threads)
    task = get_task(cfg.task)
    G = cfg.group_size
    start, history, evals = 0, History(), []
    model, tokenizer = load(saved.model_path() if saved else cfg.model, device=distributed.device(cfg.device))
    device = next(model.parameters()).device
    ref_model = load(cfg.model, device=device)[0].requires_grad_(False) if cfg.beta > 0 else None  # frozen pi_ref
    ddp_model = distributed.wrap(model)  # the training forward only: DDP averages the gradients over processes
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    if saved is not None:
        saved.load_optimizer("policy", optimizer)
        start, history.rows, evals = saved.step, saved.state["rows"], saved.state["evals"]
    parts = reward_parts(cfg, task, reward_fn)
    max_new = cfg.max_new_tokens or token_budget(task, tokenizer)  # in this tokenizer's tokens

    def evaluation(step: int) -> dict:  # every process scores the same problems: the others would wait anyway
        ev = evaluate(model, tokenizer, task, n=cfg.eval_n, k=0, chat=cfg.chat)
        evals.append({"step": step, "heldout_accuracy": ev.accuracy, "heldout_format": ev.format_rate,
                      "heldout_digit_share": ev.digit_share})  # fmt: skip
        return evals[-1]

    if cfg.eval_every and not evals:
        evaluation(0)
    show = progress and distributed.is_main()
    bar = tqdm(range(start, cfg.steps), desc="grpo", disable=not show, initial=start, total=cfg.steps)
    for step in bar:
        # --- rollout: G completions per prompt from the old policy, at temperature T ---
        t0 = time.perf_counter()
        problems = draw_problems(task, cfg.prompts_per_step, cfg.seed, step)[mine]  # the same N everywhere; a share
        prompts = [p.prompt for p in problems for _ in range(G)]  # (B,) each group's G rows consecutive
        answers = [p.answer for p in problems for _ in range(G)]
        inputs = [render_prompt(tokenizer, p, cfg.chat) for p in prompts]  # what the model reads: chat template or not
        seed = cfg.seed * 1_000_003 + step + 1_000_000_007 * distributed.rank()  # each process its own completions
        generator = torch.Generator(device).manual_seed(seed)
        smp = sample(model, tokenizer, inputs, max_new, temperature=cfg.temperature, generator=generator)
        try:
            rew, values = rw.score(parts, prompts, smp.text, answers)  # (B,), {name: (B,)}; each part checked finite
        except ValueError as err:
            raise ValueError(f"step {step + 1}: {err}") from err
        t1 = time.perf_counter()
        if on_batch is not None:
            on_batch(step + 1, prompts, smp.text, {"reward": rew, **values})

        # --- advantages: compare each completion with its group ---
        all_rew = distributed.gather(rew)  # (W * B,) every process's rewards, in rank order
        all_values = {name: distributed.gather(v) for name, v in values.items()}  # {name: (W * B,)}, for the log
        mine_rows = slice(mine.start * G, mine.stop * G)  # this process's rows of the gathered batch
        adv = group_advantages(all_rew, G, cfg.scale)[mine_rows].to(device)  # (B,); "batch" scale: std of all
        grouped = all_rew.view(-1, G)  # (W * N, G)
        all_zero_var = (grouped == grouped[:, :1]).all(dim=1)  # (W * N,) all G rewards equal: A_i = 0 for the group
        zero_var = all_zero_var[mine]  # (N,)
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
        # Across processes: DDP averages the W gradients, so each process scales its loss by W times its part of the
        # global denominator (its kept rows, or their tokens for "token-mean"): the average is then the gradient of
        # the loss over the rows of all processes. With one process the factor is exactly 1.
        here = float(smp.completion_mask[rows].sum()) if cfg.loss_agg == "token-mean" else float(len(rows))
        # Rows that repeat another row, prompt and completion, have the same log-probs: the model computes each
        # distinct row once (``completion_logprobs``). A policy that has found an answer writes it again and again:
        # in the first 30 steps of the benchmark against TRL a fifth of the rows with signal were copies.
        sampled = smp.prompt_ids, smp.prompt_mask, smp.completion_ids, smp.completion_mask  # (B, P | C) each
        distinct, twin = decoding.distinct_rows(*(x[live] for x in sampled))  # (U,) one row of each; (B'',) which
        counts = torch.tensor([len(rows), len(live), len(distinct), here], dtype=torch.float64)
        n_rows, n_live, n_distinct, total = distributed.all_sum(counts).tolist()  # over all processes
        share *= world * here / total if here else 0.0
        idle = n_live > 0 and not len(live)  # others train, this one has no row with signal
        if idle:  # DDP needs a backward pass from every process: one row, at weight 0, adds a zero gradient
            live, share = torch.zeros(1, dtype=torch.long, device=device), 0.0
            distinct, twin = torch.zeros_like(live), torch.zeros_like(live)
        b_pids, b_pmask, b_cids, b_cmask = (x[live] for x in sampled)  # (B'', P), (B'', P), (B'', C), (B'', C)
        b_old_logp, b_adv = smp.logp[live], adv[live]  # (B'', C), (B'',)
        # The rows go through the model in chunks of similar completion length, each cut to its own longest
        # completion: the padding after short completions is never computed (on a 128-row batch of addition here,
        # 13% of the tokens and 17% of the time of a forward and backward pass). The loss sums over rows (or tokens)
        # and divides by the whole batch's count, so each chunk's loss is scaled by its share of that count: the
        # chunks' losses add up to the batch's loss, and their backward passes to its gradient. The chunks are cut
        # from the distinct rows, each with all its copies, so that a chunk holds about CHUNK_ROWS rows to compute.
        # Within a chunk, each distinct prompt goes through the model once: a group's rows share its prompt.
        chunks = []  # per chunk: (rows, completion columns, its rows' tokens, share of the denominator, log pi_ref)
        for d_j in length_chunks(b_cmask[distinct], CHUNK_ROWS) if len(live) else []:
            in_j = torch.isin(twin, d_j)  # (B'',) the rows of these distinct ones, copies included
            rows_j = in_j.nonzero().flatten()  # (B_j,)
            C_j = int(b_cmask[rows_j].sum(dim=1).max())
            rows_data = b_pids[rows_j], b_pmask[rows_j], b_cids[rows_j, :C_j], b_cmask[rows_j, :C_j]  # (B_j, P | C_j)
            ref_j = None
            if ref_model is not None:
                with torch.no_grad(), distributed.autocast(device):
                    ref_j = completion_logprobs(ref_model, *rows_data, cfg.temperature)  # (B_j, C_j)
            chunks.append((rows_j, C_j, rows_data, denominator_share(b_cmask, in_j, cfg.loss_agg), ref_j))

        # --- update: mu gradient steps on the batch, reusing the old log-probs ---
        lr = lr_at(step, cfg)  # the schedule's lr at this step: cfg.lr throughout under "constant" without warm-up
        for group in optimizer.param_groups:
            group["lr"] = lr
        sums = []  # per iteration: the loss / W, then clip, kl_old and kl_ref summed over this process's tokens, tokens
        model.train()
        for _ in range(cfg.iterations if n_rows else 0):  # nothing kept by any process: no update this step
            optimizer.zero_grad(set_to_none=True)
            tally = torch.zeros(5, device=device)  # the loss / W, then clip, kl_old, kl_ref summed over tokens, tokens
            for j, (rows_j, C_j, rows_data, share_j, ref_j) in enumerate(chunks):
                with distributed.no_sync(ddp_model, skip=j < len(chunks) - 1):  # DDP averages after the last chunk
                    with distributed.autocast(device):  # bf16 on a GPU: ratios start at 1 only up to its rounding
                        logp = completion_logprobs(ddp_model, *rows_data, cfg.temperature)  # (B_j, C_j)
                    _validate.check_finite(step + 1, CAUSES, **{"the policy's log-probs": logp})
                    old_j, cmask_j = b_old_logp[rows_j, :C_j], rows_data[-1]  # (B_j, C_j) each
                    loss = (share * share_j) * grpo_loss(
                        logp,
                        old_j,
                        b_adv[rows_j],
                        cmask_j,
                        ref_j,
                        cfg.beta,
                        cfg.clip_low,
                        cfg.clip_high,
                        cfg.loss_agg,
                        max_new,
                    )
                    _validate.check_finite(step + 1, CAUSES, loss=loss)
                    loss.backward()
                with torch.no_grad():  # summed here and over processes at the log: no device sync per chunk
                    m = cmask_j.to(logp.dtype) * (not idle)  # (B_j, C_j); the weight-0 row of an idle process counts 0
                    frac = clip_fraction(logp, old_j, cfg.clip_low, cfg.clip_high)  # (B_j, C_j)
                    ref_kl = kl(logp, ref_j, "k3") if ref_j is not None else torch.zeros_like(logp)  # (B_j, C_j)
                    old_kl = kl(old_j, logp, "k3")  # (B_j, C_j)
                    tally += torch.stack([loss.detach() / world, *((x * m).sum() for x in (frac, old_kl, ref_kl, m))])
            if not len(live):  # every advantage of every process is 0: a zero gradient, on which AdamW still applies
                for p in model.parameters():  # its momentum
                    p.grad = torch.zeros_like(p)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)  # before clipping
            _validate.check_finite(step + 1, CAUSES, gradient_norm=grad_norm)
            optimizer.step()
            _validate.check_finite_parameters(model, step + 1, CAUSES)  # so no checkpoint ever holds NaN or inf
            if len(live):
                sums.append(tally)
        model.eval()
        t2 = time.perf_counter()

        # --- log: over the rows of every process ---
        stats = {"loss": [0.0] * cfg.iterations if n_rows else [], "clip_frac": [], "kl_old": [], "kl_ref": []}
        if sums:
            tot = distributed.all_sum(torch.stack(sums)).cpu()  # (iterations, 5)
            stats = {"loss": tot[:, 0].tolist(), "clip_frac": (tot[:, 1] / tot[:, 4]).tolist(),
                     "kl_old": (tot[:, 2] / tot[:, 4]).tolist(),
                     "kl_ref": (tot[:, 3] / tot[:, 4]).tolist() if ref_model is not None else []}  # fmt: skip
        cmask = smp.completion_mask
        lengths, right = distributed.gather(cmask.sum(1).float().cpu()), all_values["accuracy"] > 0  # (W * B,) each
        row = {
            "step": step + 1,
            "reward": all_rew.mean().item(),
            **{f"reward_{name}": v.mean().item() for name, v in all_values.items()},
            "accuracy": all_values["accuracy"].mean().item(),
            "format_rate": all_values["format"].mean().item(),
            "length": lengths.mean().item(),  # completion tokens, eos included
            "length_correct": lengths[right].mean().item() if right.any() else math.nan,
            "length_wrong": lengths[~right].mean().item() if not right.all() else math.nan,
            "truncated": distributed.gather(smp.truncated.float()).mean().item(),
            # sample estimate of the per-token entropy at T
            "entropy": -(distributed.all_sum(smp.logp.sum()) / distributed.all_sum(cmask.sum())).item(),
            "zero_var_groups": all_zero_var.float().mean().item(),
            "rows_trained": n_rows,  # rows in the loss
            "rows_computed": n_live,  # rows through the forward and backward passes, copies included
            "rows_distinct": n_distinct,  # the distinct ones among them: what the model computes
            "lr": lr,
            "sample_s": t1 - t0,
            "train_s": t2 - t1,
            **{k: sum(v) / len(v) if v else math.nan for k, v in stats.items()},
        }
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            row.update({k: v for k, v in evaluation(step + 1).items() if k != "step"})
        history.log(**row)
        bar.set_postfix({"acc": f"{row['accuracy']:.2f}", "len": f"{row['length']:.0f}"}, refresh=False)
        saving = (cfg.save_every and (step + 1) % cfg.save_every == 0) or step + 1 == cfg.steps
        if out is not None and saving and distributed.is_main():  # one writer: every process holds the same state
            state = {"step": step + 1, "rows": history.rows, "evals": evals, "resumes": resumes}
            runs.save_run(out, {"model": model}, tokenizer, {"policy": optimizer}, state, cfg, "grpo")
    bar.close()
    return GRPOResult(model=model, tokenizer=tokenizer, history=history, evals=evals, config=cfg)
