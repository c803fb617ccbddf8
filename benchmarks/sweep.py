"""Hyperparameter sweeps with Optuna over any of the three scripts, on any task, from one machine or many.

    # 20 trials on Pendulum-v1, 2 seeds each, 2 workers on this machine, SQLite in runs/sweeps.db:
    python benchmarks/sweep.py --script ppo_continuous --trials 20 --seeds 1 2 --workers 2 \\
        --space learning_rate=log:1e-4:3e-3 --space ent_coef=float:0:0.01 --space num_minibatches=choice:8,16,32 \\
        -- --env-id Pendulum-v1 --total-timesteps 100000
    # more workers, on other machines, join the same study through a database they all reach:
    python benchmarks/sweep.py ... --storage postgresql://user:password@host/db --study-name pendulum
    # the table and plots of a study, without training:
    python benchmarks/sweep.py --report-only --study-name pendulum --storage ...

Everything after `--` is the script's own command line (the task and every fixed flag, as the script reads them);
each trial draws the --space parameters on top of it and trains every --seeds seed with the script's `train()`, in a
child process of the worker's, one per trial (Genesis keeps memory of every scene it destroys). The objective is the
mean over seeds of the last --last-n training episodes' returns, or of the eval success rate (--objective success,
--eval-episodes with mean actions). Each iteration reports the recent return to Optuna's pruner (median pruning), so
hopeless trials stop early. A worker runs trials until the study has --trials finished ones; a worker that is killed
leaves its trial "running" until its heartbeat is stale, then the next worker marks it failed and runs its
parameters again. The report (results.md, plots) goes to runs/sweeps/<study>/ and ends with the best trial's command
line, to rerun it as is.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import math
import multiprocessing
import os
import shlex
import sys
import warnings
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import tyro

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

SCRIPTS = ("ppo_continuous", "ppo_recurrent", "ppo_transformer")
KINDS = ("float", "log", "int", "choice")


@dataclass
class SweepArgs:
    script: Literal["ppo_continuous", "ppo_recurrent", "ppo_transformer"] = "ppo_continuous"
    """the script whose train() each trial runs"""
    space: tyro.conf.UseAppendAction[list[str]] = field(default_factory=list)
    """a searched flag: name=float:LOW:HIGH, name=log:LOW:HIGH, name=int:LOW:HIGH or name=choice:A,B,C (repeatable)"""
    space_file: str | None = None
    """a JSON file of searched flags, {"learning_rate": "log:1e-4:3e-3", ...}, on top of --space"""
    trials: int = 20
    """finished (complete or pruned) trials the study should have; workers stop there"""
    seeds: list[int] = field(default_factory=lambda: [1])
    """seeds each trial trains (the objective is their mean)"""
    objective: Literal["return", "success"] = "return"
    """return: mean of the last --last-n training episodes' returns; success: eval success rate of the final policy"""
    last_n: int = 20
    """training episodes the return objective averages (per seed)"""
    eval_episodes: int = 100
    """episodes of the success objective's evaluation"""
    workers: int = 1
    """worker processes on this machine (other machines join with the same --storage and --study-name)"""
    study_name: str = "sweep"
    """the study (its trials, table and plots)"""
    storage: str = "sqlite:///runs/sweeps.db"
    """any database URL Optuna accepts: SQLite for one machine, PostgreSQL or MySQL for many"""
    sampler_seed: int | None = None
    """seed of the TPE sampler (each worker adds its index, and 1000 for each trial it ran before)"""
    prune: bool = True
    """stop trials whose recent return is below the median of earlier trials at the same step (Optuna's MedianPruner)"""
    report_only: bool = False
    """write the table and plots of the study, run no trial"""


class SweepError(ValueError):
    """Bad sweep input: one line naming the flag and the fix."""


def parse_value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_space(specs: dict[str, str], arg_names: set[str]) -> dict[str, tuple]:
    """{flag name: (kind, ...)} from "float:LOW:HIGH", "log:LOW:HIGH", "int:LOW:HIGH" or "choice:A,B"; names
    with dashes or underscores, checked against the script's flags."""
    space = {}
    for raw_name, spec in specs.items():
        name = raw_name.lstrip("-").replace("-", "_")
        if name not in arg_names:
            raise SweepError(f"--space {raw_name}: the script has no flag --{name.replace('_', '-')}")
        kind, _, rest = spec.partition(":")
        parts = rest.split(",") if kind == "choice" else rest.split(":")
        try:
            if kind not in KINDS:
                raise ValueError
            values = [parse_value(p) for p in parts]
            if kind != "choice":
                low, high = (int(v) if kind == "int" else float(v) for v in values)
                if not (low < high and (kind != "log" or low > 0)):
                    raise ValueError
                values = [low, high]
        except ValueError:
            raise SweepError(f"--space {raw_name}={spec}: write float:LOW:HIGH, log:LOW:HIGH (LOW > 0), int:LOW:HIGH "
                             "or choice:A,B,C") from None
        space[name] = (kind, *values)
    return space


def suggest(trial, space: dict[str, tuple]) -> dict:
    params = {}
    for name, (kind, *values) in space.items():
        if kind == "choice":
            params[name] = trial.suggest_categorical(name, values)
        elif kind == "int":
            params[name] = trial.suggest_int(name, *values)
        else:
            params[name] = trial.suggest_float(name, *values, log=kind == "log")
    return params


def command_line(script: str, script_argv: list[str], params: dict, seed: int) -> str:
    """The script's command for these parameters (the study's fixed flags, then the trial's)."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in params.items() if not isinstance(v, bool)]
    flags += [f"--{'' if v else 'no-'}{k.replace('_', '-')}" for k, v in params.items() if isinstance(v, bool)]
    return shlex.join(["python", f"{script}.py", *script_argv, *flags, f"--seed={seed}"])


def open_study(sweep: SweepArgs, worker: int = 0, create: bool = True, trial_index: int = 0):
    import optuna
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats, the plots

    if sweep.storage.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(os.path.abspath(sweep.storage[len("sqlite:///"):])) or ".", exist_ok=True)
    engine = {"connect_args": {"timeout": 60}} if sweep.storage.startswith("sqlite") else None
    # A worker's heartbeat every 30 s; a trial silent for 120 s is failed by the next worker and retried once.
    storage = RDBStorage(sweep.storage, engine_kwargs=engine, heartbeat_interval=30, grace_period=120,
                         heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1))
    seed = None if sweep.sampler_seed is None else sweep.sampler_seed + worker + 1000 * trial_index
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0) if sweep.prune
              else optuna.pruners.NopPruner())
    if not create:
        return optuna.load_study(study_name=sweep.study_name, storage=storage)
    return optuna.create_study(study_name=sweep.study_name, storage=storage, load_if_exists=True, direction="maximize",
                               sampler=optuna.samplers.TPESampler(seed=seed), pruner=pruner)


def read_returns(run_dir: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    if "charts/episodic_return" not in events.Tags()["scalars"]:
        return []
    return [event.value for event in events.Scalars("charts/episodic_return")]


def make_objective(sweep: SweepArgs, space: dict, script_argv: list[str]):
    import optuna

    module = importlib.import_module(sweep.script)
    base = module.parse_args(script_argv)

    def objective(trial) -> float:
        params = suggest(trial, space)
        trial.set_user_attr("command", command_line(sweep.script, script_argv, params, sweep.seeds[0]))
        trial.set_user_attr("pid", os.getpid())  # the process that ran it (each trial has one of its own)
        scores, steps_before = [], 0
        for seed in sweep.seeds:
            args = dataclasses.replace(base, **params, seed=seed, progress_bar=False,
                                       exp_name=f"{sweep.study_name}_t{trial.number}")
            recent: list[float] = []

            def report(metrics: dict) -> None:
                if "charts/episodic_return" in metrics:
                    recent.append(metrics["charts/episodic_return"])
                    trial.report(float(np.mean(recent[-5:])), steps_before + metrics["global_step"])
                    if trial.should_prune():
                        raise optuna.TrialPruned(f"pruned at {metrics['global_step']} steps of seed {seed}")

            try:
                summary = module.train(args, on_iteration=report)
            except module.TrainingDiverged as error:  # the worst score, not a failed trial that stops the worker
                trial.set_user_attr("diverged", str(error))
                return -math.inf
            steps_before += summary["global_step"]
            trial.set_user_attr(f"run_dir_seed{seed}", summary["run_dir"])
            if sweep.objective == "success":
                result = module.evaluate(summary["checkpoint"], episodes=sweep.eval_episodes,
                                         device=args.policy_device, sim_device=args.sim_device)
                if "success_rate" not in result:
                    raise SweepError(f"--objective success: {args.env_id} reports no success; use --objective return")
                scores.append(result["success_rate"])
            else:
                returns = read_returns(summary["run_dir"])[-sweep.last_n:]
                scores.append(float(np.mean(returns)) if returns else -math.inf)
        return float(np.mean(scores))

    return objective


def run_worker(sweep: SweepArgs, space: dict, script_argv: list[str], worker: int) -> None:
    """Runs trials until the study has --trials finished ones, each trial in a child process of its own: Genesis
    keeps memory of every scene it destroys (benchmarks/report.py's `in_child`), so one process training trial
    after trial on a Genesis task would grow until killed."""
    import optuna
    from optuna.trial import TrialState

    from benchmarks.report import in_child

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(sweep, worker)
    for trial_index in itertools.count():
        if len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))) >= sweep.trials:
            return
        in_child(run_trial, sweep, space, script_argv, worker, trial_index)


def run_trial(sweep: SweepArgs, space: dict, script_argv: list[str], worker: int, trial_index: int) -> None:
    """One trial of the study (what a worker's child runs), its sampler seeded apart from the worker's other
    trials' (the same seed would draw the same startup parameters again)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(sweep, worker, trial_index=trial_index)
    study.optimize(make_objective(sweep, space, script_argv), n_trials=1)


def write_report(sweep: SweepArgs) -> str:
    """results.md (every trial, best first, and the best trial's command) and Optuna's plots, in
    runs/sweeps/<study>/; returns the best trial's command line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as plots
    from optuna.trial import TrialState

    study = open_study(sweep, create=False)
    trials = study.get_trials(deepcopy=False)
    finished = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: -t.value)
    out_dir = os.path.join("runs", "sweeps", sweep.study_name)
    os.makedirs(out_dir, exist_ok=True)
    names = sorted({name for t in trials for name in t.params})
    lines = [f"# Study {sweep.study_name}", "", f"{len(finished)} complete, "
             f"{sum(t.state == TrialState.PRUNED for t in trials)} pruned, "
             f"{sum(t.state == TrialState.FAIL for t in trials)} failed, "
             f"{sum(t.state == TrialState.RUNNING for t in trials)} running.", "",
             "| trial | state | objective | " + " | ".join(names) + " |", "|---" * (3 + len(names)) + "|"]
    order = finished + [t for t in trials if t.state != TrialState.COMPLETE]
    for t in order:
        value = f"{t.value:.4g}" if t.value is not None else ""
        lines.append(f"| {t.number} | {t.state.name.lower()} | {value} | "
                     + " | ".join(f"{t.params[n]:.4g}" if isinstance(t.params.get(n), float)
                                  else str(t.params.get(n, "")) for n in names) + " |")
    best_command = finished[0].user_attrs.get("command", "") if finished else ""
    if finished:
        lines += ["", f"Best: trial {finished[0].number}, objective {finished[0].value:.4g}. Rerun it with:", "",
                  f"    {best_command}"]
    for name, plot in (("history", plots.plot_optimization_history), ("intermediate", plots.plot_intermediate_values),
                       ("parallel", plots.plot_parallel_coordinate), ("importances", plots.plot_param_importances)):
        try:
            plot(study)
        except (ValueError, RuntimeError, ZeroDivisionError):  # too few trials or parameters for this plot
            plt.close("all")
            continue
        plt.gcf().set_size_inches(8, 5)
        plt.tight_layout()
        plt.savefig(os.path.join(out_dir, f"{name}.png"), dpi=90)
        plt.close("all")
        lines += ["", f"![{name}]({name}.png)"]
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "best.json"), "w") as f:
        json.dump({"trial": finished[0].number, "value": finished[0].value, "params": finished[0].params,
                   "command": best_command} if finished else {}, f, indent=2)
    return best_command


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    sweep, script_argv = tyro.cli(SweepArgs, args=argv[:split]), argv[split + 1:]
    try:
        if not sweep.report_only:
            module = importlib.import_module(sweep.script)
            specs = dict(s.split("=", 1) if "=" in s else (s, "") for s in sweep.space)
            if sweep.space_file:
                with open(sweep.space_file) as f:
                    specs = {**json.load(f), **specs}
            if not specs:
                raise SweepError("--space: nothing to search; e.g. --space learning_rate=log:1e-4:3e-3")
            for name, ok, requirement in (("trials", sweep.trials >= 1, "at least 1"), ("workers", sweep.workers >= 1,
                                          "at least 1"), ("last_n", sweep.last_n >= 1, "at least 1"),
                                          ("seeds", bool(sweep.seeds), "one seed or more")):
                if not ok:
                    raise SweepError(f"--{name.replace('_', '-')} must be {requirement}")
            space = parse_space(specs, {f.name for f in dataclasses.fields(module.Args)})
            try:
                module.resolve_args(module.parse_args(script_argv))  # the fixed flags, checked once before any trial
            except module.UsageError as error:
                raise SweepError(f"after --: {error}") from None
            open_study(sweep)  # created once, before the workers race to create it
            if sweep.workers == 1:
                run_worker(sweep, space, script_argv, 0)
            else:
                context = multiprocessing.get_context("spawn")
                workers = [context.Process(target=run_worker, args=(sweep, space, script_argv, i))
                           for i in range(sweep.workers)]
                for worker in workers:
                    worker.start()
                for worker in workers:
                    worker.join()
                if any(worker.exitcode for worker in workers):
                    print(f"warning: workers exited with {[w.exitcode for w in workers]}", file=sys.stderr)
        best = write_report(sweep)
    except SweepError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"report: {os.path.join('runs', 'sweeps', sweep.study_name, 'results.md')}")
    if best:
        print(f"best trial's command: {best}")


if __name__ == "__main__":
    main()
