"""Saving and loading: local folders, the offline hub, vocabularies that do not match, crashes mid-save, damaged
checkpoints, and folders that minirl did not write."""

import os
import shutil
import time

import huggingface_hub
import pytest
import torch
from safetensors.torch import load_file, save_file

from minirl.lm import PRETRAINED, build_tokenizer, load, make_model, save, tiny_config
from minirl.lm import model as model_module

SIZES = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_the_default_model_is_a_small_llama(tok):
    model = make_model(tok)
    n = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < n < 1.2e6  # the committed fp32 checkpoint stays under 5 MB
    assert model.config.model_type == "llama" and model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tok) and model.config.eos_token_id == tok.eos_token_id
    assert torch.equal(make_model(tok, seed=3).lm_head.weight, make_model(tok, seed=3).lm_head.weight)


def test_save_then_load_from_a_local_path(tok, tmp_path):
    model = make_model(tok, seed=1, **SIZES).eval()
    save(model, tok, tmp_path / "ck", metadata={"note": "test"})
    assert {"model.safetensors", "config.json", "tokenizer.json", "minirl.json"} <= set(os.listdir(tmp_path / "ck"))
    loaded, loaded_tok = load(tmp_path / "ck", device="cpu")
    ids = tok(["347+585=<think>", "1+1="], padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(loaded(**ids).logits, model(**ids).logits)
    assert loaded_tok("12+3=")["input_ids"] == tok("12+3=")["input_ids"] and loaded_tok.padding_side == "left"
    assert not loaded.training and loaded.device.type == "cpu"


def test_a_hub_name_offline_fails_with_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # the variable is read at import time
    with pytest.raises(OSError, match="cannot load 'someone/some-model'") as err:
        load("someone/some-model")
    assert "HF_HUB_OFFLINE=1" in str(err.value) and "minirl.lm.PRETRAINED" in str(err.value)


def test_a_checkpoint_from_another_vocabulary_is_refused(tok, tmp_path):
    bigger = build_tokenizer()
    bigger.add_tokens(["<tool>", "</tool>"])
    save(make_model(tok, **SIZES), bigger, tmp_path / "ck")
    with pytest.raises(ValueError, match="different vocabularies"):
        load(tmp_path / "ck")


def test_a_crash_mid_save_leaves_the_previous_checkpoint(tok, tmp_path, monkeypatch):
    path = tmp_path / "ck"
    save(make_model(tok, seed=1, **SIZES), tok, path)
    before = {name: (path / name).read_bytes() for name in os.listdir(path)}

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(type(tok), "save_pretrained", crash)  # the weights are written, then the tokenizer fails
    with pytest.raises(RuntimeError, match="disk full"):
        save(make_model(tok, seed=2, **SIZES), tok, path)
    assert {name: (path / name).read_bytes() for name in os.listdir(path)} == before
    assert os.listdir(tmp_path) == ["ck"]  # no temporary folder left behind

    monkeypatch.undo()
    save(make_model(tok, seed=2, **SIZES), tok, path)  # a save that succeeds replaces the checkpoint
    assert (path / "model.safetensors").read_bytes() != before["model.safetensors"]
    assert os.listdir(tmp_path) == ["ck"]


def test_bad_sizes_are_named(tok):
    with pytest.raises(ValueError, match="multiple of num_heads"):
        tiny_config(tok, hidden_size=30, num_heads=4)


# --- a checkpoint loads whole or not at all ---


def broken_copy(tmp_path, damage: str):
    """A copy of the committed checkpoint with one kind of damage, as a crash, a bad copy or an edit could leave it."""
    path = tmp_path / damage
    shutil.copytree(PRETRAINED, path)
    weights = load_file(path / "model.safetensors")
    if damage == "missing tensor":
        del weights["model.layers.0.mlp.up_proj.weight"]
    elif damage == "renamed tensor":
        weights["model.norm.scale"] = weights.pop("model.norm.weight")
    elif damage == "wrong shape":
        weights["model.norm.weight"] = weights["model.norm.weight"][:-1].clone()
    if damage in ("missing tensor", "renamed tensor", "wrong shape"):
        save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    elif damage == "truncated weights":
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "no config":
        (path / "config.json").unlink()
    elif damage == "half tokenizer":
        text = (path / "tokenizer.json").read_text()
        (path / "tokenizer.json").write_text(text[: len(text) // 2])
    return path


@pytest.mark.parametrize(
    "damage, error, match",
    [
        ("missing tensor", ValueError, r"1 missing from the file.*up_proj"),
        ("renamed tensor", ValueError, r"missing from the file.*model\.norm\.weight.*not in the model.*norm\.scale"),
        ("wrong shape", OSError, r"model\.safetensors: missing, truncated, damaged, or of other shapes"),
        ("truncated weights", OSError, r"model\.safetensors: missing, truncated, damaged"),
        ("no config", OSError, r"config\.json is missing"),
        ("half tokenizer", OSError, r"tokenizer\.json or tokenizer_config\.json is missing or damaged"),
    ],
)
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path, damage, error, match):
    with pytest.raises(error, match=match):
        load(broken_copy(tmp_path, damage), device="cpu")


def test_tied_weights_are_not_reported_missing():
    """The committed model ties lm_head to the embedding, so lm_head.weight is not in the file, and loads fine."""
    assert "lm_head.weight" not in load_file(PRETRAINED / "model.safetensors")
    model, _ = load(PRETRAINED, device="cpu")
    assert model.lm_head.weight is model.get_input_embeddings().weight


# --- writing only where minirl may ---


def test_save_refuses_a_folder_it_did_not_write(tok, tmp_path, monkeypatch):
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match="not written by minirl.*Choose a new or empty folder"):
        save(make_model(tok, **SIZES), tok, mine)
    assert [p.name for p in mine.iterdir()] == ["chapter1.tex"] and oct(mine.stat().st_mode & 0o777) != "0o700"
    monkeypatch.chdir(tmp_path / "thesis")
    for here in (".", str(tmp_path / "thesis")):
        with pytest.raises(ValueError, match="current folder"):
            save(make_model(tok, **SIZES), tok, here)


def test_save_replaces_its_own_checkpoint_with_normal_permissions(tok, tmp_path):
    path = tmp_path / "ck"
    shutil.copytree(PRETRAINED, path)  # the committed checkpoints hold minirl.json: minirl's own
    save(make_model(tok, seed=1, **SIZES), tok, path)
    assert oct(path.stat().st_mode & 0o777) == "0o755" and oct((path / "config.json").stat().st_mode & 0o777) == "0o644"
    assert load(path)[0].config.hidden_size == SIZES["hidden_size"]


# --- a hub name offline fails fast ---


def test_a_hub_name_offline_fails_fast_with_the_env_var(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(OSError, match="HF_HUB_OFFLINE=1 is set.*hf download someone/some-model"):
        load("someone/some-model")
    assert time.perf_counter() - start < 5


def test_a_hub_name_without_network_fails_fast(monkeypatch):
    """Without HF_HUB_OFFLINE, one quick lookup of the hub's host decides; here it is made to fail."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(model_module, "hub_reachable", lambda timeout=2.0: False)
    start = time.perf_counter()
    with pytest.raises(OSError, match="cannot be reached.*minirl.lm.PRETRAINED"):
        load("someone/some-model")
    assert time.perf_counter() - start < 5


def test_the_hub_probe_is_bounded_in_time(monkeypatch):
    def slow_dns(*args):
        time.sleep(30)

    monkeypatch.setattr(model_module.socket, "getaddrinfo", slow_dns)
    start = time.perf_counter()
    assert not model_module.hub_reachable(timeout=0.2)
    assert time.perf_counter() - start < 2


@pytest.mark.parametrize("hook", [True, False], ids=["tqdm-hook", "no-hook"])
def test_load_and_save_draw_no_progress_bars(tok, tmp_path, capfd, monkeypatch, hook):
    """transformers 5 draws "Loading weights" and "Writing model shards" bars; on the course's tiny checkpoints they
    are only clutter in the notebooks, so minirl's load and save hide them, and only for their own calls (also with a
    transformers that has no ``set_tqdm_hook``)."""
    from transformers.utils import logging as hf_logging

    if not hook:
        monkeypatch.delattr(hf_logging, "set_tqdm_hook", raising=False)
    model = make_model(tok, seed=1, **SIZES)
    capfd.readouterr()
    save(model, tok, tmp_path / "ck")
    load(tmp_path / "ck", device="cpu")
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err and "%|" not in err, err
    with hf_logging.tqdm(range(3), desc="a bar of the caller's") as bar:  # transformers' own bars work as before
        list(bar)
    assert "a bar of the caller's" in capfd.readouterr().err
