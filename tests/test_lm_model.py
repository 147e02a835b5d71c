"""Saving and loading: local folders, the offline hub, vocabularies that do not match, crashes mid-save."""

import os

import huggingface_hub
import pytest
import torch

from minirl.lm import build_tokenizer, load, make_model, save, tiny_config

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
