"""benchmarks/sweep.py: an Optuna study on Pendulum-v1 in SQLite, run by two worker processes at once."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

from conftest import REPO, SLOW_MACHINE_S, run_cli

SWEEP = os.path.join(REPO, "benchmarks", "sweep.py")
TINY = ["--env-id", "Pendulum-v1", "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2",
        "--update-epochs", "2", "--total-timesteps", "512", "--env-kwargs", "max_episode_steps", "32",
        "--policy-device", "cpu"]


def sweep(*flags, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SWEEP, *flags], cwd=cwd, capture_output=True, text=True,
                          timeout=SLOW_MACHINE_S)


def test_two_workers_share_one_sqlite_study_without_duplicates_and_the_best_command_reruns(tmp_path):
    """Bugs: workers racing for trial numbers or drawing the same parameters; a worker training its trials one after
    another in one process (Genesis keeps memory of every scene it destroys: a Genesis sweep grows until killed)."""
    done = sweep("--trials", "6", "--workers", "2", "--sampler-seed", "0", "--last-n", "5", "--no-prune",
                 "--space", "learning_rate=log:1e-4:3e-3", "--space", "num-minibatches=choice:2,4", "--", *TINY,
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    with sqlite3.connect(tmp_path / "runs" / "sweeps.db") as db:
        trials = db.execute("SELECT trial_id, number, state FROM trials").fetchall()
        params = db.execute("SELECT trial_id, param_name, param_value FROM trial_params").fetchall()
    numbers = [number for _, number, _ in trials]
    assert len(numbers) == len(set(numbers)) >= 6  # both workers drew trial numbers from the one study
    assert all(state == "COMPLETE" for *_, state in trials)
    with sqlite3.connect(tmp_path / "runs" / "sweeps.db") as db:
        pids = db.execute("SELECT value_json FROM trial_user_attributes WHERE key = 'pid'").fetchall()
    assert len(set(pids)) == len(pids) == len(trials)  # each trial in a process of its own: Genesis keeps memory
    drawn = {}
    for trial_id, name, value in params:
        drawn.setdefault(trial_id, {})[name] = value
    assert len({tuple(sorted(p.items())) for p in drawn.values()}) == len(drawn) == len(trials)  # none run twice
    runs = [d for d in os.listdir(tmp_path / "runs") if d.startswith("Pendulum-v1__sweep_t")]
    assert len(runs) == len(trials)  # one run per trial and seed

    best = json.loads((tmp_path / "runs" / "sweeps" / "sweep" / "best.json").read_text())
    assert best["value"] == max(v for v in _objectives(tmp_path))
    assert f"best trial's command: {best['command']}" in done.stdout
    report = (tmp_path / "runs" / "sweeps" / "sweep" / "results.md").read_text()
    assert best["command"] in report and (tmp_path / "runs" / "sweeps" / "sweep" / "history.png").exists()
    # The printed command reruns the best trial as is: its run has the best parameters.
    command = best["command"].split()
    assert command[:2] == ["python", "ppo_continuous.py"]
    rerun = run_cli(command[1].removesuffix(".py"), *command[2:], "--exp-name", "rerun", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    (run,) = [d for d in os.listdir(tmp_path / "runs") if "__rerun__" in d]
    saved = json.loads((tmp_path / "runs" / run / "args.json").read_text())
    assert saved["learning_rate"] == best["params"]["learning_rate"]
    assert saved["num_minibatches"] == best["params"]["num_minibatches"]


def _objectives(tmp_path):
    with sqlite3.connect(tmp_path / "runs" / "sweeps.db") as db:
        return [value for (value,) in db.execute("SELECT value FROM trial_values")]


def test_a_space_naming_no_flag_or_a_bad_range_is_refused_in_one_line(tmp_path):
    for space, expected in (("learning_rat=log:1e-4:1e-3", "has no flag --learning-rat"),
                            ("learning_rate=log:0:1e-3", "log:LOW:HIGH (LOW > 0)")):
        done = sweep("--space", space, "--", *TINY, cwd=tmp_path)
        assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr
    assert not os.path.exists(tmp_path / "runs")  # refused before anything was written


def test_a_trial_whose_training_diverges_scores_worst_and_the_sweep_goes_on(tmp_path):
    """Bug: a sampled learning rate that blows the weights up to NaN ending the whole sweep with a traceback (or,
    before runs stopped on divergence, scoring the NaN policy's one-step episodes as if it had trained)."""
    import optuna

    done = sweep("--trials", "2", "--workers", "1", "--no-prune", "--space", "learning_rate=log:1e29:1e30", "--",
                 *TINY, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{tmp_path / 'runs' / 'sweeps.db'}")
    assert len(study.trials) == 2
    for trial in study.trials:
        assert trial.state.name == "COMPLETE" and trial.value == float("-inf")
        assert trial.user_attrs["diverged"].startswith("training diverged: iteration 1's update")
