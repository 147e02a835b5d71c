"""The language-model half of minirl: a tiny causal LM as a policy (``notebooks/08_tiny_lm.ipynb`` onwards).

``build_tokenizer`` and ``make_model`` build the course's character-level model; ``load`` and ``save`` handle it and
any Hugging Face causal LM; ``tasks`` holds the verifiable problems; ``sample`` and ``logprobs`` are the policy's
actions and their log-probs; ``sft`` fine-tunes; ``rewards`` and ``grpo`` are
R1-Zero-style rule-based rewards and the GRPO trainer; ``evaluate`` scores held-out accuracy; ``pretrain`` makes the
checkpoint at ``PRETRAINED`` that the later notebooks start from.
"""

from minirl.lm import grpo, rewards, sft, tasks
from minirl.lm.evaluation import Evaluation, evaluate
from minirl.lm.model import PRETRAINED, check_vocab, load, make_model, save, tiny_config
from minirl.lm.pretrain import PretrainConfig, pretrain
from minirl.lm.sampling import Samples, logprobs, sample
from minirl.lm.tokenizer import build_tokenizer

__all__ = [
    "PRETRAINED",
    "Evaluation",
    "PretrainConfig",
    "Samples",
    "build_tokenizer",
    "check_vocab",
    "evaluate",
    "grpo",
    "load",
    "logprobs",
    "make_model",
    "pretrain",
    "rewards",
    "sample",
    "save",
    "sft",
    "tasks",
    "tiny_config",
]
