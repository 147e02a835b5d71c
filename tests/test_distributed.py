"""Training on 2 processes (DDP under torchrun, gloo on the CPU) takes the step 1 process takes on the same global
batch: SFT, GRPO (with a process that has no row with signal, and with a KL, token-mean and 2 iterations) and
RLHF-PPO (policy and critic), on the committed checkpoint."""

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import _ddp_worker
import pytest
import torch
from safetensors.torch import load_file

from minirl.lm import PRETRAINED, distributed, load

WORKER = Path(__file__).with_name("_ddp_worker.py")
LOGGED = ("loss", "reward", "accuracy", "length", "entropy", "rows_trained", "rows_computed", "clip_frac", "kl_old",
          "kl_ref", "policy_loss", "value_loss", "score", "explained_variance")  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # port 0: the system picks a free one
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> Path:
    """Every run of ``_ddp_worker`` on 2 processes, launched once; the folder of rank 0's results."""
    out = tmp_path_factory.mktemp("ddp")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(WORKER), str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return out


@pytest.mark.parametrize("name", _ddp_worker.RUNS)
def test_two_processes_take_the_step_of_one(two_processes, name, one_thread):
    one, history = _ddp_worker.RUNS[name]()
    two = load_file(two_processes / f"{name}.safetensors")
    two_history = json.loads((two_processes / f"{name}.json").read_text())["history"]
    assert sorted(one) == sorted(two)
    start = load(PRETRAINED, device="cpu")[0].state_dict()
    update = max((one[k] - start[k]).abs().max().item() for k in start)
    assert update > 5e-5  # a real step was taken (lr 1e-4), so agreeing is not trivial
    for key in one:  # the same up to float sums in another order (measured: at most 2e-6, for the critic)
        torch.testing.assert_close(two[key], one[key], atol=1e-5, rtol=0, msg=f"{name}: {key}")
    for row, two_row in zip(history, two_history, strict=True):  # the log is the global one
        for key in set(LOGGED) & set(row):
            if not math.isnan(row[key]):
                assert two_row[key] == pytest.approx(row[key], rel=1e-4, abs=1e-6), (name, key)
    if name == "grpo_idle":  # only the first 2 prompts carry signal: process 1 joined the average with a zero
        assert history[0]["rows_computed"] == 8 == two_history[0]["rows_computed"]


def test_an_uneven_split_is_refused(monkeypatch):
    monkeypatch.setattr(distributed, "world_size", lambda: 3)
    with pytest.raises(ValueError, match=r"prompts_per_step \(16\) must be a multiple of the number of processes"):
        distributed.shard(16, "prompts_per_step")
    assert distributed.shard(15, "prompts_per_step") == slice(0, 5)
