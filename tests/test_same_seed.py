"""The same seed gives the same numbers as recorded: the parameters and losses after a short training of each
script, on Pendulum-v1 and on the Genesis arm, against tests/data/same_seed.json.

Its purpose is a refactor that moves code (issue 42: the loop as module-level functions) and must not change one
number: run it before and after. Recorded on this project's 2-core CPU machines with torch 2.13.0; compared to 1e-5
of the size of what is summed, so that another CPU's kernels (summing in another order) do not fail it while any
change to the algorithm does. `python tests/test_same_seed.py` records the numbers again (only after a change meant
to alter them).
"""

from __future__ import annotations

import json
import math
import os
import sys

import pytest
import torch

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [TESTS, os.path.dirname(TESTS)]  # as pytest.ini's pythonpath, for the recording run
from conftest import SCRIPTS, script_named  # noqa: E402

RECORD = os.path.join(TESTS, "data", "same_seed.json")
TASKS = {"pendulum": {},
         "arm": dict(num_envs=64, num_steps=24, num_minibatches=4, update_epochs=2,
                     env_kwargs={"max_episode_steps": 30})}


def numbers(name: str, task: str) -> dict:
    """Three iterations of the script's tiny run (or of the arm with 64 envs): per parameter its sum and sum of
    squares (float64), and every logged loss of every iteration."""
    script = script_named(name)
    if task == "pendulum":
        args = script.args()
    else:
        args = script.args(**script.genesis, **TASKS[task])
    args.total_timesteps = 3 * args.num_envs * args.num_steps
    summary = script.module.train(args)
    model = torch.load(summary["checkpoint"], weights_only=True)["model"]
    params = {k: [v.double().sum().item(), v.double().square().sum().item()] for k, v in model.items()}
    losses = [{k: v for k, v in h.items() if k.startswith("losses/")} for h in summary["history"]]
    return {"params": params, "losses": losses}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("name", SCRIPTS)
def test_same_seed_training_gives_the_recorded_numbers(name, task, in_tmp):
    """Bug: a refactor that changes what is learnt (a step reordered, a stale variable, a random draw added)."""
    with open(RECORD) as f:
        expected = json.load(f)[f"{name}/{task}"]
    got = numbers(name, task)
    assert got["params"].keys() == expected["params"].keys()
    # Tolerances by the size of what is summed, not of the sum: a parameter's sum (which cancels) to 1e-5 of its L2
    # norm, its sum of squares to 1e-5 of itself; a loss (a mean of float32 terms of about one) to 1e-6 at least.
    # Another CPU's kernels (an AVX2 one's, not the recording machine's) moved a sum of -0.0229 by 3e-7 and a policy
    # loss of 3.4e-5 by 6.5e-9; a changed algorithm moves each weight by about a step (1e-4 or more).
    for key, (total, squares) in expected["params"].items():
        assert got["params"][key][0] == pytest.approx(total, abs=1e-5 * math.sqrt(squares)), key
        assert got["params"][key][1] == pytest.approx(squares, rel=1e-5, abs=1e-12), key
    assert len(got["losses"]) == len(expected["losses"])
    for got_row, row in zip(got["losses"], expected["losses"]):
        assert got_row.keys() == row.keys()
        for key, value in row.items():
            assert got_row[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


if __name__ == "__main__":
    import tempfile

    os.chdir(tempfile.mkdtemp())
    record = {f"{name}/{task}": numbers(name, task) for name in SCRIPTS for task in TASKS}
    with open(RECORD, "w") as f:
        json.dump(record, f, indent=1)
    print(f"recorded {RECORD}")
