"""The configs of the ``minirl lm`` commands, in a module that imports neither torch nor transformers.

``minirl --help`` and ``minirl train ...`` build their parsers from these dataclasses without loading the language
model's libraries (seconds of imports). The trainers re-export them: ``minirl.lm.grpo.GRPOConfig`` and
``minirl.lm.pretraining.PretrainConfig`` are these classes.
"""

from dataclasses import dataclass
from pathlib import Path

PRETRAINED = Path(__file__).resolve().parent / "checkpoints" / "tiny-adder"  # the course's committed checkpoint
PRETRAINED_RM = PRETRAINED.with_name("tiny-adder-rm")  # its reward model (`minirl lm reward-model`, 600 prompts)


@dataclass
class GRPOConfig:
    """Hyperparameters of ``train``; each field is an option of ``minirl lm grpo``. Defaults follow runs that learned
    on 2 CPU cores (16 prompts x 8 completions, temperature 1, one iteration, lr 1e-4, beta 0)."""

    model: str = str(PRETRAINED)  # checkpoint folder or hub name to start from (and the frozen reference, beta > 0)
    task: str = "addition"  # task of minirl.lm.tasks: addition (3 digits), sorting, addition-plain, -mixed, -chat
    chat: bool = False  # ask each prompt as a user turn of the tokenizer's chat template (instruct models)
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
    consistency_weight: float = 0.0  # weight of the language-consistency reward (share of the trace in digits); logged
    lr: float = 1e-4  # AdamW learning rate (the peak, after any warm-up); 1e-4 learned here, 3e-4 collapsed
    schedule: str = "constant"  # "constant" lr, or "cosine" from lr down to lr / 10 at the last step
    warmup_steps: int = 0  # linear warm-up from 0 to lr over these first steps
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    max_grad_norm: float = 1.0  # clip the global gradient norm to this
    eval_every: int = 25  # steps between greedy held-out evaluations (also at step 0 and at the end); 0: never
    eval_n: int = 200  # held-out problems per evaluation
    out: str | None = None  # run folder: checkpoint/ (model/, optimizer, trainer.json), replaced whole; None: no saving
    save_every: int = 0  # steps between checkpoints into out; 0: only at the end
    resume: bool = False  # continue the run in out (else start) as if unbroken; settings of the math must match
    seed: int = 0  # prompts and sampling of step s are seeded by (seed, s), so a resumed run draws the same
    threads: int = 0  # torch CPU threads; 0: as set (1 if idle threads spin, minirl.course.use_threads)
    device: str = "auto"  # "auto" (a GPU when there is one), "cpu", "cuda"


@dataclass
class PretrainConfig:
    """Everything that decides the checkpoint. Each field is an option of ``minirl lm pretrain``."""

    out: str = "checkpoints/tiny-adder"  # checkpoint folder: new, empty or a minirl checkpoint (replaced whole)
    task: str = "addition"  # task family: addition (3 digits), sorting (4 numbers), addition-plain (no tags)
    pool_size: int = 800  # distinct training problems, seen again every epoch; a small pool slows learning down
    steps: int = 300  # optimizer steps, the only stopping rule
    batch_size: int = 32  # problems per step
    lr: float = 1e-3  # AdamW learning rate, constant after the warm-up: stopping early is truncating a longer run
    warmup_steps: int = 50  # linear warm-up steps
    hidden_size: int = 128  # model width
    num_layers: int = 4  # transformer blocks
    num_heads: int = 4  # attention heads
    intermediate_size: int = 384  # SwiGLU hidden width
    eval_every: int = 100  # steps between greedy held-out accuracy checks on the progress bar
    eval_n: int = 100  # held-out problems for those checks
    final_n: int = 500  # held-out problems for the final evaluation stored with the checkpoint
    seed: int = 0  # weights, problem pool and shuffling
    threads: int = 0  # torch CPU threads; 0: as set (course.use_threads); results reproduce per thread count


@dataclass
class RewardModelConfig:
    """Hyperparameters of ``train``; each field is an option of ``minirl lm reward-model``."""

    model: str = str(PRETRAINED)  # checkpoint whose trunk starts the reward model, and that writes the completions
    task: str = "addition"  # task family of minirl.lm.tasks whose training prompts are compared
    n_prompts: int = 600  # prompts; each gets completions_per_prompt samples and up to pairs_per_prompt pairs
    completions_per_prompt: int = 8  # samples per prompt at temperature 1, of which distinct ones are compared
    pairs_per_prompt: int = 4  # pairs per prompt, drawn among those whose utilities differ
    noise: float = 0.1  # share of labels flipped at random, like disagreeing labellers; in [0, 0.5)
    heldout: float = 0.2  # share of prompts whose pairs are held out to measure pairwise accuracy
    epochs: int = 2  # passes over the training pairs
    batch_size: int = 32  # pairs per gradient step
    lr: float = 3e-4  # AdamW learning rate of trunk and head
    max_grad_norm: float = 1.0  # clip the global gradient norm to this
    out: str | None = None  # folder for the reward model (new, empty or minirl's); None: not saved
    seed: int = 0  # prompts, samples, labels, split and minibatch order
    threads: int = 0  # torch CPU threads; 0: as set (1 if idle threads spin, minirl.course.use_threads)
    device: str = "auto"  # "auto" (a GPU when there is one), "cpu", "cuda"


@dataclass
class RLHFConfig:
    """Hyperparameters of ``train``; each field is an option of ``minirl lm rlhf``."""

    model: str = str(PRETRAINED)  # policy start and frozen reference pi_ref (the SFT model of InstructGPT's stage 1)
    reward_model: str = str(PRETRAINED_RM)  # folder of a reward model from `minirl lm reward-model`, same vocab
    value_model: str | None = None  # folder of a scalar model to start the critic from; None: copy the reward model
    task: str = "addition"  # task family of minirl.lm.tasks: prompts, and the verifier used for logging only
    steps: int = 100  # PPO steps; each samples prompts_per_step completions and trains on them
    prompts_per_step: int = 64  # B prompts per step, one completion each (the critic is PPO's baseline, not a group)
    max_new_tokens: int = 0  # completion budget C; 0 takes the task's. Reaching it truncates (bootstrap from V)
    temperature: float = 1.0  # sampling temperature T; log-probs are of the same softmax(logits / T)
    beta: float = 0.05  # per-token KL penalty to pi_ref in the reward, Ouyang et al. 2022 Eq. 2; usually 0.01-0.2
    gamma: float = 1.0  # discount over tokens; 1 is usual in RLHF (an episode is one short completion)
    lam: float = 0.95  # GAE lambda over tokens, Schulman et al. 2016 Eq. 16; 0: TD(0), 1: Monte Carlo
    epochs: int = 2  # K passes over each batch, Schulman et al. 2017 Alg. 1; usually 1-4
    minibatches: int = 2  # minibatches per pass; a step makes epochs * minibatches updates of each model
    clip_low: float = 0.2  # epsilon, the ratio's lower clip 1 - clip_low, Schulman et al. 2017 Eq. 7; usually 0.1-0.3
    clip_high: float | None = None  # upper clip 1 + clip_high; None: symmetric
    value_clip: float | None = 0.2  # clip V - V_old to this in the value loss ("37 details" no. 9); None: plain
    whiten: bool = True  # normalise advantages to mean 0, std 1 over the batch's completion tokens
    lr: float = 1e-4  # AdamW learning rate of the policy
    value_lr: float = 3e-4  # AdamW learning rate of the critic
    max_grad_norm: float = 1.0  # clip each model's global gradient norm to this
    eval_every: int = 25  # steps between greedy held-out evaluations (also at step 0 and at the end); 0: never
    eval_n: int = 200  # held-out problems per evaluation
    out: str | None = None  # run folder: checkpoint/ (model/, value/, optimizers, trainer.json); None: no saving
    save_every: int = 0  # steps between checkpoints into out; 0: only at the end
    resume: bool = False  # continue the run in out (else start) as if unbroken; settings of the math must match
    seed: int = 0  # prompts, sampling and minibatch order of step s are seeded by (seed, s)
    threads: int = 0  # torch CPU threads; 0: as set (1 if idle threads spin, minirl.course.use_threads)
    device: str = "auto"  # "auto" (a GPU when there is one), "cpu", "cuda"
