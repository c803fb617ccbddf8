"""Evaluation while training (--eval-interval), on all three scripts: it never changes the training run, each eval/*
log is what --eval-checkpoint reports for that iteration's checkpoint, checkpoint_best.pt is the best evaluation's
checkpoint (success first, then return), a resumed run remembers the best so far, and a failing evaluation env stops
the run as a failing training env does. Under torchrun: tests/test_distributed.py. And --eval-checkpoint with
--env-kwargs: the run's task changed by them."""

from __future__ import annotations

import glob
import os
import re
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch

from conftest import metrics_without_timing

EVAL_KEYS = ("eval/return", "eval/return_std", "eval/episode_length")


def without_eval(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if not k.startswith("eval/")} for h in metrics_without_timing(history)]


def model_of(path: str) -> dict:
    return torch.load(path, weights_only=True)["model"]


def assert_same_model(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_evaluating_while_training_leaves_the_training_run_unchanged(script, in_tmp, monkeypatch):
    """Bug: the evaluation draws from the training's random stream (a task or a policy sampling with torch's global
    RNG), steps the training envs, or updates the observation normaliser: a seed no longer gives the same run."""
    without = script.module.train(script.args(seed=3, eval_interval=0))
    run_episodes = script.module.run_episodes

    def drawing_run_episodes(*args, **kwargs):  # a task that draws its episodes from torch's global RNG
        torch.rand(5)
        return run_episodes(*args, **kwargs)

    monkeypatch.setattr(script.module, "run_episodes", drawing_run_episodes)
    with_eval = script.module.train(script.args(seed=3, eval_interval=1))
    assert all("eval/return" in h for h in with_eval["history"])
    assert not any("eval/return" in h for h in without["history"])
    assert without_eval(with_eval["history"]) == without_eval(without["history"])
    assert_same_model(model_of(with_eval["checkpoint"]), model_of(without["checkpoint"]))


def eval_logs_and_checkpoints(script, **flags) -> tuple[dict, dict[int, dict]]:
    """A run evaluated every second iteration with a checkpoint every iteration: (summary, {iteration: the script's
    --eval-checkpoint result of that iteration's checkpoint, with the same --eval-episodes})."""
    args = script.args(eval_interval=2, checkpoint_interval=1, **flags)
    args.total_timesteps = 3 * args.num_envs * args.num_steps  # evaluated at 2 and at the last, 3
    summary = script.module.train(args)
    evaluated = {}
    for h in summary["history"]:
        if "eval/return" in h:
            path = os.path.join(summary["run_dir"], f"checkpoint_{h['iteration']:06d}.pt")
            evaluated[h["iteration"]] = script.module.evaluate(path, args.eval_episodes, device="cpu", sim_device="cpu")
    return summary, evaluated


def assert_logged_as_evaluated(history: list[dict], evaluated: dict[int, dict], names: dict) -> None:
    for h in history:
        if h["iteration"] not in evaluated:
            continue
        result = evaluated[h["iteration"]]
        for key, name in names.items():
            assert h[name] == pytest.approx(result[key], rel=1e-6, abs=1e-6), (h["iteration"], name)


def test_eval_logs_are_what_eval_checkpoint_reports_for_that_iterations_checkpoint(script, in_tmp):
    """Bug: the evaluation during training runs another policy than the deployed one (sampled actions, a normaliser
    still updating, memory not zeroed where an episode ends), other episodes (an unseeded or drifting reset), or the
    policy of another iteration; or it skips the interval or the last iteration."""
    summary, evaluated = eval_logs_and_checkpoints(script, eval_episodes=5, init_log_std=0.5)
    assert sorted(evaluated) == [2, 3]
    assert_logged_as_evaluated(summary["history"], evaluated, {
        "mean_return": "eval/return", "std_return": "eval/return_std", "mean_length": "eval/episode_length"})
    assert evaluated[2]["mean_return"] != evaluated[3]["mean_return"]  # the policy moved: two iterations told apart


def test_eval_logs_on_the_genesis_arm_give_its_success_and_metrics(script, in_tmp):
    """Bug: the Genesis path of the evaluation (a second scene beside the training's, reset with its seed) gives
    other episodes than --eval-checkpoint, or drops the success rate and the task's metrics."""
    summary, evaluated = eval_logs_and_checkpoints(
        script, num_envs=16, num_steps=8, num_minibatches=2, update_epochs=2, eval_episodes=6,
        env_kwargs={"max_episode_steps": 10}, **script.genesis)
    names = {"mean_return": "eval/return", "mean_length": "eval/episode_length", "success_rate": "eval/success"}
    names.update({key: f"eval/{key}" for key in evaluated[3] if key not in (*names, "episodes", "std_return")})
    assert "success_rate" in evaluated[3]
    assert_logged_as_evaluated(summary["history"], evaluated, names)


SCRIPTED = {  # iteration -> what run_episodes reports: success decides, the return breaks its ties; a task metric
    i: {"episodes": 4, "mean_return": r, "std_return": 0.0, "mean_length": 9.0, "success_rate": s, "fell": i / 10}
    for i, (s, r) in enumerate([(0.25, -1.0), (0.75, -9.0), (0.75, -5.0), (0.5, 0.0), (0.75, -7.0)], start=1)
}


def scripted_evaluations(script, monkeypatch, results: dict) -> list[int]:
    """run_episodes replaced: the n-th evaluation of a run reports results[first + n] (first: the run's first
    iteration, set by the caller in the returned list)."""
    calls = [1]

    def run_episodes(policy, vec, episodes, seed, video=None):
        calls[0] += 1
        return dict(results[calls[0] - 1])

    monkeypatch.setattr(script.module, "run_episodes", run_episodes)
    return calls


def run_scripted(script, iterations: int, **flags) -> dict:
    args = script.args(eval_interval=1, **flags)
    args.total_timesteps = iterations * args.num_envs * args.num_steps
    return script.module.train(args)


def test_checkpoint_best_is_the_checkpoint_of_the_best_evaluation(script, in_tmp, monkeypatch):
    """Bug: checkpoint_best.pt kept by the last evaluation, by the worst, by the return alone where the task reports
    success, or not a whole checkpoint of that iteration."""
    real_run_episodes = script.module.run_episodes
    scripted_evaluations(script, monkeypatch, SCRIPTED)
    summary = run_scripted(script, 5, checkpoint_interval=1)
    assert [h["eval/success"] for h in summary["history"]] == [SCRIPTED[i]["success_rate"] for i in range(1, 6)]
    assert [h["eval/fell"] for h in summary["history"]] == [SCRIPTED[i]["fell"] for i in range(1, 6)]
    best = torch.load(os.path.join(summary["run_dir"], "checkpoint_best.pt"), weights_only=True)
    assert best["iteration"] == 3 and best["best_eval"] == {"iteration": 3, "score": [0.75, -5.0]}
    assert_same_model(best["model"], model_of(os.path.join(summary["run_dir"], "checkpoint_000003.pt")))
    assert torch.load(summary["checkpoint"], weights_only=True)["best_eval"]["iteration"] == 3
    monkeypatch.setattr(script.module, "run_episodes", real_run_episodes)
    result = script.module.evaluate(os.path.join(summary["run_dir"], "checkpoint_best.pt"), 2, device="cpu",
                                    sim_device="cpu")  # it evaluates (and resumes, exports) as any checkpoint
    assert result["episodes"] == 2
    assert not glob.glob(os.path.join(summary["run_dir"], "*.tmp"))


def test_without_success_the_best_checkpoint_is_the_best_return(script, in_tmp, monkeypatch):
    """Bug: a task without success (Pendulum, the Go2) never keeps a best checkpoint, or keeps the lowest return."""
    returns = {1: -50.0, 2: -20.0, 3: -30.0}
    scripted_evaluations(script, monkeypatch, {i: {"episodes": 1, "mean_return": r, "std_return": 0.0,
                                                   "mean_length": 9.0} for i, r in returns.items()})
    summary = run_scripted(script, 3)
    best = torch.load(os.path.join(summary["run_dir"], "checkpoint_best.pt"), weights_only=True)
    assert best["iteration"] == 2 and best["best_eval"]["score"] == [-20.0]
    assert "eval/success" not in summary["history"][-1]


def test_a_resumed_run_remembers_the_best_evaluation_so_far(script, in_tmp, monkeypatch):
    """Bug: resuming forgets the best evaluation, so the first evaluation after it, however bad, overwrites
    checkpoint_best.pt."""
    good_then_bad = {1: SCRIPTED[3], 2: SCRIPTED[1], 3: SCRIPTED[1], 4: SCRIPTED[1]}
    calls = scripted_evaluations(script, monkeypatch, good_then_bad)
    straight = run_scripted(script, 4, checkpoint_interval=2)
    best_path = os.path.join(straight["run_dir"], "checkpoint_best.pt")
    assert torch.load(best_path, weights_only=True)["iteration"] == 1
    os.remove(best_path)
    calls[0] = 3  # the resumed run evaluates iterations 3 and 4
    resumed = script.module.train(script.module.Args(resume=os.path.join(straight["run_dir"], "checkpoint_000002.pt"),
                                                     progress_bar=False))
    assert [h["iteration"] for h in resumed["history"]] == [3, 4]
    assert not os.path.exists(best_path)  # iterations 3 and 4 were worse than iteration 1
    assert torch.load(resumed["checkpoint"], weights_only=True)["best_eval"]["iteration"] == 1


def test_a_failing_evaluation_env_stops_the_run_with_the_last_iteration_saved(script, in_tmp, monkeypatch):
    """Bug: an env that raises in the evaluation ends the run with a traceback and nothing saved."""
    def broken(*args, **kwargs):
        raise RuntimeError("the simulator diverged")

    monkeypatch.setattr(script.module, "run_episodes", broken)
    args = script.args(eval_interval=2)
    args.total_timesteps = 3 * args.num_envs * args.num_steps
    with pytest.raises(script.module.EnvStepError, match="evaluation envs raised at iteration 2.*--resume"):
        script.module.train(args)
    (run_dir,) = glob.glob(os.path.join("runs", "*"))
    assert torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)["iteration"] == 1


def test_an_evaluation_with_env_kwargs_plays_the_runs_task_changed_by_them(script, in_tmp, capsys):
    """Bugs: --env-kwargs with --eval-checkpoint ignored (the run's own task played); replacing the run's options
    rather than going on top of them (its 30-step episodes lost); the exported policy's evaluation left unchanged."""
    summary = script.module.train(script.args(env_kwargs={"max_episode_steps": 30}))
    plain = script.module.evaluate(summary["checkpoint"], episodes=4, device="cpu")
    capsys.readouterr()
    changed = script.module.evaluate(summary["checkpoint"], episodes=4, device="cpu", env_kwargs={"g": 2.0})
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[eval]")]
    assert said == [f"[eval] {script.args().env_id} with --env-kwargs g 2.0 on top of the run's own options"]
    assert plain["mean_length"] == changed["mean_length"] == 30
    assert changed["mean_return"] != pytest.approx(plain["mean_return"], rel=1e-3)
    onnx_path, _ = script.module.export_policy(summary["checkpoint"])
    exported = script.module.evaluate(onnx_path, episodes=4, device="cpu", env_kwargs={"g": 2.0})
    assert exported["mean_return"] == pytest.approx(changed["mean_return"], rel=1e-4)


def test_a_changed_task_that_observes_or_acts_in_other_sizes_is_refused(script):
    """Bug: --env-kwargs that change what the policy observes (a height scan off, a position kept) or how many
    actions it gives (another robot's xml_file) load the policy anyway: a traceback from load_state_dict or from the
    env's step, or a policy reading the wrong numbers. Other action bounds are no refusal (the policy keeps its own)."""
    vec = SimpleNamespace(single_observation_space=gym.spaces.Box(-1, 1, (5,)),
                          single_critic_observation_space=gym.spaces.Box(-1, 1, (9,)),
                          single_action_space=gym.spaces.Box(-0.5, 0.5, (3,)))
    check, flag = script.module.check_policy_fits_task, "--env-kwargs a 1"
    check(vec, torch.Size([5]), 3, flag)
    check(vec, (5,), 3, flag)
    with pytest.raises(script.module.UsageError, match=re.escape(
            "--env-kwargs a 1: the task's observation has size (5,), the policy's (4,); leave out")):
        check(vec, torch.Size([4]), 3, flag)
    with pytest.raises(script.module.UsageError,
                       match=re.escape("the task's observation has size (5,), the policy's (6,)")):
        check(vec, (6,), 3, flag)
    with pytest.raises(script.module.UsageError, match=re.escape(
            "--env-kwargs a 1: the task's action has size 3, the policy's 2; leave out the options that change what "
            "the policy controls")):
        check(vec, (5,), 2, flag)


def test_a_changed_task_whose_critic_observes_otherwise_plays_the_same_policy(script, in_tmp):
    """Bug: the critic, built only to load the model, is built for the changed task's critic observation: a
    --privileged-critic run trained without randomised dynamics cannot be played with them (load_state_dict's size
    mismatch), nor on a task that offers the critic nothing of its own, nor a run whose task offered it nothing on
    one that does."""
    cpu = torch.device("cpu")
    for env_id, critic_spaces in (("PendulumNoVel-v1", (gym.spaces.Box(-1, 1, (5,)), None)),
                                  ("Pendulum-v1", (gym.spaces.Box(-1, 1, (5,)),))):
        summary = script.module.train(script.args(env_id=env_id, privileged_critic=True, exp_name=env_id))
        checkpoint = script.module.load_checkpoint(summary["checkpoint"], "--eval-checkpoint")
        args = script.module.args_from_checkpoint(checkpoint)
        vec = script.module.evaluation_envs(args, 4, cpu)
        try:
            as_trained = script.module.deployed_policy(args, vec, checkpoint, cpu).state_dict()
            for critic_space in critic_spaces:
                changed = SimpleNamespace(single_observation_space=vec.single_observation_space,
                                          single_action_space=vec.single_action_space,
                                          single_critic_observation_space=critic_space)
                policy = script.module.deployed_policy(args, changed, checkpoint, cpu)
                assert_same_model(policy.state_dict(), as_trained)
        finally:
            vec.close()
