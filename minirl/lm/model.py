"""The course's tiny language model, and loading and saving any causal LM (``notebooks/08_tiny_lm.ipynb``).

The model is a Llama from a transformers config (rotary position embeddings, RMSNorm, SwiGLU MLP), only small:
hidden 128, 4 layers, 4 heads, MLP 384, tied input and output embeddings, about 0.86M parameters, 3.5 MB in fp32.
Loading goes through the real ``from_pretrained``, so ``load("Qwen/Qwen2.5-0.5B-Instruct")`` works the same way on a
machine with network access, and ``load(PRETRAINED)`` loads the checkpoint that ships with the package.
"""

import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

PRETRAINED = Path(__file__).resolve().parent / "checkpoints" / "tiny-adder"


def tiny_config(
    tokenizer, hidden_size: int = 128, num_layers: int = 4, num_heads: int = 4, intermediate_size: int = 384
) -> LlamaConfig:
    """A Llama config sized for a CPU, with the tokenizer's vocabulary and special-token ids."""
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of num_heads ({num_heads})")
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,  # the output layer reuses the embedding matrix: fewer parameters, a smaller file
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def make_model(tokenizer, seed: int = 0, **sizes) -> LlamaForCausalLM:
    """A freshly initialised tiny model; the same ``seed`` gives the same weights. ``sizes`` go to ``tiny_config``."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(tokenizer, **sizes))


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` is the GPU when there is one, the CPU otherwise; anything else is passed to ``torch.device``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_vocab(model, tokenizer) -> None:
    """Raise when the tokenizer can produce ids the model has no embedding for (a checkpoint from another vocab)."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model embeds only {rows}: they come from different "
            "vocabularies; load the model and its tokenizer from the same checkpoint (minirl.lm.load(path))"
        )


def load(name_or_path: str | os.PathLike, device: str | torch.device = "auto"):
    """``(model, tokenizer)`` from a local checkpoint folder or a Hugging Face Hub name, with ``from_pretrained``.

    The tokenizer pads on the left (generation appends on the right) and falls back to eos as its pad token. The model
    is returned in eval mode on ``device``. Offline, a hub name that is not in the local cache fails with an OSError
    that says how to fix it.
    """
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path)
    except OSError as err:
        if Path(name_or_path).is_dir():
            raise
        raise OSError(
            f"cannot load {str(name_or_path)!r}: it is not a local folder, and the Hugging Face Hub could not provide "
            "it (no network, or HF_HUB_OFFLINE=1, and not in the local cache). Fix: pass the folder of a saved "
            "checkpoint, such as minirl.lm.PRETRAINED, or download the model once where there is network "
            f"(`hf download {name_or_path}`) so that it is cached."
        ) from err
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_vocab(model, tokenizer)
    return model.to(resolve_device(device)).eval(), tokenizer


def save(model, tokenizer, path: str | os.PathLike, metadata: dict | None = None) -> Path:
    """Save weights (safetensors), config and tokenizer, plus ``metadata`` as ``minirl.json``, into the folder ``path``.

    Everything is written into a temporary folder next to ``path`` and then renamed into place, so an exception while
    writing leaves the previous checkpoint at ``path`` untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if metadata is not None:
            (tmp / "minirl.json").write_text(json.dumps(metadata, indent=2) + "\n")
        for file in tmp.iterdir():
            file.chmod(0o644)
        tmp.chmod(0o755)  # mkdtemp makes the folder private; a checkpoint is for everyone
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            os.replace(path, old)  # a folder cannot be replaced in one step: move the old one aside first
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def cache_kwarg(model) -> str:
    """The name under which ``model.forward`` takes its KV cache: ``cache`` in transformers 5, else the older one."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
