"""Grade a student's Python file: ``python -m minirl.checks student.py``.

The file is imported (so it runs: grade inside a sandbox, as with any autograder), and every function it defines
under a name of ``minirl.checks.EXERCISES`` is checked, also when the name carries the notebooks' ``my_`` prefix:

    td_target, policy_gradient_theorem, discounted_returns, fisher_vector_product, conjugate_gradient,
    ppo_clip_loss, gae, group_advantages, token_logprobs, bradley_terry_loss, token_rewards,
    kl (checked for k1, k2 and k3), format_reward, verified

Each check prints its line or its failure. The exit status is 0 when every check found passes, and 1 when one fails,
none is found, or the file cannot be imported.
"""

import importlib.util
import sys
import traceback
from pathlib import Path

from minirl.checks import EXERCISES, CheckFailed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].endswith(".py"):
        print("usage: python -m minirl.checks student.py", file=sys.stderr)
        return 1
    path = Path(argv[0])
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:  # a syntax error or a crash at import: the student sees it, the grade is a fail
        traceback.print_exc()
        print(f"could not import {path}", file=sys.stderr)
        return 1
    found, failed = 0, 0
    for name, check in EXERCISES.items():
        fn = getattr(module, name, None) or getattr(module, f"my_{name}", None)
        if fn is None:
            continue
        found += 1
        try:
            check(fn)
        except CheckFailed as failure:
            print(failure)
            failed += 1
    if not found:
        print(f"{path} defines none of the functions checked: {', '.join(EXERCISES)} (or my_<name>)", file=sys.stderr)
        return 1
    print(f"{found - failed} of {found} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
