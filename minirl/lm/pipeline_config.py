"""The configs of ``minirl lm cold-start`` and ``minirl lm distill`` (``minirl.lm.pipeline``), in a module that
imports neither torch nor transformers, so that ``minirl --help`` builds its parser without them (as
``minirl.lm.config`` does)."""

from dataclasses import dataclass

from minirl.lm.config import PRETRAINED

CHECKPOINTS = PRETRAINED.parent
TEACHER = CHECKPOINTS / "tiny-adder-r1"  # tiny-adder after 100 GRPO steps: the RL model, the teacher
STUDENT = CHECKPOINTS / "tiny-student"  # a model 7.6x smaller that barely knows the task
KEEPS = ("verified", "correct", "all")  # which sampled completions become SFT data


@dataclass
class DistillConfig:
    """SFT of ``student`` on verified traces sampled from ``teacher``. Each field is an option of ``minirl lm distill``.

    ``student`` = the base the teacher was trained from: R1's rejection-sampling SFT (stage 3); a smaller model: R1's
    distillation. Defaults: the committed RL teacher and small student (``minirl/lm/checkpoints/README.md``).
    """

    teacher: str = str(TEACHER)  # model that writes the traces (R1 after reasoning RL)
    student: str = str(STUDENT)  # model fine-tuned on them, from its own weights (a fresh copy each run)
    task: str = "addition"  # task family of minirl.lm.tasks
    prompts: int = 600  # training problems the teacher answers
    k: int = 4  # completions sampled per problem (R1 samples several and keeps the verified ones)
    temperature: float = 1.0  # sampling temperature of the teacher
    keep: str = "verified"  # filter: verified (right and readable), correct (right answer, any shape), all (none)
    per_prompt: int = 1  # distinct kept completions per problem, at most
    steps: int = 300  # SFT steps of the student
    batch_size: int = 32  # examples per SFT step
    lr: float = 1e-3  # peak AdamW learning rate of the SFT (cosine to lr / 10)
    warmup_steps: int = 20  # linear warm-up steps
    eval_n: int = 500  # held-out problems for the before/after evaluation
    seed: int = 0  # prompts, the teacher's sampling and the SFT's shuffling
    out: str | None = None  # folder to save the trained student in; None: not saved
    threads: int = 0  # torch CPU threads; 0: as set (1 if idle threads spin, minirl.course.use_threads)
    device: str = "auto"  # "auto" (a GPU when there is one), "cpu", "cuda"


@dataclass
class ColdStartConfig:
    """SFT of ``model`` on ``traces`` clean written solutions of ``task`` (R1's cold start, stage 1). Each field is an
    option of ``minirl lm cold-start``; the reasoning-RL stage that follows is ``minirl lm grpo --model OUT``."""

    model: str = str(PRETRAINED)  # model fine-tuned on the traces (a fresh copy from its folder)
    task: str = "addition"  # task family of minirl.lm.tasks whose reference traces are learned
    traces: int = 64  # distinct training problems with their written solution (R1: thousands, a small set)
    steps: int = 100  # SFT steps
    batch_size: int = 32  # examples per SFT step
    lr: float = 3e-4  # peak AdamW learning rate of the SFT (cosine to lr / 10)
    warmup_steps: int = 10  # linear warm-up steps
    eval_n: int = 500  # held-out problems for the before/after evaluation
    seed: int = 0  # which problems and the SFT's shuffling
    out: str | None = None  # folder to save the fine-tuned model in; None: not saved
    threads: int = 0  # torch CPU threads; 0: as set (1 if idle threads spin, minirl.course.use_threads)
    device: str = "auto"  # "auto" (a GPU when there is one), "cpu", "cuda"
