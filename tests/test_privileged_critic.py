"""--privileged-critic: the critic trained on the task's own critic observation (docs/design.md §3), the policy on
its observation: the values acted with, the bootstrap after a truncation and after the last step, the update's
value inputs, the critic's normaliser in checkpoints, resume and evaluation."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from conftest import episode_schedule, metrics_without_timing, script_named, use_scripted_env

PRIVILEGED = ("ppo_continuous", "ppo_recurrent", "ppo_transformer")


def value_of(agent, critic_obs):
    """The privileged critic's value: an MLP on the critic observation alone, in every script."""
    return agent.critic(critic_obs).squeeze(-1)


@pytest.mark.parametrize("name", PRIVILEGED)
def test_the_critic_acts_and_bootstraps_on_its_own_observations(name, in_tmp, monkeypatch):
    """Bugs: the critic reading the policy's final observation at a truncation (or its observation after the last
    step), valuing the steps it acted on from the policy's observation, or trained in the update on the policy's
    observation (or on another step's critic observation)."""
    script = script_named(name)
    module = script.module
    args = script.args(privileged_critic=True, norm_obs=False, norm_reward=False, num_envs=3, num_steps=16,
                       num_minibatches=2, update_epochs=1, total_timesteps=3 * 16 * 3)
    env = use_scripted_env(monkeypatch, module, episode_schedule(4096, 3, 16), critic=True)
    built, calls, losses = [], [], []
    build_agent, compute_gae, ppo_loss = module.build_agent, module.compute_gae, module.ppo_loss

    def capture_agent(*inputs):
        built.append(build_agent(*inputs))
        return built[-1]

    def capture_gae(*inputs):
        with torch.inference_mode(False):  # the weights that acted, before the update changes them
            calls.append((tuple(x.clone() if torch.is_tensor(x) else x for x in inputs), copy.deepcopy(built[0][0])))
        return compute_gae(*inputs)

    def capture_loss(agent, *inputs):
        losses.append(tuple(x.detach().clone() if torch.is_tensor(x) else x for x in inputs[:-1]))  # less args
        return ppo_loss(agent, *inputs)

    monkeypatch.setattr(module, "build_agent", capture_agent)
    monkeypatch.setattr(module, "compute_gae", capture_gae)
    monkeypatch.setattr(module, "ppo_loss", capture_loss)
    module.train(args)
    for inputs in losses:  # each row's critic observation is that of the step its policy observation is
        critic_obs = inputs[-1]
        if critic_obs.dim() == 3:  # (K, B) sequences, in the rows' order
            critic_obs = critic_obs.transpose(0, 1).flatten(0, 1)
        torch.testing.assert_close(critic_obs, env[0].critic_of(script.loss_rows(inputs)["obs"]))
    assert built[0][2] is not None  # the critic's own normaliser
    env = env[0]
    truncations = 0
    for iteration, ((_, values, last_value, final_values, _, truncated, *_), agent) in enumerate(calls):
        steps = range(iteration * 16, (iteration + 1) * 16)
        with torch.inference_mode():
            # the observation each step acted on: the one the env returned before it (the reset's first)
            acted = torch.stack([env.critic_of(env.first_obs if k == 0 else env.obs_log[k - 1]) for k in steps])
            torch.testing.assert_close(values, value_of(agent, acted))
            final = torch.stack([env.critic_of(env.final_obs[k]) for k in steps])
            torch.testing.assert_close(final_values[truncated], value_of(agent, final)[truncated])
            torch.testing.assert_close(last_value, value_of(agent, env.critic_of(env.obs_log[steps[-1]])))
        truncations += int(truncated.sum())
    assert truncations >= 3 * len(calls)


@pytest.mark.parametrize("name", PRIVILEGED)
def test_the_critics_normaliser_is_saved_and_resume_continues_exactly(name, in_tmp):
    """Bugs: the critic's observation normaliser left out of checkpoints (a resumed run restarts its statistics),
    or a checkpoint whose critic cannot be rebuilt for evaluation."""
    script = script_named(name)
    args = script.args(env_id="PendulumNoVel-v1", privileged_critic=True, checkpoint_interval=2)
    args.total_timesteps = 4 * args.num_envs * args.num_steps
    straight = script.module.train(args)
    midpoint = torch.load(os.path.join(straight["run_dir"], "checkpoint_000002.pt"), weights_only=True)
    critic_stats = midpoint["critic_obs_normalizer"]
    assert critic_stats["count"].item() > 1 and critic_stats["mean"].shape == (3,)  # Pendulum-v1's whole observation
    resume = os.path.join(straight["run_dir"], "checkpoint_000002.pt")
    resumed = script.module.train(script.module.Args(resume=resume, progress_bar=False))
    assert metrics_without_timing(resumed["history"]) == metrics_without_timing(straight["history"][2:])
    result = script.module.evaluate(straight["checkpoint"], episodes=2)
    assert result["episodes"] == 2
