"""The language-model half of minirl: a tiny causal LM as a policy (``notebooks/08_tiny_lm.ipynb`` onwards).

``build_tokenizer`` and ``make_model`` build the course's character-level model; ``load`` and ``save`` handle it and
any Hugging Face causal LM; ``tasks`` holds the verifiable problems; ``sample`` and ``logprobs`` are the policy's
actions and their log-probs (``decoding`` is the sampler's lean forward); ``sft`` fine-tunes; ``rewards`` and
``grpo`` are R1-Zero-style rule-based rewards and the GRPO trainer; ``evaluate`` scores held-out accuracy;
``pretrain`` makes the checkpoint at ``PRETRAINED`` that the later notebooks start from; ``runs`` saves and resumes
training runs; ``real`` turns SmolLM2-135M-Instruct's GGUF file into a checkpoint the same code trains.

Every name is imported on first use (PEP 562 ``__getattr__``): transformers takes seconds to import, and
``minirl --help`` or ``minirl train ppo`` should not pay for it.
"""

import importlib

from minirl.lm.config import PRETRAINED

_HOMES = {  # public name -> the module that defines it
    "Evaluation": "evaluation",
    "evaluate": "evaluation",
    "check_vocab": "model",
    "load": "model",
    "make_model": "model",
    "save": "model",
    "tiny_config": "model",
    "PretrainConfig": "config",
    "pretrain": "pretraining",
    "Samples": "sampling",
    "logprobs": "sampling",
    "sample": "sampling",
    "build_tokenizer": "tokenizer",
}
_MODULES = (
    "config",
    "decoding",
    "distributed",
    "evaluation",
    "grpo",
    "model",
    "pipeline",
    "pipeline_config",
    "preferences",
    "pretraining",
    "real",
    "reward_model",
    "rewards",
    "rlhf",
    "runs",
    "sampling",
    "sft",
    "tasks",
    "tokenizer",
)

__all__ = ["PRETRAINED", *sorted(_HOMES), *_MODULES]


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(f"minirl.lm.{name}")
    if name in _HOMES:
        module = importlib.import_module(f"minirl.lm.{_HOMES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'minirl.lm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
