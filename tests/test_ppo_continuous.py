"""ppo_continuous.py alone: its --help, learning and --env-kwargs parsing. The invariants it shares with the other
two scripts (docs/design.md §6) are tested on all three in test_invariants.py, bad input, signals and resume in
test_robustness.py."""

import numpy as np

import ppo_continuous as ppo
from conftest import run_cli, script_named

SCRIPT = script_named("ppo_continuous")


# ---------------------------------------------------------------- the command line
def test_help_lists_every_flag_with_its_docstring(tmp_path):
    result = run_cli("ppo_continuous", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for flag in ("--env-id", "--total-timesteps", "--lr-schedule", "--resume", "--eval-checkpoint"):
        assert flag in result.stdout
    assert "CleanRL's switch" in result.stdout


# ---------------------------------------------------------------- learning
def test_pendulum_improves_clearly_within_a_ci_budget(in_tmp):
    """Bug: any silent PPO bug that the invariant tests miss; the policy does not learn."""
    summary = ppo.train(SCRIPT.args(num_envs=4, num_steps=1024, num_minibatches=64, update_epochs=10,
                                   total_timesteps=100 * 1024, seed=1))
    returns = [h["charts/episodic_return"] for h in summary["history"] if "charts/episodic_return" in h]
    assert np.mean(returns[:2]) < -900  # a random policy
    assert np.mean(returns[-3:]) > -500  # about -205 on the reference machine; the preset reaches about -190 at 200k


def test_env_kwargs_flag_keeps_integers_integers():
    """Bug: `--env-kwargs decimation 4` parsed as 4.0, which the env rejects."""
    import tyro

    args = tyro.cli(ppo.Args, args=["--env-kwargs", "decimation", "4", "action_scale", "0.1",
                                    "stagger_episodes", "False"])
    assert args.env_kwargs == {"decimation": 4, "action_scale": 0.1, "stagger_episodes": False}
    assert isinstance(args.env_kwargs["decimation"], int)
