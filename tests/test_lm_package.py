"""``minirl.lm`` imports its modules lazily: every one of them must still be reachable as an attribute, in a fresh
interpreter where nothing else has imported it first (a notebook writes ``lm.tokenizer.TAGS``)."""

import subprocess
import sys
from pathlib import Path

import minirl.lm

MODULES = sorted(p.stem for p in Path(minirl.lm.__file__).parent.glob("*.py") if p.stem not in ("__init__", "cli"))


def test_every_module_is_an_attribute_of_a_fresh_minirl_lm():
    code = "from minirl import lm; import types\n" + "".join(
        f"assert isinstance(lm.{name}, types.ModuleType), {name!r}\n" for name in MODULES
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_public_name_resolves():
    code = "from minirl import lm\nfor name in lm.__all__: getattr(lm, name)\n"
    subprocess.run([sys.executable, "-c", code], check=True)
