"""minirl's Bradley-Terry reward model against TRL's RewardTrainer: same pairs, same starting trunk, same settings.

    pip install -e ".[bench]"
    python benchmarks/reward_model_vs_trl.py                        # 3 seeds, 300 prompts, both libraries, ~5 minutes
    python benchmarks/reward_model_vs_trl.py --seeds 0 --n-prompts 100

The preference pairs are made once, by ``minirl.lm.preferences.make_pairs`` from the committed checkpoint
``minirl.lm.PRETRAINED`` (completions sampled at temperature 1, labelled by the hidden utility, 10% of labels flipped),
and split once by prompt into training and held-out pairs (``split_pairs``), with the values of ``RewardModelConfig``
(8 completions each, up to 4 pairs per prompt, 20% of prompts held out) but 300 prompts instead of its 600
(``--n-prompts``), to keep the run to minutes. Both libraries then train on the same training pairs, once per seed;
the seed moves only what each library draws itself (minibatch order, and TRL's random head).

minirl: ``ScalarLM.from_lm`` on the checkpoint's trunk, fitted by ``minirl.lm.reward_model.fit`` (the loop of
``minirl lm reward-model``; the score normalisation after it does not change a ranking and is left out). TRL:
``RewardTrainer(model=str(PRETRAINED))``, which loads the same checkpoint with ``AutoModelForSequenceClassification``
and one label; it gets the pairs as text (prompt, chosen, rejected), appends eos and tokenizes them itself, and the
token ids it makes are asserted equal to those minirl's ``encode`` makes. Both minimise the mean over a minibatch of
-log sigmoid(r_chosen - r_rejected) (Ouyang et al. 2022 Eq. 1, ``minirl.losses.bradley_terry_loss``): TRL's
``center_rewards_coefficient`` is None and the dataset has no ``margin`` column, so neither extra term is added
(asserted). Knobs: 2 epochs, 32 pairs per step (chosen and rejected in one forward pass of 64 rows), AdamW (torch's
defaults: betas 0.9/0.999, eps 1e-8; lr 3e-4 constant, no warm-up, no weight decay), gradient norm clipped to 1, no
length limit, float32, CPU, no gradient checkpointing. ``assert_same_hyperparameters`` reads them back from both
sides; ``assert_same_optimizer`` compares the optimizers the two training loops actually built (minirl's is caught as
``fit`` constructs it), and the trunk weights both start from are asserted equal.

Both models are scored by the same function, ``minirl.lm.reward_model.pairwise_accuracy`` (TRL's model behind a
two-line adapter that keeps TRL's own pooling); TRL's own ``evaluate`` on the held-out pairs is checked to agree.
Seconds per step are the training loop's wall time over its optimizer steps: for minirl the call to ``fit``, for TRL
the time from the callback ``on_train_begin`` to ``on_train_end``. Loading the model, tokenizing (TRL) and building
the trainer are "setup". Both sides run in this process at one torch thread; the side that goes first alternates
with the seed.

What is not a hyperparameter and differs is listed in ``DIFFERENCES`` (and in the results file).

Writes ``benchmarks/results/reward_model_vs_trl.md``.
"""

import argparse
import contextlib
import inspect
import statistics
import tempfile
import time

import torch
from _stamp import RESULTS, stamp
from datasets import Dataset
from transformers import TrainerCallback
from trl import RewardConfig, RewardTrainer

from minirl.lm import PRETRAINED, load
from minirl.lm.config import RewardModelConfig
from minirl.lm.preferences import make_pairs, split_pairs
from minirl.lm.reward_model import ScalarLM, encode, fit, pairwise_accuracy
from minirl.lm.tasks import get_task

DIFFERENCES = [
    "Head: minirl's is `Linear(128, 1)` with weight and bias initialised to zero (every text scores 0 at the start, "
    "held-out accuracy 0.5 by ties); TRL's is transformers' `score = Linear(128, 1, bias=False)`, drawn from "
    "N(0, 0.02^2) after `set_seed(seed)`. A bias gets no gradient from a score difference, so minirl's stays 0.",
    "Pooling: minirl reads the score at each row's last real token by the attention mask; TRL's "
    "sequence-classification model at the rightmost token whose id is not the pad id (0). Both are the eos that "
    "closes the completion: no real token has id 0 and no row is left-padded (asserted).",
    "Padding and positions: minirl pads prompts on the left and completions on the right and passes position ids that "
    "skip padding; TRL's collator pads the whole row on the right and passes no position ids (0, 1, 2, ...). Every "
    "addition prompt is bos + 8 characters, so no prompt is padded and positions agree on every real token.",
    "Tokenizing: minirl tokenizes each minibatch inside its loop (`encode`, counted in its s/step); TRL tokenizes the "
    "whole dataset once before training (`dataset.map`, counted in its setup). The ids are the same (asserted).",
    "Minibatch order: minirl shuffles with `random.Random(f'fit/{seed}')` each epoch; TRL's sampler with a torch "
    "generator seeded by `seed`. Same pairs per epoch, different order: compare medians over seeds, not seed by seed.",
    "Step overheads: TRL's loop holds the Trainer machinery (dataloader and collator, callbacks, metric gathering with "
    "`.item()` calls every step, logging every 10 steps); minirl's loop logs five numbers per step to its History.",
    "Optimizer: TRL's default `optim` is `adamw_torch_fused`; it is set to `adamw_torch` here so that both sides run "
    "`torch.optim.AdamW` with the same (single-tensor) kernel. TRL splits the parameters into a decay and a no-decay "
    "group; with weight decay 0 both groups update alike.",
    "Dropout: TRL disables dropout in the model (`disable_dropout=True`); minirl trains in train mode, but the "
    "checkpoint has attention dropout 0 and no other dropout, so the two forwards are the same.",
    "Warm-up: the first training loop in a process is slower; the side that goes first alternates with the seed "
    "(minirl first on even seeds).",
]


class Clock(TrainerCallback):
    """Wall time of TRL's training loop, the optimizer it built, and the thread count it runs with."""

    def __init__(self) -> None:
        self.begin = self.end = 0.0
        self.optimizer, self.threads, self.lr_at_end = None, 0, 0.0

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        self.optimizer = getattr(optimizer, "optimizer", optimizer)  # the torch optimizer inside accelerate's wrapper
        self.threads = torch.get_num_threads()
        self.begin = time.perf_counter()

    def on_train_end(self, args, state, control, optimizer=None, **kwargs):
        self.end = time.perf_counter()
        self.lr_at_end = optimizer.param_groups[0]["lr"]


@contextlib.contextmanager
def catch_adamw(caught: list):
    """Record every ``torch.optim.AdamW`` built inside the block: minirl's ``fit`` makes its optimizer internally."""
    original = torch.optim.AdamW

    class Recorded(original):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            caught.append(self)

    torch.optim.AdamW = Recorded
    try:
        yield
    finally:
        torch.optim.AdamW = original


class TRLScorer(torch.nn.Module):
    """TRL's sequence-classification model behind ``ScalarLM.score``'s interface, keeping TRL's own pooling (the
    rightmost non-pad token), so that ``pairwise_accuracy`` scores both libraries' models."""

    def __init__(self, model: torch.nn.Module, pad_id: int):
        super().__init__()
        self.model, self.pad_id = model, pad_id

    def score(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        assert mask[:, 0].all() and not (ids[mask.bool()] == self.pad_id).any(), "left padding or a real pad id"
        return self.model(input_ids=ids, attention_mask=mask.long()).logits.squeeze(-1)  # (B,)


def pair_dataset(pairs) -> Dataset:
    """TRL's explicit-prompt preference format: it joins prompt + chosen, appends eos and tokenizes."""
    return Dataset.from_dict(
        {
            "prompt": [p.prompt for p in pairs],
            "chosen": [p.chosen for p in pairs],
            "rejected": [p.rejected for p in pairs],
        }
    )


def trl_config(cfg: RewardModelConfig, seed: int, out_dir: str, eval_batch: int) -> RewardConfig:
    """TRL's side with minirl's values."""
    return RewardConfig(
        output_dir=out_dir,
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size,  # pairs; the collator stacks chosen and rejected into 2x rows
        per_device_eval_batch_size=eval_batch,  # all held-out pairs in one batch: TRL averages per-batch accuracies
        gradient_accumulation_steps=1,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=cfg.max_grad_norm,
        max_length=None,  # minirl truncates nothing; TRL would drop (not truncate) longer pairs
        center_rewards_coefficient=None,
        gradient_checkpointing=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_drop_last=False,
        seed=seed,
    )


def assert_same_hyperparameters(trainer: RewardTrainer, cfg: RewardModelConfig, n_train: int) -> None:
    """Every knob that changes the math, read back from TRL's trainer against what minirl's ``fit`` receives."""
    args, adamw = trainer.args, inspect.signature(torch.optim.AdamW).parameters
    signature = inspect.signature(fit).parameters
    pairs = {
        "epochs": (args.num_train_epochs, cfg.epochs),
        "pairs per optimizer step": (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            cfg.batch_size,
        ),
        "optimizer steps": (
            len(trainer.get_train_dataloader()) * args.num_train_epochs,
            cfg.epochs * -(-n_train // cfg.batch_size),
        ),
        "last partial minibatch kept": (args.dataloader_drop_last, False),
        "training pairs (none filtered)": (len(trainer.train_dataset), n_train),
        "max length": (args.max_length, None),
        "margin term": ("margin" in trainer.train_dataset.column_names, False),
        "center-rewards term": (args.center_rewards_coefficient, None),
        "lr": (args.learning_rate, cfg.lr),
        "lr schedule": (args.lr_scheduler_type, "constant"),
        "warm-up steps": ((args.warmup_steps, getattr(args, "warmup_ratio", 0) or 0), (0, 0)),
        "optimizer": (args.optim, "adamw_torch"),
        "adam betas": ((args.adam_beta1, args.adam_beta2), adamw["betas"].default),
        "adam eps": (args.adam_epsilon, adamw["eps"].default),
        "weight decay": (args.weight_decay, 0.0),  # fit's AdamW(weight_decay=0.0)
        "max grad norm": (args.max_grad_norm, cfg.max_grad_norm),
        "fit's defaults are the config's": (
            (signature["epochs"].default, signature["batch_size"].default, signature["lr"].default),
            (cfg.epochs, cfg.batch_size, cfg.lr),
        ),
        "precision": ((args.bf16, args.fp16, trainer.model.dtype), (False, False, torch.float32)),
        "gradient checkpointing": (args.gradient_checkpointing, False),
        "labels (one scalar)": (trainer.model.config.num_labels, 1),
        "pad id": (trainer.model.config.pad_token_id, trainer.processing_class.pad_token_id),
        "device": (trainer.accelerator.device.type, "cpu"),
    }
    mismatched = {k: v for k, v in pairs.items() if v[0] != v[1]}
    assert not mismatched, f"hyperparameters differ (TRL, minirl): {mismatched}"


def assert_same_optimizer(clock: Clock, minirl_optimizer: torch.optim.Optimizer, cfg: RewardModelConfig) -> None:
    """The optimizers the two training loops built, group by group (TRL has a decay and a no-decay group)."""
    assert isinstance(clock.optimizer, torch.optim.AdamW), f"TRL built {type(clock.optimizer).__name__}"
    assert_same_optimizer_groups(clock.optimizer, minirl_optimizer)
    assert clock.lr_at_end == cfg.lr, f"TRL's lr moved to {clock.lr_at_end}: the schedule is not constant"
    assert clock.threads == torch.get_num_threads() == 1, f"TRL trained at {clock.threads} threads"


OPTIMIZER_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "fused", "capturable")


def assert_same_optimizer_groups(optimizer: torch.optim.Optimizer, minirl_optimizer: torch.optim.Optimizer) -> None:
    """Each parameter group of ``optimizer`` has the settings of minirl's (one group)."""
    ours = {k: minirl_optimizer.param_groups[0].get(k) for k in OPTIMIZER_KEYS}
    for i, group in enumerate(optimizer.param_groups):
        theirs = {k: group.get(k) for k in OPTIMIZER_KEYS}
        assert theirs == ours, f"optimizer group {i} differs: {theirs} vs minirl's {ours}"


def run_minirl(cfg: RewardModelConfig, seed: int, train_pairs, heldout_pairs) -> dict:
    t0 = time.perf_counter()
    lm, tokenizer = load(PRETRAINED, device="cpu")
    model = ScalarLM.from_lm(lm)
    setup = time.perf_counter() - t0
    before = pairwise_accuracy(model, tokenizer, heldout_pairs)
    caught = []
    t1 = time.perf_counter()
    with catch_adamw(caught):
        history = fit(model, tokenizer, train_pairs, cfg.epochs, cfg.batch_size, cfg.lr, seed, cfg.max_grad_norm)
    loop = time.perf_counter() - t1
    assert len(caught) == 1, f"fit built {len(caught)} AdamW optimizers"
    return {
        "library": "minirl",
        "seed": seed,
        "steps": len(history),
        "loop_s": loop,
        "step_s": loop / len(history),
        "setup_s": setup,
        "before": before,
        "train_acc": pairwise_accuracy(model, tokenizer, train_pairs),
        "after": pairwise_accuracy(model, tokenizer, heldout_pairs),
        "optimizer": caught[0],
    }


def run_trl(cfg: RewardModelConfig, seed: int, train_pairs, heldout_pairs, minirl_optimizer) -> dict:
    clock = Clock()
    with tempfile.TemporaryDirectory() as out_dir:
        t0 = time.perf_counter()
        _, tokenizer = load(PRETRAINED, device="cpu")
        trainer = RewardTrainer(
            model=str(PRETRAINED),
            args=trl_config(cfg, seed, out_dir, len(heldout_pairs)),
            train_dataset=pair_dataset(train_pairs),
            processing_class=tokenizer,
            callbacks=[clock],
        )
        t1 = time.perf_counter()
        assert_same_hyperparameters(trainer, cfg, len(train_pairs))
        assert_same_tokens(trainer, tokenizer, train_pairs)
        assert_same_trunk(trainer)
        scorer = TRLScorer(trainer.model, tokenizer.pad_token_id)
        before = pairwise_accuracy(scorer, tokenizer, heldout_pairs)
        trainer.train()
        after = pairwise_accuracy(scorer, tokenizer, heldout_pairs)
        own = trainer.evaluate(pair_dataset(heldout_pairs))["eval_accuracy"]
    # TRL counts ties as wrong, minirl as half; allow for a pair or two that sits on a rounding tie
    assert abs(own - after) <= 2 / len(heldout_pairs), f"TRL's evaluate says {own:.4f}, pairwise_accuracy {after:.4f}"
    assert_same_optimizer(clock, minirl_optimizer, cfg)
    loop = clock.end - clock.begin
    steps = trainer.state.global_step
    return {
        "library": "TRL",
        "seed": seed,
        "steps": steps,
        "loop_s": loop,
        "step_s": loop / steps,
        "setup_s": (t1 - t0),
        "before": before,
        "train_acc": pairwise_accuracy(scorer, tokenizer, train_pairs),
        "after": after,
        "trl_eval": own,
    }


def assert_same_tokens(trainer: RewardTrainer, tokenizer, train_pairs) -> None:
    """TRL's own tokenization of the text pairs is minirl's ``encode``: bos + prompt + completion + eos."""
    data = trainer.train_dataset
    for i, p in enumerate(train_pairs):
        for side, completion in (("chosen", p.chosen), ("rejected", p.rejected)):
            ids, mask = encode(tokenizer, [p.prompt], [completion], "cpu")
            assert mask.all() and ids[0].tolist() == data[i][f"{side}_ids"], f"pair {i} {side}: tokens differ"


_START_TRUNK: dict = {}


def assert_same_trunk(trainer: RewardTrainer) -> None:
    """TRL's trunk (``model.model``) starts from exactly the weights minirl's ``ScalarLM.from_lm`` starts from."""
    if not _START_TRUNK:
        lm, _ = load(PRETRAINED, device="cpu")
        _START_TRUNK.update(lm.base_model.state_dict())
    theirs = trainer.model.model.state_dict()
    assert theirs.keys() == _START_TRUNK.keys(), set(theirs) ^ set(_START_TRUNK)
    for k, v in theirs.items():
        assert torch.equal(v, _START_TRUNK[k]), f"TRL's starting trunk differs at {k}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--n-prompts", type=int, default=300, help="RewardModelConfig has 600")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = RewardModelConfig(n_prompts=args.n_prompts, threads=1, device="cpu")
    assert cfg.model == str(PRETRAINED)

    # --- pairs: made once, from the checkpoint both sides start from ---
    t0 = time.perf_counter()
    lm, tokenizer = load(cfg.model, device="cpu")
    pairs = make_pairs(lm, tokenizer, get_task(cfg.task), cfg.n_prompts, cfg.completions_per_prompt,
                       cfg.pairs_per_prompt, cfg.noise, seed=cfg.seed)  # fmt: skip
    train_pairs, heldout_pairs = split_pairs(pairs, cfg.heldout, cfg.seed)
    print(
        f"{len(train_pairs)} training pairs, {len(heldout_pairs)} held-out pairs ({time.perf_counter() - t0:.1f} s)",
        flush=True,
    )

    # --- minirl's optimizer, as fit builds it (no epochs: built, not stepped); TRL's is compared against it ---
    caught = []
    with catch_adamw(caught):
        fit(ScalarLM.from_lm(lm), tokenizer, train_pairs, 0, cfg.batch_size, cfg.lr, 0, cfg.max_grad_norm)
    minirl_optimizer = caught[0]

    t_start, rows = time.perf_counter(), []
    for seed in args.seeds:
        done = {}
        for lib in ("minirl", "TRL") if seed % 2 == 0 else ("TRL", "minirl"):
            if lib == "minirl":
                done[lib] = run_minirl(cfg, seed, train_pairs, heldout_pairs)
                assert_same_optimizer_groups(done[lib].pop("optimizer"), minirl_optimizer)
            else:
                done[lib] = run_trl(cfg, seed, train_pairs, heldout_pairs, minirl_optimizer)
            r = done[lib]
            print(
                f"{r['library']} seed {seed}: {r['steps']} steps, {r['step_s'] * 1000:.0f} ms/step, loop "
                f"{r['loop_s']:.1f} s, setup {r['setup_s']:.1f} s, held-out accuracy {r['before']:.3f} -> "
                f"{r['after']:.3f} (training pairs {r['train_acc']:.3f})",
                flush=True,
            )
        rows += [done["minirl"], done["TRL"]]
    write_table(rows, args, cfg, len(train_pairs), len(heldout_pairs), time.perf_counter() - t_start)


def write_table(rows: list[dict], args, cfg: RewardModelConfig, n_train: int, n_held: int, total_s: float) -> None:
    libs = ("minirl", "TRL")
    keys = ("step_s", "loop_s", "after")
    med = {lib: {k: statistics.median(r[k] for r in rows if r["library"] == lib) for k in keys} for lib in libs}
    ratio = med["minirl"]["step_s"] / med["TRL"]["step_s"]
    lines = [
        "# Bradley-Terry reward model: minirl vs TRL's RewardTrainer",
        "",
        stamp(("torch", "transformers", "trl", "accelerate", "datasets")),
        f"Pairs made once by `minirl.lm.preferences.make_pairs` from `minirl.lm.PRETRAINED` (0.87M-parameter Llama, "
        f"character tokenizer): {cfg.n_prompts} addition prompts x {cfg.completions_per_prompt} completions, up to "
        f"{cfg.pairs_per_prompt} pairs per prompt, label noise {cfg.noise}; split by prompt into {n_train} training "
        f"and {n_held} held-out pairs ({cfg.heldout:.0%} of prompts). Both libraries train from the checkpoint's trunk "
        f"on the same training pairs, seeds {args.seeds}, one torch thread each, run niced on a shared 2-core "
        f"machine (the two sides alternate in one process, so the ratio stands; absolute times do not). "
        f"Whole run {total_s / 60:.1f} minutes.",
        "",
        "| library | seed | steps | ms/step | training loop (s) | setup (s) | held-out accuracy before | after "
        "| training-pair accuracy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['library']} | {r['seed']} | {r['steps']} | {r['step_s'] * 1000:.0f} | {r['loop_s']:.1f} | "
            f"{r['setup_s']:.1f} | {r['before']:.3f} | {r['after']:.3f} | {r['train_acc']:.3f} |"
        )
    lines += [
        "",
        f"Medians over seeds: minirl {med['minirl']['step_s'] * 1000:.0f} ms/step "
        f"({med['minirl']['loop_s']:.1f} s of training), TRL {med['TRL']['step_s'] * 1000:.0f} ms/step "
        f"({med['TRL']['loop_s']:.1f} s); ratio minirl / TRL = **{ratio:.2f}x**. Held-out pairwise accuracy after "
        f"training: minirl **{med['minirl']['after']:.3f}**, TRL **{med['TRL']['after']:.3f}**.",
        "Accuracy is `minirl.lm.reward_model.pairwise_accuracy` for both (TRL's model keeps its own pooling behind an "
        "adapter; a tie counts half, which is why minirl's zero-initialised head starts at 0.500); TRL's own "
        "`evaluate` on the held-out pairs agreed on every seed (eval_accuracy "
        + ", ".join(f"{r['trl_eval']:.3f}" for r in rows if r["library"] == "TRL")
        + "). ms/step: the training loop's wall time over its optimizer steps (minirl: the call to `fit`; TRL: "
        "`on_train_begin` to `on_train_end`). Setup: loading the model and, for TRL, tokenizing the dataset and "
        "building the trainer.",
        "",
        "Hyperparameters (asserted equal on both sides, minirl `RewardModelConfig` / `fit` -> TRL `RewardConfig`): "
        f"epochs -> num_train_epochs = {cfg.epochs}; batch_size -> per_device_train_batch_size = {cfg.batch_size} "
        "pairs, gradient_accumulation_steps = 1, last partial minibatch kept (same number of optimizer steps); "
        f"lr -> learning_rate = {cfg.lr:g}, constant, no warm-up; AdamW betas 0.9/0.999, eps 1e-8, weight decay 0 "
        "(optimizer param groups compared as built, including foreach/fused); "
        f"max_grad_norm = {cfg.max_grad_norm:g}; no length limit (max_length None, no pair filtered); "
        "loss -log sigmoid(r_chosen - r_rejected) averaged over the pairs of a minibatch, no margin, "
        "center_rewards_coefficient None; float32 (bf16/fp16 off), CPU, gradient checkpointing off, one label. "
        "The trunk weights at the start and the token ids of every training pair are asserted equal.",
        "",
        "Differences that are not hyperparameters:",
        "",
        *[f"- {d}" for d in DIFFERENCES],
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "reward_model_vs_trl.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
