"""Saving and resuming a language-model training run: the one place the LM trainers write and read their state.

A run folder ``OUT`` (claimed with ``start_run``, so minirl never writes into a folder of someone else's) holds one
checkpoint, written whole by ``_io.write_folder``, so that a crash at any moment leaves a complete one, old or new:

    OUT/.minirl-run              marks OUT as a minirl run folder
    OUT/checkpoint/model/        the policy, loadable with ``minirl.lm.load(OUT/checkpoint/model)``
    OUT/checkpoint/NAME/         further models under their names (``value/``, ...), the same way
    OUT/checkpoint/optimizer.safetensors   every optimizer's tensors (AdamW's moments and step counts)
    OUT/checkpoint/state.safetensors       extra tensors of the trainer (random-number state, ...), if any
    OUT/checkpoint/trainer.json  the trainer's name, step, history rows, evaluations, the config, optimizer settings

Nothing in it is pickle: tensors are safetensors and the rest is JSON, so loading a checkpoint cannot run code.
``check_resume`` refuses to continue a run with settings that change its math, naming the fields.
"""

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from minirl._io import claim_folder, load_optimizer_state, optimizer_state, recover_folder, write_folder
from minirl.lm.model import write_checkpoint

CHECKPOINT = "checkpoint"  # the folder inside OUT
MARKER = "trainer.json"  # written into every checkpoint; write_folder replaces only folders holding it
FREE = ("steps", "eval_every", "eval_n", "save_every", "threads", "device", "out", "resume")  # may change on resume


@dataclass
class SavedRun:
    """A checkpoint read back by ``load_run``: where it is, the trainer's JSON state and its config (a dict)."""

    folder: Path  # OUT/checkpoint
    trainer: str  # the name save_run was given ("grpo", "rlhf", ...)
    state: dict  # what save_run got as state: step, history rows, evaluations, ...
    config: dict  # the config of the run that wrote it
    optimizers: dict = field(default_factory=dict)  # name -> param groups and scalars (JSON) of each optimizer

    @property
    def step(self) -> int:
        return int(self.state["step"])

    def model_path(self, name: str = "model") -> Path:
        """The folder of model ``name``; a causal LM in it loads with ``minirl.lm.load``, another with
        ``load_weights``."""
        path = self.folder / name
        if not path.is_dir():
            raise FileNotFoundError(f"{self.folder} holds no model {name!r}; it holds {self.model_names()}")
        return path

    def model_names(self) -> list[str]:
        return sorted(p.name for p in self.folder.iterdir() if p.is_dir())

    def load_optimizer(self, name: str, optimizer: torch.optim.Optimizer) -> None:
        """Restore the optimizer saved as ``name`` into ``optimizer``, built over the same parameters, in order."""
        if name not in self.optimizers:
            raise KeyError(f"{self.folder} holds no optimizer {name!r}; it holds {sorted(self.optimizers)}")
        prefix = f"{name}."
        tensors = load_file(self.folder / "optimizer.safetensors")
        mine = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        load_optimizer_state(optimizer, mine, self.optimizers[name])

    def tensors(self) -> dict[str, torch.Tensor]:
        """The extra tensors given to ``save_run`` (an empty dict when there were none)."""
        path = self.folder / "state.safetensors"
        return load_file(path) if path.exists() else {}


def free_settings(cfg) -> tuple[str, ...]:
    """The settings a resume of ``cfg``'s run may change: ``FREE``, less ``steps`` when the config has an lr schedule
    other than "constant" (a cosine's lr at every step depends on the number of steps; a warm-up does not)."""
    return FREE if getattr(cfg, "schedule", "constant") == "constant" else tuple(f for f in FREE if f != "steps")


def start_run(cfg, trainer: str) -> tuple[Path | None, "SavedRun | None", list[dict]]:
    """Claim ``cfg.out`` for a run before any work starts, and read its checkpoint when ``cfg.resume`` asks for it.

    Refuses (FileExistsError) a non-empty folder that minirl did not make, and a folder that already holds a run's
    checkpoint when ``cfg.resume`` is False: starting over would replace it; refuses (``check_resume``) a resume whose
    settings change the math: any field outside ``free_settings(cfg)``. Returns ``(out, saved, resumes)``:
    ``(None, None, [])`` without ``cfg.out``, and ``resumes`` the record of every resume so far (its step and the free
    settings that changed), to save again.
    """
    if not cfg.out:
        return None, None, []
    out = claim_folder(cfg.out, "run")
    saved = load_run(out)
    if saved is None:
        return out, None, []
    if not cfg.resume:
        raise FileExistsError(
            f"{out} already holds the checkpoint of a {saved.trainer} run at step {saved.step}; starting again there "
            "would replace it. Pass --resume (resume=True) to continue that run, or choose another output folder"
        )
    changed = check_resume(saved, cfg, trainer, free_settings(cfg))
    return out, saved, saved.state.get("resumes", []) + [{"step": saved.step, "changed": changed}]


def save_run(
    out: str | os.PathLike,
    models: dict,
    tokenizer,
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict,
    config,
    trainer: str,
    tensors: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``OUT/checkpoint`` whole and return its path.

    Args:
        models: name -> model; "model" is the policy. A Hugging Face model is saved with its tokenizer (loadable with
            ``minirl.lm.load``); any other ``nn.Module`` as ``NAME/model.safetensors`` (``load_weights`` reads it).
        optimizers: name -> optimizer; tensors go to safetensors, the param groups (lr, betas, ...) to JSON.
        state: JSON-ready values: ``step`` (required), history rows, evaluations, ...
        config: the run's config dataclass, stored as a dict for ``check_resume``.
        trainer: the trainer's name, recorded so that another trainer's checkpoint is recognised.
        tensors: extra tensors to keep (a generator's state, ...), read back with ``SavedRun.tensors``.
    """
    if "model" not in models:
        raise ValueError(f"models must include the policy under the name 'model', got {sorted(models)}")
    if "step" not in state:
        raise ValueError("state must include 'step', the number of completed training steps")
    config = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)

    def fill(folder: Path) -> None:
        for name, model in models.items():
            _write_model(model, tokenizer, folder / name, {"trainer": trainer, "step": state["step"]})
        flat, metas = {}, {}
        for name, optimizer in optimizers.items():
            opt_tensors, metas[name] = optimizer_state(optimizer)
            flat.update({f"{name}.{k}": v.cpu() for k, v in opt_tensors.items()})
        save_file(flat, folder / "optimizer.safetensors")
        if tensors:
            save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, folder / "state.safetensors")
        record = {"trainer": trainer, "state": state, "config": config, "optimizers": metas}
        (folder / MARKER).write_text(json.dumps(record, indent=1) + "\n")  # last: it marks a complete checkpoint

    return write_folder(Path(out) / CHECKPOINT, fill, MARKER)


def load_run(out: str | os.PathLike) -> SavedRun | None:
    """The checkpoint in ``OUT/checkpoint``, or None when there is none; JSON and safetensors only, never pickle.

    Finishes or undoes a checkpoint write that a crash interrupted first (``_io.recover_folder``), so the complete
    copy is found wherever the crash left it.
    """
    folder = recover_folder(Path(out) / CHECKPOINT)
    if not folder.exists():
        return None
    if not (folder / MARKER).is_file():
        raise FileNotFoundError(
            f"{folder} has no {MARKER}, so it is not a checkpoint minirl wrote (or it was damaged); move it away, or "
            "choose another output folder"
        )
    try:
        record = json.loads((folder / MARKER).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{folder / MARKER} is not valid JSON ({err}); the checkpoint is damaged") from err
    return SavedRun(folder, record["trainer"], record["state"], record["config"], record.get("optimizers", {}))


def check_resume(saved: SavedRun, cfg, trainer: str, free: tuple[str, ...] = FREE) -> dict:
    """Raise unless ``cfg`` may continue ``saved``: the same trainer, and every field outside ``free`` as saved.

    A field that changes the math (task, model, group size, learning rate, ...) would make the resumed run neither the
    old one nor a new one: the optimizer carries the old learning rate, the history mixes two runs. Returns the free
    fields that changed, ``{name: [old, new]}``, for the record (``resume`` itself left out: it always changes).
    """
    if saved.trainer != trainer:
        raise ValueError(
            f"{saved.folder} holds a {saved.trainer} checkpoint, not a {trainer} one; choose another output folder"
        )
    now = json.loads(json.dumps(dataclasses.asdict(cfg)))  # tuples become lists, as in the saved JSON
    defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.default is not dataclasses.MISSING}
    changed = {}
    for name in sorted(set(now) | set(saved.config)):
        old = saved.config.get(name, defaults.get(name))  # a field newer than the checkpoint ran at its default
        if old != now.get(name):
            changed[name] = [old, now.get(name)]
    math_changes = {k: v for k, v in changed.items() if k not in free}
    if math_changes:
        listed = ", ".join(f"{k} (saved {v[0]!r}, now {v[1]!r})" for k, v in math_changes.items())
        options = " ".join(f"--{k.replace('_', '-')} {v[0]}" for k, v in math_changes.items())
        raise ValueError(
            f"cannot resume the run in {saved.folder.parent}: these settings change the training math: {listed}. "
            f"Resume with the saved values ({options}), or start a new run in another output folder. Only "
            f"{', '.join(free)} may change on resume"
        )
    return {k: v for k, v in changed.items() if k in free and k != "resume"}


def load_weights(module: torch.nn.Module, folder: str | os.PathLike) -> None:
    """Load ``folder/model.safetensors`` (written by ``save_run`` for a plain ``nn.Module``) into ``module``; every
    tensor must match, none missing or extra."""
    path = Path(folder) / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; the checkpoint is incomplete")
    missing, unexpected = load_model(module, path, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not match the module: missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}; "
            "build the module with the same sizes as the run that saved it"
        )


def _write_model(model, tokenizer, folder: Path, metadata: dict) -> None:
    """A Hugging Face model with its tokenizer (``minirl.lm.load`` reads it), or a plain module's weights."""
    if hasattr(model, "save_pretrained"):
        write_checkpoint(model, tokenizer, folder, metadata)
    else:
        folder.mkdir()
        save_model(model, str(folder / "model.safetensors"))  # handles tied (shared) tensors, unlike save_file
