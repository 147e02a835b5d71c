"""The course's tiny language model, and loading and saving any causal LM (``notebooks/08_tiny_lm.ipynb``).

The model is a Llama from a transformers config (rotary position embeddings, RMSNorm, SwiGLU MLP), only small:
hidden 128, 4 layers, 4 heads, MLP 384, tied input and output embeddings, about 0.86M parameters, 3.5 MB in fp32.
Loading goes through the real ``from_pretrained``, so ``load("Qwen/Qwen2.5-0.5B-Instruct")`` works the same way on a
machine with network access, and ``load(PRETRAINED)`` loads the checkpoint that ships with the package.
"""

import inspect
import json
import os
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hf_constants
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from minirl._io import recover_folder, refuse_foreign, write_folder
from minirl.lm.config import PRETRAINED  # noqa: F401  (re-exported: minirl.lm.model.PRETRAINED)

MARKER = "minirl.json"  # in every checkpoint folder minirl wrote; lm.save replaces only such folders


@contextmanager
def quiet_progress():
    """Hide the bars transformers 5 draws inside ``from_pretrained`` ("Loading weights") and ``save_pretrained``
    ("Writing model shards"), for the calls inside the ``with`` only. The course's checkpoints load in milliseconds,
    and in a notebook every bar is a line of clutter. Hub downloads keep their own bars (huggingface_hub's)."""
    set_hook = getattr(hf_logging, "set_tqdm_hook", None)
    if set_hook is None:  # an older transformers 5: no hook, so switch its bars off and back on
        was_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            if was_on:
                hf_logging.enable_progress_bar()
        return
    previous = set_hook(lambda factory, args, kwargs: hf_logging.EmptyTqdm(*args, **kwargs))
    try:
        yield
    finally:
        set_hook(previous)


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
    is returned in eval mode on ``device``. A checkpoint loads whole or not at all: a missing, unreadable or
    incomplete file, or weights that do not match the model, raise an error naming the file. A hub name that is
    neither cached nor reachable fails at once with an OSError that says how to fix it.
    """
    if Path(name_or_path).is_dir():
        model, tokenizer = _load_folder(Path(name_or_path))
    else:
        model, tokenizer = _load_hub(str(name_or_path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_vocab(model, tokenizer)
    return model.to(resolve_device(device)).eval(), tokenizer


def _load_folder(path: Path):
    """Model and tokenizer from a local folder, naming the file at fault when one is missing or broken."""
    if not (path / "config.json").is_file():
        raise OSError(
            f"{path / 'config.json'} is missing, so {path} is not a complete model checkpoint; load the folder that "
            "minirl.lm.save or save_pretrained wrote (it holds config.json, model.safetensors and the tokenizer)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as err:  # a half-written tokenizer.json surfaces as JSON, Rust or OS errors alike
        raise OSError(
            f"cannot read the tokenizer in {path} (tokenizer.json or tokenizer_config.json is missing or damaged: "
            f"{err}); copy the checkpoint again, or save it anew with minirl.lm.save"
        ) from err
    try:
        with quiet_progress():
            model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    except Exception as err:  # a truncated model.safetensors fails in safetensors' header parser
        raise OSError(
            f"cannot read the weights in {path / 'model.safetensors'}: missing, truncated, damaged, or of other shapes "
            f"than config.json says ({err}); copy the checkpoint again, or save it anew with minirl.lm.save"
        ) from err
    check_loading_info(path, info)
    return model, tokenizer


def check_loading_info(path, info: dict) -> None:
    """Raise when ``from_pretrained`` left weights at random initialisation or dropped some from the file.

    ``info`` is what ``from_pretrained(..., output_loading_info=True)`` returns. Tied weights (``lm_head.weight``
    when ``tie_word_embeddings``) are not stored and are not reported missing, so every key named here is a fault.
    """
    problems = {
        "missing from the file (they would be random)": sorted(info.get("missing_keys", ())),
        "in the file but not in the model": sorted(info.get("unexpected_keys", ())),
        "of the wrong shape": sorted(str(k) for k in info.get("mismatched_keys", ())),
    }
    found = [f"{len(keys)} {what}: {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}" for what, keys in
             problems.items() if keys]  # fmt: skip
    if found or info.get("error_msgs"):
        raise ValueError(
            f"the weights in {path}/model.safetensors do not match its config.json: "
            f"{'; '.join(found + list(info.get('error_msgs', [])))}. A checkpoint loads whole or not at all: use the "
            "folder exactly as minirl.lm.save or save_pretrained wrote it"
        )


def hub_reachable(timeout: float = 2.0) -> bool:
    """True when the Hugging Face Hub's host name resolves within ``timeout`` seconds (one DNS lookup, no download).

    ``getaddrinfo`` has no timeout of its own, so it runs in a daemon thread that is abandoned when it is too slow.
    """
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    found = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, 443))
        except OSError:  # the name does not resolve: no network, or no DNS
            pass

    probe = threading.Thread(target=lookup, daemon=True)
    probe.start()
    probe.join(timeout)
    return bool(found)


def _load_hub(name: str):
    """Model and tokenizer by hub name: from the local cache first, from the network only when it can answer."""
    try:
        return _from_pretrained(name, local_files_only=True)
    except OSError as err:
        cached_error = err
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE") or hf_constants.HF_HUB_OFFLINE
    if offline or not hub_reachable():
        reason = "HF_HUB_OFFLINE=1 is set" if offline else "the Hugging Face Hub cannot be reached (no network)"
        raise OSError(
            f"cannot load {name!r}: it is not a local folder, not in the local Hugging Face cache, and {reason}. "
            "Fix: pass the folder of a saved checkpoint, such as minirl.lm.PRETRAINED, or download the model once "
            f"where there is network (`hf download {name}`) so that it is cached."
        ) from cached_error
    return _from_pretrained(name)


def _from_pretrained(name: str, **kwargs):
    with quiet_progress():
        model, info = AutoModelForCausalLM.from_pretrained(name, output_loading_info=True, **kwargs)
    check_loading_info(name, info)
    return model, AutoTokenizer.from_pretrained(name, **kwargs)


def write_checkpoint(model, tokenizer, folder: Path, metadata: dict | None = None) -> None:
    """Write weights (safetensors), config, tokenizer and ``minirl.json`` (``metadata``) into the new folder
    ``folder``, without the atomic swap: ``save`` and ``minirl.lm.runs`` wrap it in ``_io.write_folder``."""
    with quiet_progress():
        model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    record = metadata if metadata is not None else {"written_by": "minirl"}  # the file marks the folder, even empty
    (folder / MARKER).write_text(json.dumps(record, indent=2) + "\n")


def checkpoint_folder(path: str | os.PathLike) -> Path:
    """``path`` if ``save`` may write a checkpoint there, checked before any work: new, empty, or a checkpoint minirl
    wrote. Raises ``FileExistsError`` for a folder of other files and ``ValueError`` for the current folder."""
    path = Path(path)
    if path.name in ("", ".", "..") or path.resolve() == Path.cwd().resolve():
        raise ValueError(
            f"cannot write a checkpoint to {str(path)!r}, the current folder or its parent: a checkpoint folder is "
            "replaced whole when it is saved again. Name a folder of its own, such as checkpoints/my-model"
        )
    refuse_foreign(recover_folder(path), MARKER, "checkpoint")
    return path


def save(model, tokenizer, path: str | os.PathLike, metadata: dict | None = None) -> Path:
    """Save weights (safetensors), config and tokenizer, plus ``metadata`` as ``minirl.json``, into the folder ``path``.

    The folder is written whole (``_io.write_folder``): into a temporary folder first, then moved into place, so a
    crash leaves the previous checkpoint or the new one, never half of one. ``path`` must be new, empty, or a
    checkpoint minirl wrote (it holds ``minirl.json``): a folder of other files is refused, never replaced.
    """
    path = checkpoint_folder(path)
    return write_folder(path, lambda folder: write_checkpoint(model, tokenizer, folder, metadata), MARKER)


def cache_kwarg(model) -> str:
    """The name under which ``model.forward`` takes its KV cache: ``cache`` in transformers 5, else the older one."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
