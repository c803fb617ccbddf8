"""benchmarks/: the report's reducer on small synthetic event files, the runners, the side-by-side parsers and the
update timer on a tiny batch (no training runs, no timing assertions)."""

import dataclasses
import glob
import itertools
import json
import math
import os
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from benchmarks import report, run


def fake_run(root, env_id, seed, returns, steps_per_episode=1000, total=1_000_000, exp="bench"):
    path = os.path.join(root, f"{env_id}__{exp}__{seed}__1700000000")
    os.makedirs(path)
    with open(os.path.join(path, "args.json"), "w") as f:
        json.dump({"env_id": env_id, "seed": seed, "total_timesteps": total, "exp_name": exp}, f)
    writer = SummaryWriter(path)
    for i, value in enumerate(returns):
        writer.add_scalar("charts/episodic_return", value, (i + 1) * steps_per_episode, walltime=1000.0 + i)
    writer.close()
    return path


def add_timing(run):
    """The timing scalars eval_compare reads a run's wall time from: one minute between steps 1,000 and 2,000."""
    writer = SummaryWriter(run)
    for name, value in (("charts/SPS", 100.0), ("time/rollout_s", 1.0), ("time/update_s", 1.0)):
        writer.add_scalar(name, value, 1000, walltime=1000.0)
    writer.add_scalar("charts/SPS", 100.0, 2000, walltime=1060.0)
    writer.close()


def test_final_return_is_the_mean_of_the_last_100_episodes(tmp_path):
    """Bug: reducing over all episodes, the last iteration only, or the wrong end of the run."""
    returns = list(range(250))  # last 100 episodes: 150..249
    run = report.read_run(fake_run(str(tmp_path), "Hopper-v5", 1, returns))
    assert len(run.episodes) == 250
    assert report.final_return(run) == pytest.approx(np.mean(range(150, 250)))
    assert report.final_return(run, last=10) == pytest.approx(np.mean(range(240, 250)))


def test_seeds_reduce_to_mean_and_population_std(tmp_path):
    for seed, level in ((1, 100.0), (2, 200.0), (3, 600.0)):
        fake_run(str(tmp_path), "HalfCheetah-v5", seed, [0.0] * 50 + [level] * 100)
    fake_run(str(tmp_path), "HalfCheetah-v5", 9, [5000.0] * 100, exp="other")  # another experiment: ignored
    runs = [report.read_run(str(p)) for p in sorted(tmp_path.glob("*__bench__*"))]
    groups = report.group_runs(runs)
    assert list(groups) == [("ppo_continuous.py", "HalfCheetah-v5", 1_000_000, "bench")]
    finals = [report.final_return(r) for r in groups[("ppo_continuous.py", "HalfCheetah-v5", 1_000_000, "bench")]]
    assert report.mean_std(finals) == pytest.approx((300.0, np.std([100.0, 200.0, 600.0])))


def test_trailing_curve_uses_only_episodes_up_to_each_point(tmp_path):
    """Bug: a learning curve that averages in episodes from the future."""
    run = report.read_run(fake_run(str(tmp_path), "Pendulum-v1", 1, [1.0, 2.0, 3.0, 4.0], steps_per_episode=10))
    curve = report.trailing_curve(run, np.array([5.0, 10.0, 25.0, 40.0]), column=0, last=2)
    assert np.isnan(curve[0])
    assert curve[1:].tolist() == [1.0, 1.5, 3.5]


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_report_has_the_table_beside_references_and_the_plots(tmp_path):
    """Bugs: a task's row or reference missing; the curves' first point (before any episode ended) averaged as an
    empty slice, two RuntimeWarnings in every report."""
    runs_dir, out_dir = tmp_path / "runs", tmp_path / "results"
    for seed in (1, 2):
        fake_run(str(runs_dir), "Hopper-v5", seed, [1000.0 * seed] * 120)
    (out_dir).mkdir()
    (out_dir / "train_throughput.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    text = report.write_report(report.Args(runs_dir=str(runs_dir), out_dir=str(out_dir)))
    assert "stopped at" not in text
    assert "| ppo_continuous.py | bench | Hopper-v5 | 1,000,000 | 2 | **1500.0 ± 500.0** | 1000.0, 2000.0 |" in text
    assert "CleanRL, Hopper-v4, 3 seeds at 1M: 2382.9 ± 271.7" in text
    assert "Training throughput" in text and "| 1 | 2 |" in text
    assert (out_dir / "Hopper-v5__ppo_continuous__1000000__bench.png").stat().st_size > 10_000
    assert (out_dir / "README.md").read_text() == text


@pytest.mark.filterwarnings("error::UserWarning")
def test_runner_runs_each_seed_once_in_parallel_and_skips_finished_runs(tmp_path, monkeypatch, capsys):
    """Bugs: a rerun of the runner trains finished runs again (hours lost) or drops a seed; the report's reference
    labels placed at step 0 in data, outside a short run's axes, squeezing the figure (matplotlib's warning)."""
    tiny = ["--num-envs", "1", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "1"]
    monkeypatch.setitem(run.PRESETS, "quick", [("ppo_continuous.py", "Pendulum-v1", (1, 2), 256, tiny)])
    args = run.Args(preset="quick", jobs=2, root=str(tmp_path), out_dir=str(tmp_path / "results"))
    run.main(args)
    finished = sorted(p.name.split("__")[2] for p in (tmp_path / "runs").glob("Pendulum-v1__bench_quick__*"))
    assert finished == ["1", "2"]
    assert all(run.find_run(str(tmp_path), "Pendulum-v1", "bench_quick", seed)[1] for seed in (1, 2))
    report_text = (tmp_path / "results" / "README.md").read_text()
    assert "| ppo_continuous.py | bench_quick | Pendulum-v1 | 256 | 2 |" in report_text
    capsys.readouterr()
    run.main(args)
    assert capsys.readouterr().out.count("done already") == 2
    assert len(list((tmp_path / "runs").glob("Pendulum-v1__bench_quick__*"))) == 2


def test_a_runner_or_report_without_out_dir_writes_beside_the_runs_not_over_the_curated_results(tmp_path, monkeypatch):
    """Bug: a study preset run without --out-dir (or report.py without it) rewrote benchmarks/results/README.md, the
    curated main report, with its own runs alone: the hand-written findings around the generated tables lost."""
    written = []
    monkeypatch.setattr(run, "commands", lambda args: [])
    monkeypatch.setattr(run.report, "write_report", lambda report_args: written.append(report_args.out_dir))
    for preset in ("full", "arm_memory_variants"):
        run.main(run.Args(preset=preset, root=str(tmp_path)))
    run.main(run.Args(preset="quick", root=str(tmp_path), out_dir=str(tmp_path / "mine")))
    reports = tmp_path / "runs" / "reports"
    assert written == [str(reports / "full"), str(reports / "arm_memory_variants"), str(tmp_path / "mine")]
    curated = os.path.join(run.REPO, "benchmarks", "results")
    assert os.path.normpath(os.path.join(run.REPO, report.Args().out_dir)) != curated


def test_runner_seeds_flag_runs_only_those_seeds_and_refuses_one_the_preset_lacks(tmp_path):
    """Bugs: --seeds ignored (every seed of a study queued again, hours of runs) or a seed outside the preset run
    under a name no report or table expects."""
    args = run.Args(preset="arm_privileged", seeds=(2, 3), root=str(tmp_path), dry_run=True)
    seeds = [command[command.index("--seed") + 1] for command in run.commands(args)]
    assert seeds == ["2"] * 4 + ["3"] * 4
    assert len(run.commands(run.Args(preset="arm_privileged", root=str(tmp_path)))) == 12
    with pytest.raises(SystemExit, match=r"--seeds 4: the arm_privileged preset runs seeds 1 2 3"):
        run.main(run.Args(preset="arm_privileged", seeds=(3, 4), root=str(tmp_path), dry_run=True))


@pytest.mark.parametrize("preset", sorted(run.PRESETS))
def test_each_preset_queues_commands_its_scripts_accept(tmp_path, preset):
    """Bug: a preset's flag misspelled or its task unregistered, found when its run starts, hours into the queue."""
    import importlib

    import envs  # noqa: F401 (registers the tasks)

    todo = run.commands(run.Args(preset=preset, root=str(tmp_path)))
    assert todo
    for command in todo:
        script = importlib.import_module(os.path.basename(command[1]).removesuffix(".py"))
        args = script.parse_args(command[2:])
        assert args.env_id in gym.registry, args.env_id


def test_report_says_when_a_run_stopped_short_of_its_budget(tmp_path):
    """Bug: a half-finished run reported as if it had used the whole budget."""
    fake_run(str(tmp_path / "runs"), "Hopper-v5", 1, [1000.0] * 120)
    path = fake_run(str(tmp_path / "runs"), "Hopper-v5", 2, [500.0] * 120)
    writer = SummaryWriter(path)
    writer.add_scalar("charts/SPS", 800.0, 400_000)
    writer.close()
    text = report.write_report(report.Args(runs_dir=str(tmp_path / "runs"), out_dir=str(tmp_path / "results")))
    assert "| 1 | **1000.0 ± 0.0** | 1000.0, [seed 2 stopped at 400,000: 500.0, not in the mean] |" in text


def test_eval_compare_reduces_each_experiments_last_checkpoints_over_seeds_and_caches_them(tmp_path, monkeypatch):
    """Bugs: the table mixing two experiments' seeds (mem's glob taking mem_gru's runs), reporting an earlier
    checkpoint than the last, or evaluating a checkpoint again on every rerun (an hour of evaluation for a table)."""
    import torch

    from benchmarks import eval_compare

    evaluated = []

    class FakeScript:  # success grows with the checkpoint's step, and with the seed
        @staticmethod
        def evaluate(path, episodes, device, sim_device):
            evaluated.append(path)
            step, seed = torch.load(path)["global_step"], int(path.split("__")[-2])
            return {"episodes": episodes, "mean_return": step / 1000 + seed, "success_rate": step / 4000 + seed / 10}

    monkeypatch.setattr(eval_compare, "script_module", lambda saved_args: FakeScript)
    for exp, seeds in (("mem", (1, 2)), ("mem_gru", (1, 2, 3))):
        for seed in seeds:
            run = fake_run(tmp_path, "Cue-v0", seed, [0.0], exp=exp)
            add_timing(run)
            for iteration, step in ((50, 1000), (100, 2000)):
                torch.save({"global_step": step}, os.path.join(run, f"checkpoint_{iteration:06d}.pt"))
    args = eval_compare.Args(env_id="Cue-v0", exp_names=("mem", "mem_gru"), episodes=7, runs_dir=str(tmp_path),
                             out_dir=str(tmp_path / "out"), stem="cmp")
    text = eval_compare.main(args)
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| mem |")
            or line.startswith("| mem_gru |")}
    # last checkpoints: success 0.5 + seed/10 -> mem 60%, 70% (mean 65%, std 5%); mem_gru 60, 70, 80% (70%, 8.2%)
    assert "**65.0% ± 5.0%** (60.0%, 70.0%)" in rows["mem"] and "| 2 | 2,000 | 1.0 ± 0.0 |" in rows["mem"]
    assert "**70.0% ± 8.2%** (60.0%, 70.0%, 80.0%)" in rows["mem_gru"] and "**4.0 ± 0.8**" in rows["mem_gru"]
    assert len(evaluated) == 10 and os.path.isfile(tmp_path / "out" / "cmp.png")
    eval_compare.main(args)
    assert len(evaluated) == 10  # all from the runs' caches


def test_eval_compare_steps_in_all_count_a_warm_started_runs_earlier_stages_and_refuse_a_run_that_lacks_them(
        tmp_path, monkeypatch):
    """Bugs: --steps-in-all leaving a curriculum's last stage at its own steps (two curricula with stages of other
    lengths compared at the wrong steps), moving a run trained from scratch, or reading 0 for a warm-started run whose
    script did not record the steps behind it (silently wrong)."""
    from benchmarks import eval_compare

    class FakeScript:
        @staticmethod
        def evaluate(path, episodes, device, sim_device):
            return {"episodes": episodes, "mean_return": 1.0, "success_rate": 0.5}

    monkeypatch.setattr(eval_compare, "script_module", lambda saved_args: FakeScript)
    for exp, before in (("scratch", None), ("stage", 5000), ("unrecorded", None)):
        run = fake_run(tmp_path, "Cue-v0", 1, [0.0], exp=exp)
        add_timing(run)
        if exp != "scratch":
            with open(os.path.join(run, "args.json")) as f:
                saved = json.load(f)
            saved["init_from"] = "runs/earlier"
            if before is not None:
                saved["init_from_steps"] = before
            with open(os.path.join(run, "args.json"), "w") as f:
                json.dump(saved, f)
        torch.save({"global_step": 2000}, os.path.join(run, "checkpoint_000100.pt"))
    args = eval_compare.Args(env_id="Cue-v0", exp_names=("scratch", "stage"), episodes=7, runs_dir=str(tmp_path),
                             out_dir=str(tmp_path / "out"), stem="cmp")

    def steps(text, exp):  # the table's steps column
        return next(line for line in text.splitlines() if line.startswith(f"| {exp} |")).split(" | ")[3]

    text = eval_compare.main(args)
    assert (steps(text, "scratch"), steps(text, "stage")) == ("2,000", "2,000")
    text = eval_compare.main(dataclasses.replace(args, steps_in_all=True))
    assert (steps(text, "scratch"), steps(text, "stage")) == ("2,000", "7,000")
    with pytest.raises(SystemExit) as refused:
        eval_compare.main(dataclasses.replace(args, exp_names=("unrecorded",), steps_in_all=True))
    assert "--steps-in-all" in str(refused.value) and "init_from_steps" in str(refused.value)
    assert "unrecorded" in str(refused.value)


def test_a_resumed_runs_wall_time_leaves_out_the_time_it_was_stopped_and_the_iterations_it_redid(tmp_path):
    """Bugs: the time between a run's stop and its resume counted as training (eval_compare's wall time, eval_curve's,
    the report's time axis), or the iterations logged after the checkpoint, which the resumed run redoes."""
    from benchmarks import eval_compare
    from benchmarks.eval_curve import wall_seconds

    path = fake_run(str(tmp_path), "Cue-v0", 1, returns=[])
    files = set(os.listdir(path))
    first = SummaryWriter(path)  # iterations of 1,000 steps; 2 s the first one, then 60 s and 30 s
    (first_file,) = set(os.listdir(path)) - files
    for name, value in (("charts/SPS", 500.0), ("time/rollout_s", 1.0), ("time/update_s", 1.0)):
        first.add_scalar(name, value, 1000, walltime=1000.0)
    first.add_scalar("charts/SPS", 100.0, 2000, walltime=1060.0)
    first.add_scalar("charts/episodic_return", 5.0, 2000, walltime=1060.0)  # the checkpoint is at 2,000 steps
    first.add_scalar("charts/SPS", 100.0, 3000, walltime=1090.0)  # stopped before the next checkpoint
    first.close()
    files = set(os.listdir(path))
    resumed = SummaryWriter(path, purge_step=2001)  # an hour later, as the scripts' --resume opens its logs
    (resumed_file,) = set(os.listdir(path)) - files
    for name, value in (("charts/SPS", 500.0), ("time/rollout_s", 1.0), ("time/update_s", 1.0)):
        resumed.add_scalar(name, value, 3000, walltime=4602.0)
    resumed.add_scalar("charts/SPS", 100.0, 4000, walltime=4632.0)
    resumed.add_scalar("charts/episodic_return", 7.0, 4000, walltime=4632.0)
    resumed.close()
    for name, started in ((first_file, 1000), (resumed_file, 4600)):  # named by their start as a real resume's are
        os.rename(os.path.join(path, name), os.path.join(path, f"events.out.tfevents.{started:010d}.host.1.0"))

    assert wall_seconds(path) == pytest.approx({1000: 2.0, 2000: 62.0, 3000: 64.0, 4000: 94.0})
    assert eval_compare.wall_minutes(path) == pytest.approx(94.0 / 60)
    np.testing.assert_allclose(report.read_run(path).episodes, [[2000, 62.0, 5.0], [4000, 94.0, 7.0]])


def test_eval_compare_reports_the_quadrupeds_tracking_errors_and_falls_not_only_its_return(tmp_path, monkeypatch):
    """Bugs: a task without a success rate compared by its return alone (the tracking error, the issue's bar, missing
    from the table), or an error in m/s printed as a percentage or rounded to 0.1 (0.046 and 0.051 read as one)."""
    import torch

    from benchmarks import eval_compare

    class FakeScript:  # the lin. error falls with the seed; one episode in 200 falls
        @staticmethod
        def evaluate(path, episodes, device, sim_device):
            seed = int(path.split("__")[-2])
            return {"episodes": episodes, "mean_return": 20.0, "mean_length": 1000.0,
                    "lin_vel_error": 0.05 - seed / 1000, "ang_vel_error": 0.08, "fell": 0.005}

    monkeypatch.setattr(eval_compare, "script_module", lambda saved_args: FakeScript)
    for seed in (1, 2):
        run = fake_run(tmp_path, "Walk-v0", seed, [0.0], exp="gru")
        add_timing(run)
        torch.save({"global_step": 2000}, os.path.join(run, "checkpoint_000050.pt"))
    text = eval_compare.main(eval_compare.Args(env_id="Walk-v0", exp_names=("gru",), episodes=7, runs_dir=str(tmp_path),
                                               out_dir=str(tmp_path / "out"), stem="cmp"))
    header = next(line for line in text.splitlines() if line.startswith("| experiment"))
    assert "lin. velocity error (m/s)" in header and "yaw-rate error" in header and "fall rate" in header
    assert "**0.049 ± 0.001** (0.049, 0.048)" in text and "**0.5% ± 0.0%**" in text and "**0.080 ± 0.000**" in text


def test_eval_bins_evaluates_each_runs_last_checkpoint_with_each_bins_ranges_and_leaves_it_unchanged(tmp_path,
                                                                                                   monkeypatch):
    """Bugs: a bin's ranges never reaching the evaluation (every bin the same, the memory effect invisible), replacing
    the run's own options rather than going on top of them, the run's checkpoint overwritten, an earlier checkpoint
    than the last, anything left beside the run but its cache, every bin evaluated again on a rerun, or the return
    left out of the tables."""
    import torch

    from benchmarks import eval_bins

    evaluated = []

    class FakeScript:  # success = the bin's lower mass bound + seed / 100 + the run's own option / 1000
        @staticmethod
        def evaluate(path, episodes, capture_video, device, sim_device, env_kwargs):
            checkpoint = torch.load(path)
            evaluated.append(path)
            seed, kwargs = int(path.split("__")[-2]), {**checkpoint["args"]["env_kwargs"], **env_kwargs}
            return {"episodes": episodes, "mean_return": float(checkpoint["global_step"]),
                    "success_rate": kwargs["mass"][0] + seed / 100 + kwargs["other"] / 1000}

    bins = {"light": {"mass": [0.1, 0.2]}, "heavy": {"mass": [0.5, 1.0]}}
    monkeypatch.setitem(eval_bins.BINS, "Rand-v0", bins)
    monkeypatch.setattr(eval_bins, "script_module", lambda saved_args: FakeScript)
    saved_args = {"env_kwargs": {"mass": [0.0, 1.0], "other": 3}}
    for seed in (1, 2):
        run = fake_run(tmp_path, "Rand-v0", seed, [0.0], exp="push")
        for iteration, step in ((50, 1000), (81, 2000)):
            torch.save({"global_step": step, "args": saved_args}, os.path.join(run, f"checkpoint_{iteration:06d}.pt"))
    args = eval_bins.Args(env_id="Rand-v0", exp_names=("push",), episodes=7, runs_dir=str(tmp_path),
                          out_dir=str(tmp_path / "out"), stem="bins")
    text = eval_bins.main(args)
    # light: 0.1 + seed/100 + 3/1000 -> 11.3%, 12.3%; heavy: 51.3%, 52.3%; both at the last checkpoint's 2,000 steps
    assert ("| push | ppo_continuous.py | 2 | 2,000 | **11.8% ± 0.5%** (11.3%, 12.3%) "
            "| **51.8% ± 0.5%** (51.3%, 52.3%) |") in text
    assert "| push | ppo_continuous.py | 2 | 2,000 | **2000.0 ± 0.0** (2000.0, 2000.0) | **2000.0 ± 0.0**" in text
    assert len(evaluated) == 4
    for run in glob.glob(os.path.join(tmp_path, "Rand-v0__push__*")):
        assert torch.load(os.path.join(run, "checkpoint_000081.pt"))["args"] == saved_args
        assert sorted(os.listdir(run)) == sorted(["args.json", "checkpoint_000050.pt", "checkpoint_000081.pt",
                                                  "eval_bins_7.json", *[f for f in os.listdir(run) if "tfevents" in f]])
    eval_bins.main(args)
    assert len(evaluated) == 4  # all from the runs' caches
    with pytest.raises(SystemExit, match="no runs of --exp-names pusher"):  # a misspelt name: not an empty table
        eval_bins.main(eval_bins.Args(env_id="Rand-v0", exp_names=("pusher",), runs_dir=str(tmp_path),
                                      out_dir=str(tmp_path / "out")))


def test_cleanrl_per_iteration_rates_come_from_its_cumulative_prints():
    """Bug: CleanRL's "SPS:" (averaged since its start, first iteration's warm-up included) read as each iteration's."""
    from benchmarks.cleanrl_side_by_side import per_iteration_sps

    durations = [10.0, 2.0, 4.0, 2.0]  # seconds per 2048-step iteration; the first one warms up
    elapsed = np.cumsum(durations)
    cumulative = [2048 * (i + 1) / t for i, t in enumerate(elapsed)]
    assert per_iteration_sps(cumulative, 2048) == pytest.approx([1024.0, 512.0, 1024.0])


def test_rsl_rl_side_by_side_reports_the_first_crossing_and_any_dip_after_it():
    """Bugs caught: the last crossing reported instead of the first (hides a slow start), the lowest success taken
    over the whole run (counts the climb as a dip) or only at the end (misses a dip in between)."""
    from benchmarks.rsl_rl_side_by_side import NUM_ENVS, NUM_STEPS, summarise

    batch = NUM_ENVS * NUM_STEPS
    rows = [{"step": i * 20 * batch, "wall": i * 60.0, "success_rate": s}
            for i, s in enumerate([0.0, 0.5, 0.96, 0.90, 0.97, 1.0], start=1)]
    summary = summarise(rows, target=0.95)
    assert summary["steps"] == 3 * 20 * batch and summary["seconds"] == 180.0
    assert summary["min_after"] == 0.90 and summary["final"] == 1.0
    assert summary["seconds_per_iteration"] == pytest.approx(3.0)
    never = summarise([dict(row, success_rate=0.5) for row in rows], target=0.95)
    assert np.isnan(never["steps"]) and np.isnan(never["min_after"]) and never["final"] == 0.5


def test_update_throughput_runs_each_scripts_own_update_on_the_batch_asked_for():
    """Bugs: the update benchmark falling out of step with a script's update() signature or batch layout (it
    raises), or timing another batch than the one asked for (its row names the batch and the minibatch steps)."""
    from benchmarks import update_throughput

    scripts = ["ppo_continuous", "ppo_recurrent", "ppo_transformer"]
    small = dict(num_envs=2, num_steps=64, num_minibatches=2, update_epochs=3)
    table = update_throughput.main(update_throughput.Args(env_id="Pendulum-v1", scripts=scripts, repeats=1,
                                                          overrides=small))
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ppo")]
    assert [row[0].strip() for row in rows] == [f"{s}.py" for s in scripts]
    for row in rows:
        assert row[1].strip() == "2 x 64" and int(row[2]) == 3 * 2  # the overrides, not the preset's 4 x 1024
        assert float(row[3]) > 0 and float(row[4]) > 0


def test_train_throughput_trains_each_script_with_its_own_flags_on_the_first_ones_batch(monkeypatch):
    """Bugs: a script's own flags (`script:flag=value`) dropped, so two modes of one script time the same preset;
    or the flags overriding the batch every script must share."""
    import ppo_transformer
    from benchmarks import train_throughput

    trained, original = [], ppo_transformer.train
    monkeypatch.setattr(ppo_transformer, "train", lambda args, **kw: trained.append(args) or original(args, **kw))
    specs = ["ppo_transformer:context_len=2,num_steps=64", "ppo_transformer:context_len=3,num_envs=8,num_steps=16"]
    rows = train_throughput.main(train_throughput.Args(env_id="Pendulum-v1", num_envs=[2], iterations=2,
                                                       raw_steps=100, scripts=specs))
    assert [a.context_len for a in trained] == [2, 3]
    assert [(a.num_envs, a.num_steps) for a in trained] == [(2, 64)] * 2  # the row's envs, the first one's steps
    assert all(r["train_sps"] > 0 for r in rows)


def test_frames_strip_shows_the_asked_steps_and_names_a_step_the_video_lacks(tmp_path, monkeypatch):
    """Bugs: frames taken from the wrong steps (off by one from the reset), or a step past the episode's end answered
    with a traceback instead of the flag and the video's length."""
    import imageio.v2 as imageio

    from benchmarks import frames

    video = str(tmp_path / "eval.mp4")  # frame k is grey level 40 k: which frames the strip shows is readable back
    imageio.mimsave(video, [np.full((32, 32, 3), 40 * k, dtype=np.uint8) for k in range(5)], fps=5, macro_block_size=1)
    shown = []
    real_imshow = frames.plt.Axes.imshow

    def imshow(ax, image, *args, **kwargs):
        shown.append(int(np.asarray(image).mean().round()))
        return real_imshow(ax, image, *args, **kwargs)

    monkeypatch.setattr(frames.plt.Axes, "imshow", imshow)
    out = frames.main(frames.Args(video=video, out=str(tmp_path / "strip.png"), frames=(0, 2, 4)))
    assert os.path.getsize(out) > 0
    assert [abs(level - expected) <= 3 for level, expected in zip(shown, (0, 80, 160))] == [True] * 3
    with pytest.raises(SystemExit, match=r"--frames \[5\] are not in the video \(5 frames, 0-4\)"):
        frames.main(frames.Args(video=video, out=str(tmp_path / "bad.png"), frames=(0, 5)))


def test_update_stats_puts_each_update_in_its_stretch_and_names_the_step_of_the_largest_kl(tmp_path):
    """Bugs: an update counted in the wrong stretch of steps, the largest KL's step taken from another update (the
    one that caused a collapse is then misnamed), an evaluation listed beside the wrong stretch, or a run without
    the updates' scalars answered with a traceback."""
    from benchmarks import update_stats

    run = str(tmp_path / "run")
    writer = SummaryWriter(run)
    updates = ((100, 0.01, 8.0), (900, 0.03, 6.0), (1000, 0.5, 1.0), (1500, 0.02, 3.0), (2100, 0.04, 1.0))
    for step, kl, epochs in updates:
        writer.add_scalar("losses/approx_kl", kl, step)
        writer.add_scalar("charts/update_epochs_done", epochs, step)
        writer.add_scalar("losses/clipfrac", 0.1 * epochs, step)
    for step, success in ((950, 0.9), (1100, 0.1), (1400, 0.6), (2000, 0.7)):
        writer.add_scalar("eval/success", success, step)
    writer.close()
    text = update_stats.main(update_stats.Args(run_dirs=(run,), bin_steps=1000, out=str(tmp_path / "stats.md")))
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows == ["| 0 | 2 | 7.00 | 0.020 | 0.030 (900) | 0.70 | 0.90 |",
                    "| 1,000 | 2 | 2.00 | 0.260 | 0.500 (1,000) | 0.20 | 0.10 0.60 |",
                    "| 2,000 | 1 | 1.00 | 0.040 | 0.040 (2,100) | 0.10 | 0.70 |"]
    assert open(tmp_path / "stats.md").read() == text
    empty = str(tmp_path / "empty")
    writer = SummaryWriter(empty)
    writer.add_scalar("charts/episodic_return", 1.0, 1)
    writer.close()
    with pytest.raises(SystemExit, match="logged no losses/approx_kl"):
        update_stats.main(update_stats.Args(run_dirs=(empty,)))
    with pytest.raises(SystemExit, match="--bin-steps must be positive"):
        update_stats.main(update_stats.Args(run_dirs=(run,), bin_steps=0))


def test_terrain_eval_reports_the_curriculums_end_per_type_and_each_level_evaluated_alone(tmp_path, monkeypatch):
    """Bugs: the level per type averaged over the whole run instead of its end (the climb hidden), a level's
    evaluation run with the curriculum on or on random levels (start_level never reaching the script), an earlier
    checkpoint than the last, the run's checkpoint overwritten, every level evaluated again on a rerun, or the video
    recorded on the training field (env 0 on flat ground) instead of one of the asked terrain type."""
    import torch

    from benchmarks import terrain_eval

    evaluated = []

    class FakeScript:  # falls: the level / 10 on stairs_up, none elsewhere; the error grows with the step
        @staticmethod
        def evaluate(path, episodes, capture_video, device, sim_device, env_kwargs):
            checkpoint = torch.load(path)
            kwargs = {**checkpoint["args"]["env_kwargs"], **env_kwargs}
            evaluated.append((checkpoint["global_step"], episodes, dict(kwargs)))
            if capture_video:
                os.makedirs(os.path.join(os.path.dirname(path), "videos"), exist_ok=True)
                with open(os.path.join(os.path.dirname(path), "videos", "eval.mp4"), "w") as f:
                    f.write(",".join(kwargs["terrain_types"]))
            level = kwargs["start_level"] if kwargs["curriculum"] is False else -99
            return {"episodes": episodes, "fell": level / 70, "lin_vel_error": checkpoint["global_step"] / 1e5,
                    **{f"fell/{t}": (level / 10 if t == "stairs_up" else 0.0) for t in terrain_eval.TERRAIN_TYPES}}

    monkeypatch.setattr(terrain_eval, "script_module", lambda saved_args: FakeScript)
    saved_args = {"env_kwargs": {"decimation": 4}}
    run = os.path.join(tmp_path, "Go2Rough-v0__rough__1__1700000000")
    os.makedirs(run)
    with open(os.path.join(run, "args.json"), "w") as f:
        json.dump({"env_id": "Go2Rough-v0", "seed": 1, "exp_name": "rough", "num_envs": 4}, f)
    writer = SummaryWriter(run)
    for i in range(10):  # the level climbs 0, 1, ..., 9; stairs_up stays at 2; falls 50% then 10%
        step = (i + 1) * 1000
        writer.add_scalar("charts/SPS", 100.0, step, walltime=1000.0 + 6 * i)  # 6 s per iteration: 1 min in all
        writer.add_scalar("time/rollout_s", 3.0, step)
        writer.add_scalar("time/update_s", 3.0, step)
        writer.add_scalar("episode_metrics/terrain_level", float(i), step)
        writer.add_scalar("episode_metrics/terrain_level/stairs_up", 2.0, step)
        writer.add_scalar("episode_metrics/fell", 0.5 if i < 8 else 0.1, step)
        writer.add_scalar("episode_metrics/fell/stairs_up", 0.25, step)
    writer.close()
    for iteration, step in ((5, 5000), (10, 10000)):
        torch.save({"global_step": step, "args": saved_args}, os.path.join(run, f"checkpoint_{iteration:06d}.pt"))
    args = terrain_eval.Args(run_dirs=(run,), levels=(0, 7), episodes_per_type=3, last_iterations=2,
                             video_type="stairs_up", video_level=5, out_dir=str(tmp_path / "out"), stem="t")
    text = terrain_eval.main(args)
    label = "Go2Rough-v0 (ppo_continuous.py, rough, seed 1)"
    assert f"| {label} | 10,000 | 1 | **8.50** |" in text  # levels 8 and 9 of the last two iterations
    assert f"| {label} | 10.0% | " in text and "25.0%" in text
    assert f"| {label} | 7 | 0.100 | 10.0% | " in text and "| 70% |" in text  # stairs_up at level 7: 70% falls
    assert f"| {label} | 0 | 0.100 | 0.0% | " in text
    levels = [(step, episodes, kwargs) for step, episodes, kwargs in evaluated if "terrain_types" not in kwargs]
    assert levels == [(10000, 21, {"decimation": 4, "curriculum": False, "start_level": level}) for level in (0, 7)]
    video = os.path.join(run, "videos", "stairs_up_level5.mp4")
    with open(video) as f:
        assert f.read() == "stairs_up"
    assert evaluated[-1] == (10000, 1, {"decimation": 4, "terrain_types": ("stairs_up",), "curriculum": False,
                                        "start_level": 5})
    assert torch.load(os.path.join(run, "checkpoint_000010.pt"))["args"] == saved_args
    assert os.path.isfile(tmp_path / "out" / "t.png")
    terrain_eval.main(dataclasses.replace(args, video_type=None))
    assert len(evaluated) == 3  # the levels from the run's cache
    with pytest.raises(SystemExit, match="--run-dirs .* has no periodic checkpoint"):
        terrain_eval.main(terrain_eval.Args(run_dirs=(str(tmp_path),), out_dir=str(tmp_path / "out")))


def test_gpu_checks_same_finds_the_first_value_a_resumed_copy_logged_otherwise_and_ignores_the_clock(tmp_path, capsys):
    """Bugs in `gpu_checks.py same`, which says whether a resumed copy continued its run: the values a resume purged
    compared instead of those logged again, timings counted as differences (no resume would ever be the same), or
    only the first difference's existence reported, not where."""
    from benchmarks import gpu_checks

    def log(run_dir, steps, value_at, purge_step=None):
        writer = SummaryWriter(str(run_dir), purge_step=purge_step)
        for step in steps:
            writer.add_scalar("losses/value_loss", value_at(step), step)
            writer.add_scalar("charts/SPS", 1000.0 + step + (purge_step or 0), step)  # a clock: differs every time
        writer.close()

    straight, copy = tmp_path / "straight", tmp_path / "copy"
    log(straight, range(1, 5), lambda step: step / 10)
    log(copy, range(1, 5), lambda step: step / 10 if step < 3 else -1.0)  # steps 3-4: what a resume at 2 purges
    time.sleep(1.1)  # event files are named by the second: the resumed session's sorts after the first's
    log(copy, range(3, 5), lambda step: step / 10, purge_step=3)
    report = gpu_checks.same(gpu_checks.Same(run_dirs=[str(straight), str(copy)]))
    assert report["compared"] == 4 and report["differing"] == 0, report
    assert "all 4 values logged by both runs are equal" in capsys.readouterr().out
    time.sleep(1.1)
    log(copy, range(3, 5), lambda step: step / 10 + (step == 4) * 1e-7, purge_step=3)
    report = gpu_checks.same(gpu_checks.Same(run_dirs=[str(straight), str(copy)]))
    assert report["differing"] == 1 and report["first_difference"][:2] == [4, "losses/value_loss"], report


def stand_in_script(monkeypatch, train) -> None:
    """benchmarks/gpu_checks.py importing a stand-in script whose `train` is the one given. Only gpu_checks's own
    import is replaced: torch imports its submodules lazily through importlib.import_module, so replacing that for
    the whole process broke torch in whichever test first needed such a submodule (the order of a parallel run)."""
    import types

    from benchmarks import gpu_checks

    fake = types.SimpleNamespace(task_args=lambda env_id, **flags: types.SimpleNamespace(**flags), train=train)
    monkeypatch.setattr(gpu_checks, "importlib", types.SimpleNamespace(import_module=lambda name: fake))


def test_gpu_sync_count_names_the_project_line_of_each_sync_and_keeps_the_lines_that_grow_with_the_steps(
        monkeypatch, capsys):
    """Bugs: syncs put on torch's own line or the checker's (every warning in one bucket, no line to fix), or lines
    that sync once per iteration reported as per-step ones (the counts of the two rollout lengths not compared)."""
    import warnings

    import torch

    from benchmarks import gpu_checks

    torch_side = {"warnings": warnings}  # the warning is raised inside torch's code, not on the project's line
    exec(compile("def item():\n    warnings.warn('called a synchronizing CUDA operation')\n",
                 "/usr/lib/python3/site-packages/torch/_tensor.py", "exec"), torch_side)

    def per_step_sync():
        torch_side["item"]()  # the line to report

    def train(args):
        warnings.warn("called a synchronizing CUDA operation")  # once per run: logging
        for _ in range(args.num_steps * 2):
            per_step_sync()
        warnings.warn("an unrelated warning")

    stand_in_script(monkeypatch, train)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)  # a CPU build has no CUDA to watch
    gpu_checks.syncs(gpu_checks.Syncs(scripts=["fake"], num_steps=3, iterations=2))
    report = json.loads(capsys.readouterr().out.splitlines()[-1])["fake"]
    here = os.path.relpath(__file__, gpu_checks.ROOT)
    line = per_step_sync.__code__.co_firstlineno + 1
    assert report == {"syncs": [7, 13], "growing_with_steps": {f"{here}:{line}": [6, 12]}}


def test_gpu_busy_check_traces_one_whole_iteration_after_an_untraced_one(tmp_path, monkeypatch, capsys):
    """Bugs: the trace covering the run's start or more than one iteration (then the GPU's share is not an
    iteration's), no trace written where asked for."""
    from benchmarks import gpu_checks

    monkeypatch.chdir(tmp_path)
    trace = tmp_path / "trace.json"
    report = gpu_checks.busy(gpu_checks.Busy(env_id="Pendulum-v1", num_envs=2, hidden_sizes=[8], num_steps=32,
                                             update_epochs=1, num_minibatches=1, rows=3, trace=str(trace)))
    assert report["traced_iterations"] == 1
    steps = [event["name"] for event in json.loads(trace.read_text())["traceEvents"]
             if str(event.get("name")).startswith("ProfilerStep")]
    assert steps == ["ProfilerStep#3"]  # the fourth iteration (the profiler counts from 0)
    assert "untraced" in capsys.readouterr().out


def test_gpu_busy_check_times_its_reference_iteration_with_the_profiler_off(monkeypatch):
    """Bug: the untraced iteration that the GPU's kernel time is set against timed in the profiler's warm-up, where
    CUPTI already records every kernel (torch.profiler's prepare_trace): on the fifth GPU session it took 0.572 s
    against the run's median of 0.357 s, so the GPU's share of an iteration came out too small."""
    import types

    import torch.profiler
    from torch.profiler import ProfilerAction

    from benchmarks import gpu_checks

    actions = []  # the profiler's action during each iteration

    class Spy(torch.profiler.profile):
        def step(self):
            actions.append(self.current_action)
            super().step()

    def train(run_args, on_iteration):
        for _ in range(run_args.total_timesteps // (run_args.num_steps * run_args.num_envs)):
            on_iteration({})

    clock = (2.0**k for k in itertools.count())  # iteration m (1-based, m >= 2) lasts 2 ** (m - 2)
    monkeypatch.setattr(gpu_checks, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    monkeypatch.setattr(torch.profiler, "profile", Spy)
    stand_in_script(monkeypatch, train)
    report = gpu_checks.busy(gpu_checks.Busy(num_envs=2, num_steps=4, rows=1))
    untraced, traced = (int(math.log2(report[key])) + 2 for key in ("untraced_s", "traced_s"))
    assert actions[untraced - 1] == ProfilerAction.NONE
    assert actions[traced - 1] == ProfilerAction.RECORD_AND_SAVE


def test_gpu_busy_check_traces_the_compiled_run_when_asked(monkeypatch, capsys):
    """Bug: busy's --compile (or --compile-mode) not reaching the traced script (the eager run traced under the
    compiled run's name, or the compiled run without its CUDA graphs)."""
    from benchmarks import gpu_checks

    seen = []

    def train(run_args, on_iteration):
        seen.append((run_args.compile, run_args.compile_mode))
        for _ in range(run_args.total_timesteps // (run_args.num_steps * run_args.num_envs)):
            on_iteration({})

    stand_in_script(monkeypatch, train)
    for compiled, mode in ((False, "default"), (True, "default"), (True, "reduce-overhead")):
        gpu_checks.busy(gpu_checks.Busy(num_envs=2, num_steps=4, rows=1, compile=compiled, compile_mode=mode))
    assert seen == [(False, "default"), (True, "default"), (True, "reduce-overhead")]


def test_gpu_busy_time_counts_kernels_once_and_not_the_profilers_annotations():
    """Bugs: the GPU-side `ProfilerStep` annotation (a whole iteration long) summed with the kernels, as on the third
    GPU session ("189%" of an iteration busy), or kernels of two streams that overlap counted twice."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from benchmarks import gpu_checks

    def event(name, start, end, device=DeviceType.CUDA, annotation=False):
        return FunctionEvent(0, name, 0, start, end, device_type=device, is_user_annotation=annotation)

    events = [event("ProfilerStep#2", 0, 1000, DeviceType.CPU, annotation=True),
              event("ProfilerStep#2", 0, 1000, annotation=True), event("aten::mm", 10, 20, DeviceType.CPU),
              event("gemm", 100, 200), event("elementwise", 150, 250), event("kernel_step", 500, 550)]
    busy_s, kernels = gpu_checks.gpu_kernel_time(events)
    assert kernels == 3
    assert busy_s == pytest.approx(200e-6)  # 100-250 and 500-550


def test_gpu_sim_check_times_the_scene_inside_the_same_steps_through_envs(capsys):
    """Bugs: the scene-alone rate timing something else than the scene's own steps (then it is not above the rate
    through envs/, which includes them), or a row per task and size missing."""
    from benchmarks import gpu_checks

    gpu_checks.sim(gpu_checks.Sim(env_ids=["FrankaReach-v0"], num_envs=[4, 8], steps=3, warmup=1, sim_device="cpu"))
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| Franka")]
    assert [int(row[1]) for row in rows] == [4, 8]
    for row in rows:
        through, alone = (float(cell.replace(",", "")) for cell in row[3:5])
        assert 0 < through < alone


def test_gpu_sim_check_padded_contacts_reaches_the_tasks_contact_reads(monkeypatch, capsys):
    """Bug: `--padded-contacts` not reaching the task's own `get_contacts` calls, so the GPU comparison of trimmed and
    padded contact reads (gpu_session.sh contacts) would time the same trimmed reads twice."""
    from benchmarks import gpu_checks

    padded_reads, make = [], gpu_checks.envs.make

    def make_recording(*args, **kwargs):
        vec = make(*args, **kwargs)
        read = vec.robot.get_contacts

        def recording(*read_args, **read_kwargs):
            padded_reads.append(read_kwargs.get("is_padded", False))
            return read(*read_args, **read_kwargs)

        vec.robot.get_contacts = recording
        return vec

    monkeypatch.setattr(gpu_checks.envs, "make", make_recording)
    for padded in (False, True):
        padded_reads.clear()
        gpu_checks.sim(gpu_checks.Sim(env_ids=["FrankaStackCube-v0"], num_envs=[2], steps=2, warmup=1,
                                      sim_device="cpu", padded_contacts=padded))
        assert padded_reads and set(padded_reads) == {padded}
    assert "contacts padded" in capsys.readouterr().out


def test_eval_curve_evaluates_each_genesis_checkpoint_in_a_child_so_its_own_memory_stays_flat(tmp_path, monkeypatch):
    """Bug: eval_curve.py evaluated every checkpoint in the tool's own process, and Genesis keeps memory of every scene
    it destroys (~45 MiB per FrankaReach-v0 scene of 64 envs, ~120 MiB of 128): killed by the OOM killer at 24 GB after
    32 FrankaStackCube-v0 checkpoints. Each evaluation now runs in a child: this process builds no env, and the child's
    result is the script's own evaluate() of that checkpoint. (Not measured as this process's resident memory: under
    load it once grew 60 MiB from one child's evaluation to the next, while only the children built scenes.)
    """
    import envs
    import ppo_continuous
    from benchmarks import eval_curve

    monkeypatch.chdir(tmp_path)
    summary = ppo_continuous.train(ppo_continuous.task_args(
        "FrankaReach-v0", num_envs=64, num_steps=8, total_timesteps=2 * 64 * 8, checkpoint_interval=1,
        exp_name="curve", eval_interval=0, sim_device="cpu", policy_device="cpu", progress_bar=False))
    run_dir = os.path.dirname(summary["checkpoint"])
    built_here = []
    with monkeypatch.context() as patch:
        make = envs.make
        patch.setattr(envs, "make", lambda env_id, **kwargs: built_here.append(env_id) or make(env_id, **kwargs))
        text = eval_curve.main(eval_curve.Args(run_dir=run_dir, episodes=128, out_dir=str(tmp_path / "out")))
    assert text.count("\n") == 2 + 2  # both checkpoints evaluated, a row each
    assert built_here == [], "eval_curve.py built the evaluation's envs (Genesis scenes) in its own process"
    cached = json.load(open(os.path.join(run_dir, "eval_curve_128.json")))
    here = ppo_continuous.evaluate(os.path.join(run_dir, "checkpoint_000002.pt"), episodes=128, device="cpu",
                                   sim_device="cpu")
    assert {k: v for k, v in cached["checkpoint_000002.pt"].items() if k != "step"} == here


def test_an_rsl_rl_model_converts_to_our_checkpoint_of_the_same_weights_and_evaluates_in_a_child(tmp_path,
                                                                                                 monkeypatch):
    """Bug: rsl_rl_side_by_side.py's conversion unpacked build_agent's three results into two (a ValueError on every
    rsl_rl model since the privileged critic), and evaluated every model in its own process (Genesis keeps memory of
    each scene). The converted checkpoint carries rsl_rl's actor, critic and std; the child evaluates it as our
    evaluate() does here."""
    import envs
    import ppo_continuous
    from benchmarks.rsl_rl_side_by_side import as_our_checkpoint, evaluate_rsl_rl, evaluate_rsl_rl_model

    args = ppo_continuous.task_args("FrankaReach-v0", norm_obs=False, norm_reward=False, seed=3)
    vec = envs.make("FrankaReach-v0", num_envs=1, seed=0, device="cpu", sim_device="cpu")
    agent, _, _ = ppo_continuous.build_agent(args, vec, torch.device("cpu"))
    vec.close()
    generator = torch.Generator().manual_seed(0)
    weights = {k: torch.randn(v.shape, generator=generator) for k, v in agent.state_dict().items()}
    rsl_rl_model = str(tmp_path / "model_4.pt")  # rsl_rl's names: actor.mlp.*, critic.mlp.*, a std parameter
    torch.save({"actor_state_dict": {**{f"mlp.{k[len('actor_mean.'):]}": v for k, v in weights.items()
                                        if k.startswith("actor_mean.")},
                                     "distribution.std_param": torch.full((7,), 0.3)},
                "critic_state_dict": {f"mlp.{k[len('critic.'):]}": v for k, v in weights.items()
                                      if k.startswith("critic.")}}, rsl_rl_model)
    ours = str(tmp_path / "ours.pt")
    as_our_checkpoint(rsl_rl_model, 3, 5, ours)
    model = torch.load(ours, weights_only=True)["model"]
    for name in weights:
        if name.startswith(("actor_mean.", "critic.")):
            torch.testing.assert_close(model[name], weights[name], msg=name)
    torch.testing.assert_close(model["actor_logstd"], torch.full((1, 7), 0.3).log())
    with open(tmp_path / "wall.json", "w") as f:
        json.dump({"model_4.pt": 60.0}, f)
    children = []

    def recorded_in_child(function, *args):
        children.append(function)
        return in_child_of_report(function, *args)

    in_child_of_report = report.in_child
    monkeypatch.setattr(report, "in_child", recorded_in_child)
    (row,) = evaluate_rsl_rl(str(tmp_path), 3, 16)
    assert children == [evaluate_rsl_rl_model]  # the model was evaluated in a child
    in_child = {k: v for k, v in row.items() if k not in ("step", "wall")}
    assert in_child == ppo_continuous.evaluate(ours, episodes=16, device="cpu", sim_device="cpu")
    assert "ours_model_4.pt" not in os.listdir(tmp_path)  # the child's converted copy is gone


def test_a_child_evaluation_ends_with_its_parent_killed_by_a_signal(tmp_path):
    """Bug: an evaluation tool killed by SIGTERM or SIGKILL (no cleanup runs) left its child running on, then waiting
    for work forever with its memory (1.2 GB after a FrankaReach-v0 evaluation)."""
    import signal
    import subprocess
    import sys

    from conftest import REPO, wait_until

    parent = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                               "from benchmarks.report import in_child; in_child(time.sleep, 600)", REPO],
                              cwd=tmp_path, start_new_session=True)

    def running(pid: int) -> bool:  # a process that ended but was not reaped yet is a zombie ("Z")
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    def child() -> int | None:  # the sleeping child (the other one is multiprocessing's resource tracker)
        with open(f"/proc/{parent.pid}/task/{parent.pid}/children") as f:
            for pid in map(int, f.read().split()):
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    if b"spawn_main" in cmdline.read():
                        return pid
        return None

    try:
        pid = wait_until(child, "the child starts", process=parent)
        time.sleep(5)  # the child is in time.sleep(600) by now, or soon
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_until(lambda: not running(pid), "the child ends after its parent was killed", timeout=60)
    finally:
        try:
            os.killpg(parent.pid, signal.SIGKILL)  # whatever is left of the test's process group
        except ProcessLookupError:
            pass


def test_critic_reads_measures_the_value_against_the_privileged_columns_alone(tmp_path):
    """Bugs in benchmarks/critic_reads.py: the policy's columns set to common values too (a critic that ignores the
    privileged ones would seem to rely on them), the saved critic normaliser skipped, or the checkpoints misread."""
    from benchmarks import critic_reads
    script = critic_reads.ppo_continuous
    args = script.parse_args(["--env-id", "FrankaStackCubeRandom-v0", "--norm-obs"])
    box = lambda n: gym.spaces.Box(-1.0, 1.0, (n,))  # noqa: E731
    torch.manual_seed(0)
    agent = script.Agent(args, box(6), box(2), box(8))
    normaliser = script.ObsNormalizer((8,), enabled=True)
    normaliser.update(torch.randn(64, 8) * 3 + 1)
    critic_obs = torch.randn(16, 8)
    common = critic_obs.clone()
    common[:, 6:] = critic_obs[:, 6:].mean(0)
    with torch.no_grad():
        expected = agent.get_value(normaliser(critic_obs)) - agent.get_value(normaliser(common))
    checkpoint = {"args": dataclasses.asdict(args), "global_step": 10, "next_critic_obs_raw": critic_obs,
                  "critic_obs_normalizer": normaliser.state_dict()}
    torch.save({**checkpoint, "model": agent.state_dict()}, tmp_path / "checkpoint_000002.pt")
    with torch.no_grad():
        agent.critic[0].weight[:, 6:] = 0.0  # a critic blind to the privileged columns
    torch.save({**checkpoint, "model": agent.state_dict(), "global_step": 5}, tmp_path / "checkpoint_000001.pt")
    blind, reads = critic_reads.main(critic_reads.Args(run_dirs=(str(tmp_path),)))[str(tmp_path)]
    assert (blind["global_step"], reads["global_step"]) == (5, 10)
    assert blind["offset_std"] == 0.0 and blind["privileged_columns"] == [0.0, 0.0]
    assert reads["offset_std"] == pytest.approx(expected.std().item(), rel=1e-5) and reads["offset_std"] > 0
    # the bias unchanged and the privileged columns grown from zero: each moved by its whole norm since the first row
    assert blind["moved_off_bias"] == [0.0, 0.0]
    assert reads["moved_off_bias"] == pytest.approx(reads["privileged_columns"], rel=1e-5)


def test_critic_reads_does_not_count_a_constant_columns_bias_motion_as_reading_it():
    """Bugs in benchmarks/critic_reads.moved_off_bias: the change not measured from the run's first row, or a column
    held constant over the envs (whose weights move with the first-layer bias under Adam) counted as read."""
    from benchmarks import critic_reads
    torch.manual_seed(0)
    first = {"privileged_weights": torch.randn(8, 3), "bias": torch.randn(8)}
    bias_change, own_change = torch.randn(8), torch.randn(8)
    own_change -= bias_change * (own_change @ bias_change) / bias_change.norm() ** 2  # off the bias's direction
    later = {"bias": first["bias"] + bias_change,
             "privileged_weights": first["privileged_weights"] + torch.stack(
                 [0.5 * bias_change, own_change, 0.5 * bias_change + own_change], dim=1)}
    constant, read, both = critic_reads.moved_off_bias(first, later)
    assert constant == pytest.approx(0.0, abs=1e-5)
    assert read == pytest.approx(own_change.norm().item(), rel=1e-5)
    assert both == pytest.approx(own_change.norm().item(), rel=1e-5)
    assert critic_reads.moved_off_bias(first, first) == [0.0, 0.0, 0.0]


class DecayingMemory(torch.nn.Module):
    """A stand-in deployed policy whose memory keeps each of its coordinates at its own rate per step: memory(t) =
    rates * memory(t - 1) + obs(t), action = the memory's sum."""

    def __init__(self, rates):
        super().__init__()
        self.rates = torch.tensor(rates)

    def initial_memory(self, batch, device):
        return [torch.zeros(batch, len(self.rates), device=device)]

    def forward(self, obs, memory):
        memory = self.rates * memory + obs
        return memory.sum(-1, keepdim=True), memory


def test_memory_probe_follows_the_first_steps_difference_from_the_step_after_them():
    """Bugs: the distance compared against the wrong step (every share one step of decay off), the swapped first steps
    running past --from-step (a later step's difference counted as remembered), or pairs whose first steps are alike
    counted as forgetting."""
    from benchmarks import memory_probe

    T, B, from_step = 12, 4, 2
    observations = torch.zeros(T, B, 3)
    observations[: from_step + 1, :2] = 1.0  # episodes 0 and 1 alike in their first steps, 2 and 3 zeros
    observations[from_step + 1:] = torch.randn(T - from_step - 1, B, 3)  # the later steps: anything, the same in both
    ratios, action_gaps = memory_probe.prefix_effect(DecayingMemory([1.0, 0.5, 0.0]), observations, from_step)
    assert ratios.shape == (T - from_step - 1, 2)  # pairs (0, 3) and (2, 1) differ; (1, 0) and (3, 2) do not
    # The difference at from_step per coordinate: 1 + 1 + 1 (kept), 1 + 0.5 + 0.25 (halved each step), 1 (then gone).
    kept, halved = 1 + 1 + 1, 1 + 0.5 + 0.25
    for k in range(1, T - from_step):
        expected = math.hypot(kept, halved * 0.5 ** k) / math.hypot(kept, halved, 1.0)
        torch.testing.assert_close(ratios[k - 1], torch.full((2,), expected))
        torch.testing.assert_close(action_gaps[k - 1], torch.full((2,), kept + halved * 0.5 ** k))


def test_memory_probe_measures_the_scripts_deployed_memories_and_refuses_a_memoryless_run(in_tmp):
    """Bugs: the probe reading a script's deployed policy wrong (the transformer's window taken for its memory: the
    same later observations, so nothing kept), or following an MLP run's nothing as a memory that forgets at once."""
    from conftest import script_named

    from benchmarks import memory_probe

    run_dirs = []
    for name in ("ppo_recurrent", "ppo_transformer-memory", "ppo_continuous"):
        script = script_named(name)
        summary = script.module.train(script.args(exp_name=name.replace("-", "_")))
        run_dirs.append(os.path.dirname(summary["checkpoint"]))
    text = memory_probe.main(memory_probe.Args(run_dirs=tuple(run_dirs[:2]), from_step=2, steps=12, envs=4))
    rows = [line for line in text.splitlines() if line.startswith("| PendulumNoVel")]
    assert [row.split(" | ")[1:3] for row in rows] == [["ppo_recurrent.py", "16"], ["ppo_transformer.py", "16"]]
    for row in rows:
        shares = [float(cell.split(" (")[0]) for cell in row.strip(" |").split(" | ")[4:]]
        assert len(shares) >= 2 and all(share > 0 for share in shares)  # 1 (and 5) steps on, and the last step
    with pytest.raises(SystemExit, match=r"--run-dirs .*ppo_continuous.py without memory carries no state to probe"):
        memory_probe.main(memory_probe.Args(run_dirs=(run_dirs[2],)))
    with pytest.raises(SystemExit, match=r"--from-step 11: give a step from 0 to --steps - 2 \(10\)"):
        memory_probe.main(memory_probe.Args(run_dirs=(run_dirs[0],), from_step=11, steps=12))


class ScriptedEnvs:
    """Three envs whose one reward term at step t (from 0) is env i's (i + 1) * (t + 1); env 1's first episode ends
    (terminated) at its step 1, the others' (truncated) at step 3; the observation is the step count."""

    num_envs = 3

    def reset(self, seed):
        self.t = 0
        return torch.zeros(3, 1), {}

    def step(self, action):
        terms = {"term": torch.tensor([1.0, 2.0, 3.0]) * (self.t + 1)}
        terminated = torch.tensor([False, self.t == 1, False])
        truncated = torch.full((3,), self.t == 3)
        self.t += 1
        return torch.full((3, 1), float(self.t)), None, terminated, truncated, {"reward_terms": terms}


class ObservationAsAction(torch.nn.Module):
    """A stand-in deployed policy without memory: the action is the observation, twice (a norm of 2 obs)."""

    def initial_memory(self, batch, device):
        return []

    def forward(self, obs):
        return (torch.cat([obs, obs], -1),)


def test_episode_trace_averages_each_step_over_the_episodes_still_running(tmp_path):
    """Bugs: an env's next episode counted after its first ended (its later steps averaged in), an episode's last step
    left out, the steps averaged over every env rather than the episodes running, the action's norm taken at the
    wrong step, steps traced after every episode ended, or --hold-from's zeros sent a step late (or not at all)."""
    from benchmarks import episode_trace

    trace = episode_trace.trace_episodes(ObservationAsAction(), ScriptedEnvs(), steps=6, seed=0)
    assert trace["running"].tolist() == [3, 3, 2, 2]
    assert trace["term"].tolist() == pytest.approx([2.0, 4.0, 12.0 / 2, 16.0 / 2])  # env 1's 2, 4, then no more
    assert trace[episode_trace.ACTION].tolist() == pytest.approx([0.0, 2 ** 0.5, 2 * 2 ** 0.5, 3 * 2 ** 0.5])
    held = episode_trace.trace_episodes(ObservationAsAction(), ScriptedEnvs(), steps=6, seed=0, hold_from=2)
    assert held[episode_trace.ACTION].tolist() == pytest.approx([0.0, 2 ** 0.5, 0.0, 0.0])  # zeros from step 2 on
    path = os.path.join(tmp_path, "trace.png")
    episode_trace.plot({"run": {"trace": {name: values.tolist() for name, values in trace.items()}}}, path)
    assert os.path.getsize(path) > 0


def test_episode_trace_plots_runs_whose_tasks_report_different_terms(tmp_path, monkeypatch):
    """Bug: the plot's panels taken from the first run's terms alone, so a run of the same task with a term the
    first lacks (the reach tasks' `still`, weighted) fails with a KeyError, or its term is never drawn."""
    from benchmarks import episode_trace

    drawn = []
    monkeypatch.setattr("matplotlib.axes.Axes.set_title", lambda ax, title, *a, **k: drawn.append(title))
    trace = {"term": [1.0, 2.0], episode_trace.ACTION: [0.5, 0.5], "running": [3, 3]}
    episode_trace.plot({"plain": {"trace": trace}, "with still": {"trace": {**trace, "still": [0.1, 0.2]}}},
                       os.path.join(tmp_path, "trace.png"))
    assert drawn == ["term", episode_trace.ACTION, "still"]


def test_episode_trace_refuses_a_task_without_reward_terms(in_tmp):
    """Bug: a Gymnasium task's run (no info["reward_terms"]) ends in a KeyError traceback, or in an empty table."""
    from conftest import script_named

    from benchmarks import episode_trace

    script = script_named("ppo_continuous")
    summary = script.module.train(script.args())
    with pytest.raises(SystemExit, match=r"--run-dirs .*: its task's envs report no reward terms"):
        episode_trace.main(episode_trace.Args(run_dirs=(os.path.dirname(summary["checkpoint"]),), steps=5, envs=2))


@pytest.mark.parametrize("variant", ["centre-only", "scale-only"])
def test_normaliser_variants_keep_the_named_half_and_survive_a_checkpoint_load(monkeypatch, variant):
    """Bugs in benchmarks/normaliser_variants.py: both halves kept (the variant would be the normaliser itself), the
    named half dropped, or the whole normaliser restored when a checkpoint's statistics load (resume, evaluation)."""
    import ppo_continuous

    from benchmarks import normaliser_variants

    monkeypatch.setattr(ppo_continuous.ObsNormalizer, "refresh", ppo_continuous.ObsNormalizer.refresh)  # undone
    normaliser_variants.VARIANTS[variant]()
    obs = torch.tensor([[1.0, 5.0, -3.0], [4.0, 9.0, -1.0], [2.0, 7.0, -8.0]])
    normaliser = ppo_continuous.ObsNormalizer((3,), eps=0.5)
    normaliser.update(obs)
    mean, std = normaliser.mean.float(), normaliser.var.sqrt().float()  # the statistics are the script's concern
    assert (mean.abs() > 1).all() and (std > 1).all()  # neither half the identity's
    expected = obs - mean if variant == "centre-only" else obs / (std + 0.5)
    torch.testing.assert_close(normaliser(obs), expected)
    loaded = ppo_continuous.ObsNormalizer((3,), eps=0.5)
    loaded.load_state_dict(normaliser.state_dict())
    torch.testing.assert_close(loaded(obs), expected)


@pytest.mark.parametrize("privileged_critic", [False, True])
@pytest.mark.parametrize("variant", ["centre-absorbed", "centre-imposed"])
def test_centring_through_the_biases_gives_the_other_inputs_networks(monkeypatch, variant, privileged_critic):
    """Bugs in benchmarks/normaliser_variants.py centre-absorbed (centred inputs, the networks raw observations' would
    be) and centre-imposed (raw inputs, centred observations' networks): the mean's change not moved through the first
    layers' biases (they would be centre-only and raw observations), moved the wrong way, moved in the actor's alone or
    through the wrong normaliser (a privileged critic reads its own), or moved again when a checkpoint's statistics
    load (a resumed or evaluated policy would read observations shifted twice)."""
    import copy
    from types import SimpleNamespace

    import ppo_continuous

    from benchmarks import normaliser_variants

    for name in ("refresh", "update"):  # undone after the test
        monkeypatch.setattr(ppo_continuous.ObsNormalizer, name, getattr(ppo_continuous.ObsNormalizer, name))
    monkeypatch.setattr(ppo_continuous, "build_agent", ppo_continuous.build_agent)
    normaliser_variants.VARIANTS[variant]()
    box = lambda n: gym.spaces.Box(-np.inf, np.inf, (n,), np.float32)  # noqa: E731
    vec = SimpleNamespace(single_observation_space=box(3), single_critic_observation_space=box(4),
                          single_action_space=gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    args = ppo_continuous.Args(norm_obs=True, privileged_critic=privileged_critic, hidden_sizes=(8, 8))
    agent, obs_norm, critic_norm = ppo_continuous.build_agent(args, vec, torch.device("cpu"))
    twin = copy.deepcopy(agent)
    generator = torch.Generator().manual_seed(0)
    # Means of 2-5, moved three times by two of the features' stds; all below the clip at 10, raw or centred.
    obs, critic_obs = (0.5 * torch.randn(6, n, generator=generator) + torch.arange(n) + 2 for n in (3, 4))
    for batch in range(3):
        obs_norm.update(obs + batch)
        if critic_norm is not None:
            critic_norm.update(critic_obs - batch)
    assert (obs_norm.mean.abs() > 2).all() and (obs_norm.scale == 1).all()
    torch.testing.assert_close(obs_norm(obs), obs - obs_norm.mean.float() if variant == "centre-absorbed" else obs)

    def twin_input(x, normaliser):  # what the same networks without the variant read to compute the same
        return x if variant == "centre-absorbed" else x - normaliser.mean.float()

    critic_norm, critic_obs = (obs_norm, obs) if critic_norm is None else (critic_norm, critic_obs)
    torch.testing.assert_close(agent.actor_mean(obs_norm(obs)), twin.actor_mean(twin_input(obs, obs_norm)))
    torch.testing.assert_close(agent.critic(critic_norm(critic_obs)), twin.critic(twin_input(critic_obs, critic_norm)))
    first_layers = [agent.actor_mean[0], agent.critic[0]]
    biases = [layer.bias.clone() for layer in first_layers]
    loaded = ppo_continuous.ObsNormalizer((3,))
    loaded.readers = first_layers  # as a resumed run's: the biases are the checkpoint's, the shift already in them
    loaded.load_state_dict(obs_norm.state_dict())
    assert all(torch.equal(layer.bias, bias) for layer, bias in zip(first_layers, biases))
    torch.testing.assert_close(loaded(obs), obs_norm(obs))


@pytest.mark.parametrize("command", [
    ["normaliser_variants.py", "centre-only", "--env-id", "Pendulum-v1", "--norm-obs"],
    ["privileged_critic_variants.py", "zero-init", "--env-id", "PendulumNoVel-v1", "--privileged-critic"],
])
def test_a_variant_run_is_told_to_evaluate_and_resume_through_the_variant(tmp_path, command):
    """Bug: a run through a variant ends with `evaluate: python ppo_continuous.py --eval-checkpoint ...` (and the
    same for resume), which would evaluate or go on training without the change (a centre-only picking checkpoint
    scores 0% through the plain script and 99.6% through its variant)."""
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", command[0])
    flags = ["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "4", "--update-epochs", "2",
             "--total-timesteps", "128", "--no-progress-bar", "--policy-device", "cpu", "--sim-device", "cpu"]
    done = subprocess.run([sys.executable, script, *command[1:], *flags], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    evaluate = next(line for line in done.stdout.splitlines() if line.startswith("evaluate:"))
    assert evaluate.startswith(f"evaluate: python {script} {command[1]} --eval-checkpoint runs/"), evaluate


def test_normaliser_variants_refuse_a_run_without_the_normaliser(tmp_path):
    """Bug: the picking preset (raw observations) run through a variant without --norm-obs trains raw observations
    under a name that says otherwise."""
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                          "normaliser_variants.py")
    done = subprocess.run([sys.executable, script, "centre-only", "--env-id", "FrankaPickCube-v0"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: centre-only changes the observation normaliser, which this task's preset leaves off: add --norm-obs"]
    assert os.listdir(tmp_path) == []
