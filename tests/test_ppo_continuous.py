"""ppo_continuous.py: the correctness invariants of DESIGN.md §6 (1-10, 13), each named after its bug."""

import math
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

import ppo_continuous as ppo
from envs import EpisodeTracker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING_KEYS = ("charts/SPS", "time/rollout_s", "time/update_s", "time/rollout_fraction")


def small_args(tmp_path, **overrides):
    """A Pendulum run of a few tiny iterations, writing into tmp_path/runs."""
    os.chdir(tmp_path)
    defaults = dict(env_id="Pendulum-v1", num_envs=2, num_steps=64, num_minibatches=4, update_epochs=2,
                    total_timesteps=2 * 64 * 4, progress_bar=False)
    return ppo.Args(**{**defaults, **overrides})


def metrics_without_timing(history):
    return [{k: v for k, v in h.items() if k not in TIMING_KEYS} for h in history]


# ---------------------------------------------------------------- 1, 2: GAE and bootstrapping
def naive_gae(rewards, values, last_value, final_values, terminated, truncated, gamma, lam):
    """Per env, per step: the explicit discounted sum of TD errors up to the end of the episode."""
    T, N = rewards.shape
    advantages = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        for t in range(T):
            total, k = 0.0, t
            while True:
                if terminated[k, n]:
                    next_value = 0.0
                elif truncated[k, n]:
                    next_value = final_values[k, n]
                elif k == T - 1:
                    next_value = last_value[n]
                else:
                    next_value = values[k + 1, n]
                delta = rewards[k, n] + gamma * next_value - values[k, n]
                total += (gamma * lam) ** (k - t) * delta
                if terminated[k, n] or truncated[k, n] or k == T - 1:
                    break
                k += 1
            advantages[t, n] = total
    return advantages


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_a_naive_per_episode_reference(seed):
    """Bug: advantages leaking across episode ends, or a wrong bootstrap at the rollout's last step."""
    g = torch.Generator().manual_seed(seed)
    T, N = 17, 6
    rewards, values, final_values = (torch.randn(T, N, generator=g, dtype=torch.float64) for _ in range(3))
    last_value = torch.randn(N, generator=g, dtype=torch.float64)
    terminated = torch.rand(T, N, generator=g) < 0.15
    truncated = (torch.rand(T, N, generator=g) < 0.15) & ~terminated
    terminated[-1, 0], truncated[-1, 1] = True, True  # episode ends on the last rollout step
    advantages, returns = ppo.compute_gae(rewards, values, last_value, final_values, terminated, truncated, 0.97, 0.9)
    expected = naive_gae(rewards, values, last_value, final_values, terminated, truncated, 0.97, 0.9)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)


def test_truncation_bootstraps_from_final_obs_value_and_termination_does_not_bootstrap():
    """Bug: bootstrapping a time-out from V(reset obs) or V(s_t), or a true terminal state from anything."""
    values = torch.tensor([[1.0, 1.0]])
    last_value = torch.tensor([100.0, 100.0])  # V of the reset observation that follows
    final_values = torch.tensor([[5.0, 5.0]])  # V(final_obs) of the ended episodes
    rewards = torch.zeros(1, 2)
    terminated = torch.tensor([[False, True]])
    truncated = torch.tensor([[True, False]])
    advantages, _ = ppo.compute_gae(rewards, values, last_value, final_values, terminated, truncated, 0.9, 1.0)
    assert advantages[0, 0].item() == pytest.approx(0.9 * 5.0 - 1.0)  # not 0.9*100-1, not 0.9*1-1
    assert advantages[0, 1].item() == pytest.approx(-1.0)


# ---------------------------------------------------------------- 3, 4, 5: what the update sees
class RecordingEnv:
    """A 1-D task whose reward is a known function of the observation acted on and the action received."""

    def __init__(self, num_envs, seed, device, episode_length=5, **_):
        self.num_envs, self.device = num_envs, device
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_action_space = gym.spaces.Box(-0.5, 0.5, (1,), np.float32)
        self.episodes = EpisodeTracker(num_envs, device)
        self.episode_length = episode_length
        self.received = []
        self.t = torch.zeros(num_envs)
        self.k = 0  # global step count: makes every observation unique

    def _obs(self):
        env = torch.arange(self.num_envs)
        return torch.stack([self.k + 100.0 * env, torch.sin(self.t * 1.3 + env)], -1)

    def reset(self, seed=None, options=None):
        self.t.zero_()
        self.k = 0
        self.obs = self._obs()
        return self.obs.clone(), {}

    def step(self, action):
        self.received.append(action.clone())
        reward = self.obs[:, 1] + action[:, 0]  # depends on this step's observation and (clipped) action
        self.t += 1
        self.k += 1
        truncated = self.t >= self.episode_length
        final_obs = self._obs()
        self.t[truncated] = 0
        self.obs = self._obs()
        terminated = torch.zeros_like(truncated)
        info = {"final_obs": final_obs, "episode": self.episodes.update(reward, truncated),
                "sim_errors": torch.zeros_like(truncated)}
        return self.obs.clone(), reward, terminated, truncated, info

    def state_dict(self):
        raise NotImplementedError

    def close(self):
        pass


def test_update_sees_the_rollouts_obs_unclipped_actions_and_aligned_rewards(tmp_path, monkeypatch):
    """Bugs: storing the clipped action (biased log-probs), scoring a different action than was sent,
    and obs/action/reward buffers off by one step."""
    made = []
    monkeypatch.setattr(ppo.envs, "make", lambda env_id, num_envs, seed, device, **kw: made.append(
        RecordingEnv(num_envs, seed, device)) or made[-1])
    sampled, seen_by_update = [], []
    original_act, original_loss = ppo.Agent.act, ppo.ppo_loss

    def recording_act(self, obs):
        action, logprob, value = original_act(self, obs)
        sampled.append((obs.clone(), action.clone(), logprob.clone()))
        return action, logprob, value

    def recording_loss(agent, obs, actions, old_logprobs, advantages, returns, old_values, args):
        seen_by_update.append((obs.clone(), actions.clone(), old_logprobs.clone(), returns.clone()))
        return original_loss(agent, obs, actions, old_logprobs, advantages, returns, old_values, args)

    monkeypatch.setattr(ppo.Agent, "act", recording_act)
    monkeypatch.setattr(ppo, "ppo_loss", recording_loss)
    args = small_args(tmp_path, num_envs=3, num_steps=8, num_minibatches=1, update_epochs=1,
                      total_timesteps=24, gamma=0.0, norm_obs=False, norm_reward=False, init_log_std=1.0)
    summary = ppo.train(args)

    rollout_obs = torch.cat([o for o, _, _ in sampled])
    rollout_actions = torch.cat([a for _, a, _ in sampled])
    rollout_logprobs = torch.cat([lp for _, _, lp in sampled])
    sent = torch.cat(made[0].received)
    assert (rollout_actions.abs() > 0.5).any(), "std e^1 must produce out-of-bounds samples"
    torch.testing.assert_close(sent, rollout_actions.clamp(-0.5, 0.5))  # the env gets the clipped action

    obs, actions, old_logprobs, returns = seen_by_update[0]
    order = torch.argsort(obs[:, 0])  # match minibatch rows to rollout rows by their (unique) observation
    rollout_order = torch.argsort(rollout_obs[:, 0])
    torch.testing.assert_close(obs[order], rollout_obs[rollout_order])
    torch.testing.assert_close(actions[order], rollout_actions[rollout_order])  # unclipped samples stored
    torch.testing.assert_close(old_logprobs[order], rollout_logprobs[rollout_order])
    # gamma = 0: the value target of step t is r_t = obs_t[1] + clip(a_t), so rewards sit at their step's index.
    torch.testing.assert_close(returns, obs[:, 1] + actions[:, 0].clamp(-0.5, 0.5))
    assert summary["history"][0]["debug/first_minibatch_ratio_max_dev"] < 1e-6


def test_first_minibatch_has_ratio_one_and_zero_kl_with_normalisers_on(tmp_path):
    """Bug: the update sees different observations (re-normalised with newer statistics) than the rollout."""
    summary = ppo.train(small_args(tmp_path, norm_obs=True, norm_reward=True, init_log_std=0.5))
    for h in summary["history"]:
        assert h["debug/first_minibatch_ratio_max_dev"] < 1e-5
        assert abs(h["debug/first_minibatch_approx_kl"]) < 1e-6
        assert h["losses/approx_kl"] > 0  # later minibatches did move the policy


def test_tanh_log_prob_matches_torch_transformed_distribution():
    """Bug: a tanh-squashed policy scored without the change-of-variables term (or an unstable one)."""
    agent = ppo.Agent(3, 2, (8,), "tanh", -0.3, np.array([-2.0, 0.0]), np.array([2.0, 1.0]), "tanh")
    obs = torch.randn(64, 3)
    dist = agent.distribution(obs)
    u = dist.sample() * 2
    low, high = agent.action_low, agent.action_high
    reference = TransformedDistribution(dist, [TanhTransform(), AffineTransform((high + low) / 2, (high - low) / 2)])
    expected = reference.log_prob(agent.env_action(u)).sum(-1)
    torch.testing.assert_close(agent.log_prob(dist.mean, u), expected, atol=1e-4, rtol=1e-4)
    assert torch.isfinite(agent.log_prob(dist.mean, torch.full((64, 2), 40.0))).all()  # saturated tanh stays finite


def test_closed_form_sampling_log_prob_and_entropy_match_torch_distributions():
    """Bug: a slip in the hand-written Gaussian (a missing 1/2, log-std used as std, the wrong noise scale)."""
    torch.manual_seed(0)
    agent = ppo.Agent(3, 2, (8,), "tanh", 0.0, np.array([-1.0, -1.0]), np.array([1.0, 1.0]), "clip")
    agent.actor_logstd.data = torch.tensor([[-0.7, 0.4]])
    obs = torch.randn(5, 3).repeat_interleave(4000, 0)
    dist = agent.distribution(obs)
    with torch.no_grad():
        actions, logprobs, _ = agent.act(obs)
        new_logprobs, entropy, _ = agent.evaluate(obs, actions)
    torch.testing.assert_close(logprobs, dist.log_prob(actions).sum(-1))
    torch.testing.assert_close(new_logprobs, logprobs)
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
    noise = (actions - dist.mean) / dist.stddev
    assert noise.mean(0).abs().max() < 0.03 and (noise.std(0) - 1).abs().max() < 0.03


def test_clip_mode_scores_the_unclipped_gaussian_sample():
    agent = ppo.Agent(3, 1, (8,), "tanh", 0.0, np.array([-1.0]), np.array([1.0]), "clip")
    dist = agent.distribution(torch.zeros(1, 3))
    u = torch.tensor([[3.0]])
    assert agent.log_prob(dist.mean, u).item() == pytest.approx(dist.log_prob(u).item())
    assert agent.env_action(u).item() == 1.0


# ---------------------------------------------------------------- 6, 8: the loss
def loss_inputs(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    agent = ppo.Agent(4, 2, (16,), "tanh", 0.0, np.array([-1.0, -1.0]), np.array([1.0, 1.0]), "clip")
    obs = torch.randn(n, 4, generator=g)
    with torch.no_grad():
        actions, logprobs, values = agent.act(obs)
    return agent, obs, actions, logprobs, values, torch.randn(n, generator=g)


def test_advantages_are_normalised_and_returns_are_not():
    """Bug: normalising value targets (the critic learns the wrong scale) or not normalising advantages."""
    agent, obs, actions, logprobs, values, advantages = loss_inputs()
    args = ppo.Args(clip_vloss=False, ent_coef=0.0, vf_coef=0.5)
    returns = torch.full_like(values, 100.0)
    _, stats = ppo.ppo_loss(agent, obs, actions, logprobs + 0.1 * advantages, advantages, returns, values, args)
    _, scaled = ppo.ppo_loss(agent, obs, actions, logprobs + 0.1 * advantages, 10 * advantages + 3, returns, values, args)
    assert stats["policy_loss"].item() == pytest.approx(scaled["policy_loss"].item(), rel=1e-5)
    assert stats["value_loss"].item() == pytest.approx(0.5 * (values - 100.0).square().mean().item(), rel=1e-6)


def test_std_is_exp_of_log_std_without_clamping():
    """Bug: a clamp on log-std that silently stops exploration from shrinking or growing."""
    agent, obs, *_ = loss_inputs()
    for log_std in (-30.0, 5.0):
        agent.actor_logstd.data.fill_(log_std)
        torch.testing.assert_close(agent.distribution(obs).stddev, torch.full((32, 2), math.exp(log_std)))


def test_entropy_bonus_rewards_entropy():
    """Bug: `+ ent_coef * H` in the loss, which drives the policy to collapse."""
    agent, obs, actions, logprobs, values, _ = loss_inputs()
    args = ppo.Args(ent_coef=1.0, vf_coef=0.0, norm_adv=False)
    loss, _ = ppo.ppo_loss(agent, obs, actions, logprobs, torch.zeros(32), values, values, args)
    loss.backward()
    assert (agent.actor_logstd.grad < 0).all()  # gradient descent raises log-std


# ---------------------------------------------------------------- 7, 9, 10: schedule, clipping, normalisers
def test_learning_rate_anneals_once_per_iteration(tmp_path):
    """Bug: annealing per minibatch or epoch, which reaches zero long before the end."""
    args = small_args(tmp_path, learning_rate=1e-3, anneal_lr=True, adaptive_kl=0.0, total_timesteps=4 * 128)
    history = ppo.train(args)["history"]
    logged = [h["charts/learning_rate"] for h in history]
    assert logged == pytest.approx([1e-3 * (1 - i / 4) for i in range(4)])


def test_adaptive_kl_schedule_moves_the_learning_rate(tmp_path):
    args = small_args(tmp_path, learning_rate=1e-3, adaptive_kl=1e-6, total_timesteps=2 * 128)
    history = ppo.train(args)["history"]
    assert history[-1]["charts/learning_rate"] < 1e-3  # far above the tiny desired KL: the rate shrinks


def test_gradient_clipping_covers_every_parameter(tmp_path, monkeypatch):
    """Bug: clipping only the actor (or forgetting log-std), so the critic's gradients blow up the step."""
    norms_at_step = []
    original_step = torch.optim.Adam.step

    def recording_step(self, *a, **kw):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        norms_at_step.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
        return original_step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    history = ppo.train(small_args(tmp_path, max_grad_norm=0.01, norm_reward=False))["history"]
    assert history[0]["losses/grad_norm_total"] > 0.1  # clipping was needed
    assert max(norms_at_step) <= 0.01 * (1 + 1e-4)


def test_normaliser_updates_only_from_rollout_data_is_saved_and_frozen_in_eval(tmp_path, monkeypatch):
    """Bugs: updating statistics during the update or evaluation, or losing them with the checkpoint."""
    args = small_args(tmp_path)
    summary = ppo.train(args)
    checkpoint = torch.load(summary["checkpoint"], weights_only=True)
    # The reset observation plus one per env and step: nothing else (final_obs, update, bootstrap) counted.
    expected_count = 1e-4 + args.num_envs * (1 + summary["global_step"] // args.num_envs)
    assert checkpoint["obs_normalizer"]["count"].item() == pytest.approx(expected_count)
    assert checkpoint["obs_normalizer"]["var"].min() > 0
    monkeypatch.setattr(ppo.RunningMeanStd, "update", lambda *a: pytest.fail("normaliser updated in evaluation"))
    result = ppo.evaluate(summary["checkpoint"], episodes=2, device="cpu")
    assert result["episodes"] == 2 and np.isfinite(result["mean_return"])


def test_running_statistics_merged_batch_by_batch_equal_those_of_all_data_at_once():
    """Bugs: a wrong merge formula (a missing between-batch term, count-weighted the wrong way), a count that
    stops tracking the data, or a host copy of the count that a loaded state dict does not refresh."""
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(n, 3, generator=generator) * 3 + 5 for n in (1, 7, 1, 30, 2)]
    stats = ppo.RunningMeanStd((3,), epsilon=1e-4)
    for batch in batches:
        stats.update(batch)
    # The prior is epsilon observations of mean 0 and variance 1.
    data = torch.cat(batches).double()
    count = 1e-4 + len(data)
    mean = data.sum(0) / count
    var = ((data - mean).square().sum(0) + 1e-4 * (1 + mean.square())) / count
    torch.testing.assert_close(stats.mean, mean)
    torch.testing.assert_close(stats.var, var)
    assert stats.count.item() == pytest.approx(count)
    restored = ppo.ObsNormalizer((3,))
    # Nested, as in a checkpoint of a larger module: the hook must run for submodules too.
    torch.nn.ModuleDict({"norm": restored}).load_state_dict(torch.nn.ModuleDict({"norm": stats}).state_dict())
    assert restored.host_count == pytest.approx(count)
    restored.update(batches[0]), stats.update(batches[0])
    torch.testing.assert_close(restored.var, stats.var)


def test_reward_scaling_of_a_whole_rollout_equals_scaling_step_by_step():
    """Bugs: the discounted return restarting one step early or late around an episode's end, the return not
    carried into the next rollout, or statistics merged in the wrong order (each step must be scaled by the
    statistics that include it and nothing later)."""
    gamma, num_envs, num_steps = 0.9, 3, 12
    generator = torch.Generator().manual_seed(1)

    def step_by_step(stats: ppo.RunningMeanStd, running: torch.Tensor, rewards, dones):
        scaled = []
        for reward, done in zip(rewards, dones):
            running = gamma * running + reward.double()
            stats.update(running)
            running = running.masked_fill(done, 0.0)
            scaled.append(reward / torch.sqrt(stats.var + 1e-8))
        return torch.stack(scaled).float(), running

    scaler = ppo.RewardScaler(num_envs, gamma)
    reference_stats, reference_running = ppo.RunningMeanStd(), torch.zeros(num_envs, dtype=torch.float64)
    for rollout in range(3):
        rewards = torch.randn(num_steps, num_envs, generator=generator) * 5 - 3
        dones = torch.rand(num_steps, num_envs, generator=generator) < 0.2
        dones[-1, rollout % num_envs] = True  # an episode that ends on the rollout's last step
        expected, reference_running = step_by_step(reference_stats, reference_running, rewards, dones)
        torch.testing.assert_close(scaler(rewards, dones), expected)
        torch.testing.assert_close(scaler.returns, reference_running)
        torch.testing.assert_close(scaler.return_rms.var, reference_stats.var)
        torch.testing.assert_close(scaler.return_rms.mean, reference_stats.mean)
        assert scaler.return_rms.count.item() == pytest.approx(reference_stats.count.item())


# ---------------------------------------------------------------- 13: reproducibility and resume
def test_same_seed_gives_identical_metrics_and_another_seed_does_not(tmp_path):
    """Bug: unseeded sampling, permutation or env somewhere in the loop."""
    first = ppo.train(small_args(tmp_path, seed=3))["history"]
    second = ppo.train(small_args(tmp_path, seed=3))["history"]
    other = ppo.train(small_args(tmp_path, seed=4))["history"]
    assert metrics_without_timing(first) == metrics_without_timing(second)
    assert metrics_without_timing(first) != metrics_without_timing(other)


def test_resume_from_a_checkpoint_continues_exactly_like_an_uninterrupted_run(tmp_path):
    """Bug: resuming resets the step counter, optimiser, normalisers, RNG or envs (a different run)."""
    straight = ppo.train(small_args(tmp_path, total_timesteps=4 * 128, checkpoint_interval=2))
    midpoint = os.path.join(straight["run_dir"], "checkpoint_000002.pt")
    resumed = ppo.train(ppo.Args(resume=midpoint, progress_bar=False))
    assert resumed["run_dir"] == straight["run_dir"] and resumed["global_step"] == straight["global_step"]
    assert [h["iteration"] for h in resumed["history"]] == [3, 4]
    assert metrics_without_timing(resumed["history"]) == metrics_without_timing(straight["history"][2:])


def test_checkpoint_loads_with_weights_only_and_holds_the_documented_state(tmp_path):
    summary = ppo.train(small_args(tmp_path))
    checkpoint = torch.load(summary["checkpoint"], weights_only=True)
    for key in ("args", "model", "optimizer", "obs_normalizer", "reward_scaler", "global_step", "iteration", "rng", "env"):
        assert key in checkpoint
    assert checkpoint["global_step"] == summary["global_step"] == 512 and checkpoint["iteration"] == 4
    assert not any(name.endswith(".tmp") for name in os.listdir(summary["run_dir"]))


# ---------------------------------------------------------------- CLI and errors
def run_cli(*flags, cwd):
    return subprocess.run([sys.executable, os.path.join(REPO, "ppo_continuous.py"), *flags], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_help_lists_every_flag_with_its_docstring(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    for flag in ("--env-id", "--total-timesteps", "--adaptive-kl", "--resume", "--eval-checkpoint"):
        assert flag in result.stdout
    assert "anneal the learning rate" in result.stdout


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--env-id", "Pendulum-v1", "--num-minibatches", "7"], "--num-minibatches 7"),
        (["--env-id", "HalfCheeta-v5"], "HalfCheetah-v5"),
        (["--resume", "runs/nowhere"], "no checkpoint"),
        (["--eval-checkpoint", "nowhere.pt"], "no checkpoint"),
        (["--env-id", "Pendulum-v1", "--total-timesteps", "10"], "--total-timesteps"),
    ],
)
def test_bad_flags_give_a_clear_error_naming_the_flag(tmp_path, flags, message):
    result = run_cli(*flags, "--no-progress-bar", cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    result = run_cli("--env-id", "Pendulum-v1", "--cuda", cwd=tmp_path)
    assert result.returncode != 0 and "--cuda" in result.stderr and "Traceback" not in result.stderr


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    """Bug: an interrupted run loses everything since the last periodic checkpoint."""
    process = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "ppo_continuous.py"), "--env-id", "Pendulum-v1", "--num-steps", "256",
         "--total-timesteps", "10000000", "--checkpoint-interval", "1000000", "--no-progress-bar"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.time() + 120
    while not list(tmp_path.glob("runs/*/events.*")) and time.time() < deadline:
        time.sleep(0.5)
    time.sleep(3)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    checkpoints = list(tmp_path.glob("runs/*/checkpoint.pt"))
    assert checkpoints and torch.load(checkpoints[0], weights_only=True)["iteration"] >= 1


# ---------------------------------------------------------------- learning and the Genesis path
def test_pendulum_improves_clearly_within_a_ci_budget(tmp_path):
    """Bug: any of the silent PPO bugs above; the policy does not learn."""
    summary = ppo.train(small_args(tmp_path, num_envs=4, num_steps=1024, num_minibatches=64, update_epochs=10,
                                   total_timesteps=100 * 1024, seed=1))
    returns = [h["charts/episodic_return"] for h in summary["history"] if "charts/episodic_return" in h]
    assert np.mean(returns[:2]) < -900  # a random policy
    assert np.mean(returns[-3:]) > -500  # about -205 on the reference machine; the preset reaches about -190 at 200k


def test_franka_reach_trains_with_success_and_reward_term_logging(tmp_path):
    """Bug: the Genesis path (sim device, success, reward terms, no final-obs) breaks the script."""
    args = small_args(tmp_path, env_id="FrankaReach-v0", num_envs=16, num_steps=8, num_minibatches=2,
                      update_epochs=2, total_timesteps=16 * 8 * 3, sim_device="cpu", policy_device="cpu",
                      env_kwargs={"max_episode_steps": 10})
    summary = ppo.train(args)
    last = summary["history"][-1]
    assert "charts/success_rate" in last and "reward_terms/distance" in last and last["reward_terms/distance"] < 0
    assert all(h["debug/first_minibatch_ratio_max_dev"] < 1e-5 for h in summary["history"])
    result = ppo.evaluate(summary["checkpoint"], episodes=4, device="cpu", sim_device="cpu")
    assert result["episodes"] == 4 and 0.0 <= result["success_rate"] <= 1.0


def test_env_kwargs_flag_keeps_integers_integers():
    """Bug: `--env-kwargs decimation 4` parsed as 4.0, which the env rejects."""
    import tyro

    args = tyro.cli(ppo.Args, args=["--env-kwargs", "decimation", "4", "action_scale", "0.1", "stagger_episodes", "False"])
    assert args.env_kwargs == {"decimation": 4, "action_scale": 0.1, "stagger_episodes": False}
    assert isinstance(args.env_kwargs["decimation"], int)
