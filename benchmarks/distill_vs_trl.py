"""minirl's sequence-level distillation against TRL's GKDTrainer: same verified traces, same student, same settings.

    pip install -e ".[bench]"
    python benchmarks/distill_vs_trl.py                       # 3 seeds x 3 arms, 150 steps each, ~7 minutes
    python benchmarks/distill_vs_trl.py --seeds 0 --steps 60

The traces are made once, by ``minirl.lm.pipeline.sft_on_traces`` itself: it is run with the distillation learning
test's ``DistillConfig`` (300 training problems of "addition", k=2 completions each from the teacher
``tiny-adder-r1`` at temperature 1, verified ones kept, at most one per problem, seed 0) and with ``sft.train`` stubbed
out, so that the benchmark gets both the ``Traces`` it sampled and the ``SFTConfig`` it built (150 steps of 32, lr 1e-3,
20 warm-up steps, cosine to lr/10, AdamW weight decay 0.01, gradient norm clipped to 1). Three arms then train the
student ``tiny-student`` (0.11M parameters, the teacher's character tokenizer) from the same weights, once per seed:

    minirl SFT       ``minirl.lm.sft.train`` on the traces: cross-entropy on the sampled completion tokens (the one-hot
                     target), what ``sft_on_traces`` / ``minirl lm distill`` does.
    GKD lmbda=0      TRL's ``GKDTrainer`` on the same traces (off-policy): at each completion token, the generalized
                     JSD between the teacher's and the student's next-token distributions over the whole vocabulary
                     (Agarwal et al. 2024 Eq. 1); beta=0, which in TRL is the forward KL(teacher || student).
    GKD lmbda=0.5    the same, but each step is, with probability 1/2, replaced by the student's own samples for the
                     batch's prompts (temperature 1), scored by the teacher's distributions (on-policy distillation).

The seed moves what each side draws itself: minibatch order (both), and for GKD the on-policy coin and the student's
samples. TRL gets the traces as the token ids minirl trains on (``sft.encode``: bos + prompt + completion + eos) with a
``completion_mask``; its ChatML collator accepts those without a chat template, and the ids and loss positions it
collates are asserted equal to minirl's. ``assert_same_hyperparameters`` reads every knob back from TRL's trainer
against minirl's ``SFTConfig``; the optimizers the two loops build are compared group by group, the learning rate of
every step is recorded on both sides and compared, and TRL's loss on a batch is checked against the forward KL computed
here from the two models' logits. TRL's beta convention is checked on its own loss function.

Both sides run in this process at one torch thread, float32, CPU; the arm that goes first rotates with the seed.
ms/step is the training loop's wall time over its optimizer steps (minirl: the call to ``sft.train``; TRL:
``on_train_begin`` to ``on_train_end``). Held-out accuracy is ``minirl.lm.evaluate(model, tok, task, n=200, k=0)``
(greedy) for every arm. What differs and is not a hyperparameter is listed in ``DIFFERENCES``.

Writes ``benchmarks/results/distill_vs_trl.md``.
"""

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
import warnings
from unittest import mock

import torch
from _stamp import RESULTS, stamp
from datasets import Dataset
from reward_model_vs_trl import OPTIMIZER_KEYS, catch_adamw
from transformers import PrinterCallback, TrainerCallback

from minirl.lm import evaluate, load, pipeline, sft
from minirl.lm.sampling import positions
from minirl.lm.tasks import get_task

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # "trl.experimental may change": we know
warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecations inside TRL's generate call
from trl.experimental.gkd import GKDConfig, GKDTrainer  # noqa: E402

ARMS = ("minirl SFT", "GKD lmbda=0", "GKD lmbda=0.5")
LMBDA = {"GKD lmbda=0": 0.0, "GKD lmbda=0.5": 0.5}
NORM_PARAMETERS = 320  # the student's 5 RMSNorm weight vectors of 64, which transformers does not decay
MIN_LR_RATE = 0.1  # minirl's cosine ends at lr / 10 (sft.lr_at); TRL's "cosine_with_min_lr" with this ratio

DIFFERENCES = [
    "Objective (the subject of the comparison, not an accident): minirl's SFT target at each completion token is "
    "the token the teacher sampled (one-hot), from traces that passed the verifier; GKD's is the teacher's whole "
    "next-token distribution at that position, which is not conditioned on the trace being right. GKD runs a teacher "
    "forward pass (0.87M parameters, 7.6x the student) on every batch; SFT never touches the teacher after sampling.",
    "Warm-up: transformers' schedule gives step k (from 0) lr x k/20, minirl's lr x (k+1)/20, so TRL's first step "
    "has lr 0 and its warm-up runs one step behind; from step 20 on both follow the same cosine to lr/10 (every "
    "step's lr recorded on both sides and asserted).",
    "Weight decay: transformers exempts the RMSNorm weights (5 vectors, 320 of the student's 113,472 parameters) "
    "from decay; minirl's AdamW decays every parameter by 0.01. Same AdamW otherwise (groups compared as built, "
    "`optim=adamw_torch`, not TRL's default fused kernel).",
    "Minibatches: both draw 32 traces per step without replacement from a reshuffled pass over the traces. minirl's "
    "batch continues into the next pass when one runs out; TRL's dataloader drops each pass's last partial batch "
    "(`dataloader_drop_last=True`, so that every step has 32 rows): the traces left over (number of traces mod 32), "
    "different ones each pass. Same rows per step and in all; the order differs, so compare medians over seeds, not "
    "seed by seed.",
    "Positions: minirl passes position ids that skip the left padding; TRL's collator left-pads and passes none, so a "
    "padded row's positions start at its padding width. The model has only rotary position embeddings, which depend "
    "on relative positions alone, so the logits agree to rounding (TRL's loss on a batch checked against the one "
    "computed here with minirl's positions).",
    "Data format: no chat template. TRL's `DataCollatorForChatML` takes pre-tokenized `input_ids` with a "
    "`completion_mask` (labels -100 up to the first completion token); it still requires a `prompt` column (without "
    "one it looks for `messages`), which it then does not use. The dataset is not re-tokenized by TRL "
    "(`skip_prepare_dataset`).",
    "Loss normaliser on on-policy steps: TRL divides the summed JSD by `num_items_in_batch`, which the Trainer counts "
    "from the collated traces' labels before `training_step` swaps in the student's samples, so an on-policy step is "
    "weighted by (tokens the student generated) / (tokens of the traces it replaced); the mean of that ratio is in "
    "the table. On off-policy steps it is the trace's completion tokens, minirl's normaliser (asserted).",
    "On-policy share: TRL flips `random.random() <= lmbda` once per optimizer step, so lmbda=0.5 gives a binomial "
    "number of on-policy steps (counted in the table), not exactly half. The student samples with transformers' "
    "`generate` (KV cache, temperature 1, top-k 0, top-p 1, up to the task's 50 new tokens, stop at eos).",
    "TRL's defaults that change the math or the speed on CPU and were switched off: `bf16=True` (bf16 autocast) and "
    "`gradient_checkpointing=True` (a second forward pass in every backward), both from TRL's `SFTConfig`, which "
    "`GKDConfig` extends; left on, the two together made an off-policy step about 3.5x slower in a probe here. "
    "`disable_dropout=True` is left on: the student has no dropout anyway.",
    "Step overheads: TRL's loop holds the Trainer machinery (dataloader and collator run per step, callbacks, metric "
    "gathering, logging every 10 steps, `empty_cache`); minirl's loop tokenizes once before training, trims columns "
    "that are padding in every row, and checks the loss, gradient and parameters for NaN every step.",
]


class Clock(TrainerCallback):
    """Wall time of TRL's training loop, the optimizer it built, the lr of every step and the thread count."""

    def __init__(self) -> None:
        self.begin = self.end = 0.0
        self.optimizer, self.threads, self.lrs = None, 0, []

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        self.optimizer = getattr(optimizer, "optimizer", optimizer)  # the torch optimizer inside accelerate's wrapper
        self.threads = torch.get_num_threads()
        self.begin = time.perf_counter()

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        self.lrs.append(optimizer.param_groups[0]["lr"])  # the lr this step's update will use

    def on_train_end(self, args, state, control, **kwargs):
        self.end = time.perf_counter()


class LossProbe:
    """Records, for every ``compute_loss`` call of a GKDTrainer: whether the batch was the student's own samples,
    the completion tokens scored, and the normaliser (``num_items_in_batch``) the Trainer passed."""

    def __init__(self, trainer: GKDTrainer) -> None:
        self.rows, self._generated = [], False
        compute_loss, generate = trainer.compute_loss, trainer.generate_on_policy_outputs

        def generate_and_flag(*args, **kwargs):
            self._generated = True
            return generate(*args, **kwargs)

        def compute_and_record(model, inputs, return_outputs=False, num_items_in_batch=None):
            scored = int(inputs["labels"][:, 1:].ne(-100).sum())  # the positions the JSD is summed over
            norm = None if num_items_in_batch is None else int(num_items_in_batch)
            self.rows.append({"on_policy": self._generated, "scored": scored, "normaliser": norm})
            self._generated = False
            return compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

        trainer.generate_on_policy_outputs = generate_and_flag  # called as self.generate_on_policy_outputs(...)
        trainer.compute_loss = compute_and_record


class _Captured(Exception):
    pass


def traces_and_sft_config(cfg: pipeline.DistillConfig) -> tuple[pipeline.Traces, sft.SFTConfig]:
    """Run ``sft_on_traces(cfg)`` up to its call of ``sft.train`` and return what it would train on, with what."""
    seen = {}

    def stop_at_train(model, tokenizer, examples, sft_cfg, **kwargs):
        seen.update(examples=examples, cfg=sft_cfg)
        raise _Captured

    original = pipeline.rejection_sample

    def keep_traces(*args, **kwargs):
        seen["traces"] = original(*args, **kwargs)
        return seen["traces"]

    with mock.patch.object(pipeline, "rejection_sample", keep_traces), mock.patch.object(sft, "train", stop_at_train):
        try:
            pipeline.sft_on_traces(cfg)
        except _Captured:
            pass
    assert seen["examples"] is seen["traces"].examples, "sft_on_traces trained on something other than its traces"
    return seen["traces"], seen["cfg"]


def trace_dataset(tokenizer, examples) -> Dataset:
    """The traces as the token ids minirl trains on, in the pre-tokenized form TRL's ChatML collator accepts."""
    ids, mask, loss_mask = sft.encode(tokenizer, examples)  # (N, L) each, left-padded
    rows = [
        {"prompt": p, "input_ids": ids[i][mask[i]].tolist(), "completion_mask": loss_mask[i][mask[i]].long().tolist()}
        for i, (p, _) in enumerate(examples)
    ]
    return Dataset.from_list(rows)


def gkd_config(sft_cfg: sft.SFTConfig, lmbda: float, beta: float, seed: int, out_dir: str, task) -> GKDConfig:
    """TRL's side with minirl's values."""
    return GKDConfig(
        output_dir=out_dir,
        max_steps=sft_cfg.steps,
        per_device_train_batch_size=sft_cfg.batch_size,
        gradient_accumulation_steps=1,
        dataloader_drop_last=True,  # every step 32 rows, as minirl's
        learning_rate=sft_cfg.lr,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": MIN_LR_RATE},
        warmup_steps=sft_cfg.warmup_steps,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=sft_cfg.weight_decay,
        max_grad_norm=sft_cfg.grad_clip,
        lmbda=lmbda,
        beta=beta,
        seq_kd=False,  # the teacher's sequences are the dataset: sampled once and verified, not resampled per step
        temperature=1.0,  # the student's on-policy sampling; the loss itself is always at temperature 1 in TRL 1.16
        max_new_tokens=task.max_new_tokens,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        seed=seed,
    )


def assert_same_hyperparameters(trainer: GKDTrainer, sft_cfg: sft.SFTConfig, n_traces: int, task, lmbda, beta):
    """Every knob that changes the math, read back from TRL's trainer against minirl's ``SFTConfig``."""
    args, gen = trainer.args, trainer.generation_config
    adamw = torch.optim.AdamW(torch.nn.Linear(1, 1).parameters()).defaults  # what sft.train's AdamW(...) leaves as is
    longest = max(len(r) for r in trainer.train_dataset["input_ids"])
    pairs = {
        "optimizer steps": (args.max_steps, sft_cfg.steps),
        "rows per optimizer step": (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            sft_cfg.batch_size,
        ),
        "every step a full batch": (args.dataloader_drop_last or n_traces % sft_cfg.batch_size == 0, True),
        "traces (none filtered)": (len(trainer.train_dataset), n_traces),
        "no truncation": (longest <= trainer.data_collator.max_length, True),
        "lr": (args.learning_rate, sft_cfg.lr),
        "schedule": (
            (args.lr_scheduler_type, args.lr_scheduler_kwargs, args.warmup_steps),
            ("cosine_with_min_lr", {"min_lr_rate": MIN_LR_RATE}, sft_cfg.warmup_steps),
        ),
        "minirl's schedule is the cosine to lr/10": (sft_cfg.schedule, "cosine"),
        "minirl's last lr is lr x min_lr_rate": (sft.lr_at(sft_cfg.steps, sft_cfg), sft_cfg.lr * MIN_LR_RATE),
        "optimizer": (args.optim, "adamw_torch"),
        "adam betas": ((args.adam_beta1, args.adam_beta2), adamw["betas"]),
        "adam eps": (args.adam_epsilon, adamw["eps"]),
        "weight decay": (args.weight_decay, sft_cfg.weight_decay),
        "max grad norm": (args.max_grad_norm, sft_cfg.grad_clip),
        "lmbda (on-policy share)": (trainer.lmbda, lmbda),
        "beta": (trainer.beta, beta),
        "seq_kd (teacher resampled per step)": (trainer.seq_kd, False),
        "on-policy sampling": (
            (gen.temperature, gen.max_new_tokens, gen.top_k, gen.top_p, gen.eos_token_id),
            (1.0, task.max_new_tokens, 0, 1.0, trainer.processing_class.eos_token_id),
        ),
        "precision": ((args.bf16, args.fp16, trainer.model.dtype), (False, False, torch.float32)),
        "gradient checkpointing": (args.gradient_checkpointing, False),
        "packing": (args.packing, False),
        "liger kernel": (args.use_liger_kernel, False),
        "device": (trainer.accelerator.device.type, "cpu"),
    }
    mismatched = {k: v for k, v in pairs.items() if v[0] != v[1]}
    assert not mismatched, f"hyperparameters differ (TRL, minirl): {mismatched}"


def assert_same_tokens(trainer: GKDTrainer, tokenizer, examples) -> None:
    """TRL's collated batch of all traces is minirl's ``sft.encode``: the same ids, padding and loss positions."""
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(examples))])
    ids, mask, loss_mask = sft.encode(tokenizer, examples)  # (N, L)
    assert torch.equal(batch["input_ids"], ids) and torch.equal(batch["attention_mask"].bool(), mask), "ids differ"
    assert torch.equal(batch["labels"].ne(-100), loss_mask), "TRL's loss positions are not minirl's"


def kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dimension, from log-probabilities."""
    return (logp.exp() * (logp - logq)).sum(-1)


def assert_beta_convention() -> None:
    """In TRL's ``generalized_jsd_loss``, beta=0 is KL(teacher || student) (forward), beta=1 KL(student || teacher)
    (reverse); in between, the JSD tends to beta x forward KL as beta -> 0 and (1 - beta) x reverse KL as beta -> 1."""
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(1, 7, 104, generator=g, dtype=torch.float64) * 2, torch.randn(
        1, 7, 104, generator=g, dtype=torch.float64) * 2  # fmt: skip
    labels = torch.zeros(1, 7, dtype=torch.long)  # every position scored: the loss is the per-token mean
    logp_s, logp_t = student.log_softmax(-1), teacher.log_softmax(-1)
    forward, reverse = kl(logp_t, logp_s).mean().item(), kl(logp_s, logp_t).mean().item()

    def jsd(beta: float) -> float:
        return GKDTrainer.generalized_jsd_loss(student, teacher, labels=labels, beta=beta).item()

    assert abs(jsd(0.0) - forward) < 1e-9 and abs(jsd(1.0) - reverse) < 1e-9, "beta endpoints are not the two KLs"
    eps = 1e-6
    assert abs(jsd(eps) / eps - forward) < 1e-3 * forward and abs(jsd(1 - eps) / eps - reverse) < 1e-3 * reverse


def assert_loss_is_teacher_jsd(trainer: GKDTrainer, teacher, tokenizer, examples, beta: float) -> None:
    """TRL's loss on a batch of traces, against the per-token mean of the generalized JSD computed here from the two
    models' logits (minirl's encoding and position ids); at beta=0 that is the forward KL(teacher || student)."""
    ex = examples[: trainer.args.per_device_train_batch_size]
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(ex))])
    ids, mask, loss_mask = sft.encode(tokenizer, ex)  # (B, L)
    with torch.no_grad():
        theirs = trainer.compute_loss(trainer.model, batch).item()
        pos = positions(mask)
        logp_s = trainer.model(input_ids=ids, attention_mask=mask.long(), position_ids=pos).logits.log_softmax(-1)
        logp_t = teacher(input_ids=ids, attention_mask=mask.long(), position_ids=pos).logits.log_softmax(-1)
    logp_s, logp_t = logp_s[:, :-1][loss_mask[:, 1:]], logp_t[:, :-1][loss_mask[:, 1:]]  # (N, V): scored positions
    if beta == 0:
        per_token = kl(logp_t, logp_s)
    elif beta == 1:
        per_token = kl(logp_s, logp_t)
    else:  # Agarwal et al. 2024 Eq. 1 with M = beta teacher + (1 - beta) student
        b = torch.tensor(beta)
        m = torch.logsumexp(torch.stack([logp_t + b.log(), logp_s + torch.log1p(-b)]), dim=0)
        per_token = beta * kl(logp_t, m) + (1 - beta) * kl(logp_s, m)
    ours = per_token.mean().item()
    assert abs(theirs - ours) <= 1e-4 * abs(ours) + 1e-6, f"TRL's loss {theirs:.6f}, the teacher's JSD here {ours:.6f}"


def assert_same_optimizer(clock: Clock, trainer: GKDTrainer, minirl_optimizer: torch.optim.Optimizer) -> None:
    """TRL's AdamW has minirl's settings in each group; its no-decay group holds exactly the norm weights."""
    assert isinstance(clock.optimizer, torch.optim.AdamW), f"TRL built {type(clock.optimizer).__name__}"
    ours = {k: minirl_optimizer.param_groups[0].get(k) for k in OPTIMIZER_KEYS if k != "lr"}  # lr: the schedule's
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    for i, group in enumerate(clock.optimizer.param_groups):
        theirs = {k: group.get(k) for k in OPTIMIZER_KEYS if k != "lr"}
        decayed = theirs.pop("weight_decay")
        assert theirs == {k: v for k, v in ours.items() if k != "weight_decay"}, f"group {i}: {theirs} vs {ours}"
        in_group = [names[id(p)] for p in group["params"]]
        if decayed == 0:
            assert all("norm" in n for n in in_group), f"TRL exempts more than the norm weights: {in_group}"
            exempt = sum(p.numel() for p in group["params"])
            assert exempt == NORM_PARAMETERS, f"TRL exempts {exempt} parameters from weight decay"
        else:
            assert decayed == ours["weight_decay"] and not any("norm" in n for n in in_group), group
    assert sum(len(g["params"]) for g in clock.optimizer.param_groups) == len(names), "TRL's optimizer misses params"
    assert clock.threads == torch.get_num_threads() == 1, f"TRL trained at {clock.threads} threads"


def assert_same_schedule(trl_lrs: list, minirl_lrs: list, warmup: int) -> None:
    """Every step's lr: equal from the end of warm-up; during it TRL's step k is minirl's step k - 1 (0 at k = 0)."""
    assert len(trl_lrs) == len(minirl_lrs), (len(trl_lrs), len(minirl_lrs))
    shifted = [0.0] + minirl_lrs[: warmup - 1] + minirl_lrs[warmup:]
    for k, (a, b) in enumerate(zip(trl_lrs, shifted)):
        assert abs(a - b) <= 1e-9 * max(abs(b), 1e-12), f"step {k}: TRL lr {a}, minirl {b}"


_START: dict = {}


def fresh_student():
    """The student at its committed weights, asserted equal for every arm."""
    student, _ = load(pipeline.STUDENT, device="cpu")
    if not _START:
        _START.update({k: v.clone() for k, v in student.state_dict().items()})
    assert all(torch.equal(v, _START[k]) for k, v in student.state_dict().items()), "the student's start differs"
    return student


def run_minirl(sft_cfg: sft.SFTConfig, seed: int, tokenizer, traces, task, eval_n: int) -> dict:
    t0 = time.perf_counter()
    student = fresh_student()
    caught = []
    t1 = time.perf_counter()
    with catch_adamw(caught):
        result = sft.train(student, tokenizer, traces.examples, dataclasses.replace(sft_cfg, seed=seed))
    loop = time.perf_counter() - t1
    assert len(caught) == 1, f"sft.train built {len(caught)} AdamW optimizers"
    after = evaluate(student, tokenizer, task, n=eval_n, k=0).accuracy
    steps = len(result.history)
    return {"arm": "minirl SFT", "seed": seed, "steps": steps, "on_policy": 0, "ratios": [], "loop_s": loop,
            "step_s": loop / steps, "setup_s": t1 - t0, "wall_s": time.perf_counter() - t0, "after": after,
            "optimizer": caught[0], "lrs": [row["lr"] for row in result.history]}  # fmt: skip


def run_gkd(arm: str, beta: float, sft_cfg, seed: int, tokenizer, traces, task, eval_n, minirl) -> dict:
    lmbda, clock = LMBDA[arm], Clock()
    with tempfile.TemporaryDirectory() as out_dir:
        t0 = time.perf_counter()
        student = fresh_student()
        teacher, _ = load(pipeline.TEACHER, device="cpu")
        trainer = GKDTrainer(
            model=student,
            teacher_model=teacher,
            args=gkd_config(sft_cfg, lmbda, beta, seed, out_dir, task),
            train_dataset=trace_dataset(tokenizer, traces.examples),
            processing_class=tokenizer,
            callbacks=[clock],
        )
        trainer.remove_callback(PrinterCallback)  # keeps its logging, prints nothing
        assert trainer.model is student, "TRL trains a copy: the evaluation would not see it"
        assert_same_hyperparameters(trainer, sft_cfg, len(traces.examples), task, lmbda, beta)
        assert_same_tokens(trainer, tokenizer, traces.examples)
        assert_loss_is_teacher_jsd(trainer, teacher, tokenizer, traces.examples, beta)
        probe = LossProbe(trainer)
        t1 = time.perf_counter()
        trainer.train()
    loop, steps = clock.end - clock.begin, trainer.state.global_step
    assert_same_optimizer(clock, trainer, minirl["optimizer"])
    assert_same_schedule(clock.lrs, minirl["lrs"], sft_cfg.warmup_steps)
    assert len(probe.rows) == steps, f"{len(probe.rows)} losses for {steps} steps"
    off = [r for r in probe.rows if not r["on_policy"]]
    assert all(r["normaliser"] in (None, r["scored"]) for r in off), "an off-policy step is not a per-token mean"
    on = [r for r in probe.rows if r["on_policy"]]
    assert lmbda > 0 or not on, "lmbda=0 sampled from the student"
    student.eval()
    after = evaluate(student, tokenizer, task, n=eval_n, k=0).accuracy
    return {"arm": arm, "seed": seed, "steps": steps, "on_policy": len(on),
            "ratios": [r["scored"] / r["normaliser"] for r in on], "loop_s": loop,
            "step_s": loop / steps, "setup_s": t1 - t0, "wall_s": time.perf_counter() - t0, "after": after}  # fmt: skip


def teacher_forward_ms(tokenizer, examples, batch_size: int) -> float:
    """Median wall time of one no-grad teacher forward pass on a batch of traces: GKD's extra cost per step."""
    teacher, _ = load(pipeline.TEACHER, device="cpu")
    ids, mask, _ = sft.encode(tokenizer, examples[:batch_size])
    times = []
    with torch.no_grad():
        for _ in range(5):
            t = time.perf_counter()
            teacher(input_ids=ids, attention_mask=mask.long())
            times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps per arm (the learning test's 150)")
    parser.add_argument("--beta", type=float, default=0.0, help="GKD's beta: 0 forward KL, 1 reverse KL (TRL)")
    parser.add_argument("--eval-n", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    assert_beta_convention()

    # --- traces and minirl's SFT settings, from sft_on_traces itself (the distillation learning test's config) ---
    cfg = pipeline.DistillConfig(prompts=300, k=2, steps=args.steps, eval_n=args.eval_n, threads=1)
    traces, sft_cfg = traces_and_sft_config(cfg)
    task = get_task(cfg.task)
    teacher, tokenizer = load(pipeline.TEACHER, device="cpu")
    teacher_acc = evaluate(teacher, tokenizer, task, n=args.eval_n, k=0).accuracy
    before = evaluate(fresh_student(), tokenizer, task, n=args.eval_n, k=0).accuracy
    fwd_ms = teacher_forward_ms(tokenizer, traces.examples, sft_cfg.batch_size)
    print(f"{len(traces.examples)} verified traces of {traces.sampled} samples; teacher {teacher_acc:.3f}, student "
          f"{before:.3f} held-out; {sft_cfg}", flush=True)  # fmt: skip

    # --- minirl's optimizer, as sft.train builds it (0 steps is refused, so 1 step on a throwaway student) ---
    caught = []
    with catch_adamw(caught):
        sft.train(fresh_student(), tokenizer, traces.examples, dataclasses.replace(sft_cfg, steps=1))
    minirl_optimizer = caught[0]

    rows = []
    for seed in args.seeds:
        done = {}
        order = ARMS[seed % 3 :] + ARMS[: seed % 3]
        minirl_lrs = [sft.lr_at(k, sft_cfg) for k in range(sft_cfg.steps)]
        for arm in order:
            if arm == "minirl SFT":
                r = run_minirl(sft_cfg, seed, tokenizer, traces, task, args.eval_n)
                assert r.pop("lrs") == minirl_lrs and r.pop("optimizer") is not None
            else:
                r = run_gkd(arm, args.beta, sft_cfg, seed, tokenizer, traces, task, args.eval_n,
                            {"optimizer": minirl_optimizer, "lrs": minirl_lrs})  # fmt: skip
            r["before"] = before
            done[arm] = r
            print(
                f"{arm} seed {seed}: {r['steps']} steps ({r['on_policy']} on-policy), {r['step_s'] * 1000:.0f} "
                f"ms/step, loop {r['loop_s']:.1f} s, setup {r['setup_s']:.1f} s, held-out accuracy {before:.3f} -> "
                f"{r['after']:.3f}",
                flush=True,
            )
        rows += [done[a] for a in ARMS]
    write_table(rows, args, traces, sft_cfg, teacher_acc, fwd_ms, time.perf_counter() - t_start)


def write_table(rows, args, traces, sft_cfg, teacher_acc: float, fwd_ms: float, total_s: float) -> None:
    keys = ("step_s", "loop_s", "after")
    med = {a: {k: statistics.median(r[k] for r in rows if r["arm"] == a) for k in keys} for a in ARMS}
    base = med["minirl SFT"]["step_s"]
    ratios = [x for r in rows for x in r["ratios"]]  # every on-policy step of every seed
    lines = [
        "# Distillation: minirl's SFT on verified traces vs TRL's GKDTrainer",
        "",
        stamp(("torch", "transformers", "trl", "accelerate", "datasets")),
        f"Traces made once by `minirl.lm.pipeline.sft_on_traces` (run up to its SFT): the teacher "
        f"`tiny-adder-r1` (0.87M parameters, held-out greedy accuracy {teacher_acc:.3f}) sampled k=2 completions for "
        f"each of 300 training addition problems at temperature 1, and {len(traces.examples)} of the "
        f"{traces.sampled} were kept (verified, one per problem). Each arm trains the student `tiny-student` "
        f"(0.11M, same character tokenizer) from the same weights for {sft_cfg.steps} optimizer steps of "
        f"{sft_cfg.batch_size} traces; seeds {args.seeds}; GKD beta = {args.beta:g} (TRL: 0 is forward "
        f"KL(teacher || student), 1 reverse KL). One torch thread, float32, niced on a shared 2-core machine (the arms "
        f"alternate in one process, so ratios stand; absolute times do not). Whole run {total_s / 60:.1f} minutes.",
        "",
        "| arm | seed | steps | on-policy steps | ms/step | training loop (s) | setup (s) | arm wall (s) "
        "| held-out accuracy before | after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r['steps']} | {r['on_policy']} | {r['step_s'] * 1000:.0f} | "
            f"{r['loop_s']:.1f} | {r['setup_s']:.1f} | {r['wall_s']:.1f} | {r['before']:.3f} | {r['after']:.3f} |"
        )
    lines += [
        "",
        "Medians over seeds: "
        + "; ".join(
            f"{a} {med[a]['step_s'] * 1000:.0f} ms/step ({med[a]['step_s'] / base:.1f}x minirl), held-out accuracy "
            f"**{med[a]['after']:.3f}**"
            for a in ARMS
        )
        + f". One no-grad teacher forward pass on a batch of {sft_cfg.batch_size} traces takes {fwd_ms:.0f} ms here "
        "(GKD pays it every step, SFT never).",
        "Held-out accuracy: `minirl.lm.evaluate(model, tok, task, n=" + f"{args.eval_n}, k=0)` (greedy) for every arm. "
        "ms/step: the training loop's wall time over its optimizer steps (minirl: the call to `sft.train`; TRL: "
        "`on_train_begin` to `on_train_end`). Setup: loading the student (and for TRL the teacher), building the "
        "dataset and trainer and running the checks. Arm wall: setup + loop + the evaluation after."
        + (
            f" On on-policy steps the student's samples had {statistics.mean(ratios):.3f}x the tokens of the traces "
            f"they replaced (mean over steps and seeds; {min(ratios):.3f} to {max(ratios):.3f}): TRL weights those "
            "steps by that factor against a per-token mean (see below)."
            if ratios
            else ""
        ),
        "",
        "Hyperparameters (asserted equal on both sides, minirl `SFTConfig` as `sft_on_traces` builds it -> TRL "
        f"`GKDConfig`): steps -> max_steps = {sft_cfg.steps}; batch_size -> per_device_train_batch_size = "
        f"{sft_cfg.batch_size}, gradient_accumulation_steps = 1; lr -> learning_rate = {sft_cfg.lr:g}; warmup_steps "
        f"= {sft_cfg.warmup_steps}, cosine to lr/10 -> lr_scheduler_type `cosine_with_min_lr`, min_lr_rate "
        f"{MIN_LR_RATE} (every step's lr compared); AdamW betas 0.9/0.999, eps 1e-8, weight_decay = "
        f"{sft_cfg.weight_decay:g} (param groups compared as built, foreach/fused included); grad_clip -> "
        f"max_grad_norm = {sft_cfg.grad_clip:g}; float32 (bf16/fp16 off), CPU, one thread, gradient checkpointing "
        "off, no packing, no truncation (TRL's max_length 1024 > the longest trace); seq_kd off; on-policy sampling "
        "at temperature 1, top-k 0, top-p 1, the task's max_new_tokens, eos stop. The student's starting weights, the "
        "token ids and loss positions of every trace are asserted equal, and TRL's loss on a batch equals the "
        "per-token JSD computed here from the student's and teacher's logits.",
        "",
        "Differences that are not hyperparameters:",
        "",
        *[f"- {d}" for d in DIFFERENCES],
        "",
        "Not run: `trl.DistillationTrainer` (what `trl.experimental.distillation` now re-exports, with a deprecation "
        "warning): it is GKD's fully on-policy case (lmbda=1) with vLLM generation and a chunked loss, fed prompts "
        "only, so it cannot train on the verified traces.",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "distill_vs_trl.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
