"""ppo_transformer.py: DESIGN.md §6 items 5, 12 and 13 for attention over steps and tokens, each test named
after the bug it catches."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import ppo_transformer as ppo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING_KEYS = ("charts/SPS", "time/rollout_s", "time/update_s", "time/rollout_fraction")
MODES = {"history": dict(context_len=4, num_tokens=1), "tokens": dict(context_len=1, num_tokens=3),
         "both": dict(context_len=3, num_tokens=2)}


def small_args(tmp_path, **overrides):
    """PendulumNoVel with 7-step episodes, so that windows cross episode starts all the time."""
    os.chdir(tmp_path)
    defaults = dict(env_id="PendulumNoVel-v1", num_envs=3, num_steps=16, num_minibatches=4, update_epochs=2,
                    total_timesteps=3 * 16 * 3, token_dim=8, num_heads=2, num_layers=2, hidden_sizes=(16,),
                    env_kwargs={"max_episode_steps": 7}, progress_bar=False)
    return ppo.Args(**{**defaults, **overrides})


def metrics_without_timing(history):
    return [{k: v for k, v in h.items() if k not in TIMING_KEYS} for h in history]


def make_agent(obs_dim=3, seed=0, **overrides):
    torch.manual_seed(seed)
    args = ppo.resolve_args(ppo.Args(**{**dict(env_id="PendulumNoVel-v1", token_dim=8, num_heads=2, num_layers=2,
                                               critic="shared", small_init=False), **overrides}))
    return ppo.TransformerAgent(obs_dim, 2, args, np.array([-1.0, -1.0]), np.array([1.0, 1.0]))


def simulate_context(obs, done, context_len, boundaries=()):
    """Runs the rollout's bookkeeping over (T, N) steps, cutting rollouts at `boundaries`. Returns the windows
    the policy acted on at every step, and those the update rebuilds from each rollout's buffers."""
    T, N, D = obs.shape
    context = ppo.Context(N, context_len, D, torch.device("cpu"))
    acted_windows, acted_valid, rebuilt_windows, rebuilt_valid = [], [], [], []
    cuts = [0, *boundaries, T]
    for begin, end in zip(cuts[:-1], cuts[1:]):
        context_obs, context_episode = context.obs[:, 1:].transpose(0, 1), context.episode[:, 1:].transpose(0, 1)
        episodes = []
        for t in range(begin, end):
            context.push(obs[t])
            episodes.append(context.episode_id.clone())
            acted_windows.append(context.obs)
            acted_valid.append(context.valid())
            context.end_episodes(done[t])
        windows, valid = ppo.rollout_windows(context_obs, context_episode, obs[begin:end], torch.stack(episodes))
        rebuilt_windows.append(windows)
        rebuilt_valid.append(valid)
    return (torch.stack(acted_windows), torch.stack(acted_valid), torch.cat(rebuilt_windows), torch.cat(rebuilt_valid))


def random_rollout(T=20, N=3, D=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, N, D, generator=g)
    done = torch.rand(T, N, generator=g) < 0.2
    done[4, 0] = True
    return obs, done


# ---------------------------------------------------------------- 12: windows and masks
@pytest.mark.parametrize("boundaries", [(), (7,), (1, 2, 9, 15)])
def test_rebuilt_windows_equal_the_rollouts_across_rollout_boundaries(boundaries):
    """Bugs: the update rebuilding windows without the steps carried over from the previous rollout, shifted by
    one, or with another episode's steps marked valid."""
    obs, done = random_rollout()
    acted_w, acted_v, rebuilt_w, rebuilt_v = simulate_context(obs, done, context_len=5, boundaries=boundaries)
    _, _, uninterrupted_w, uninterrupted_v = simulate_context(obs, done, context_len=5)
    torch.testing.assert_close(rebuilt_w, acted_w)
    torch.testing.assert_close(rebuilt_w, uninterrupted_w)
    assert torch.equal(rebuilt_v, acted_v) and torch.equal(rebuilt_v, uninterrupted_v)
    # valid marks exactly the steps of the current episode among the last K, and they hold those steps' obs
    episode_of = torch.cat([torch.zeros(1, 3, dtype=torch.long), done.long().cumsum(0)])[:-1]
    for t in range(obs.shape[0]):
        for k in range(5):
            source = t - 4 + k
            for n in range(3):
                same = source >= 0 and bool(episode_of[source, n] == episode_of[t, n])
                assert bool(acted_v[t, n, k]) == same
                if same:
                    torch.testing.assert_close(acted_w[t, n, k], obs[source, n])


@pytest.mark.parametrize("mode", MODES)
def test_previous_episode_never_changes_the_outputs(mode):
    """Bug: attending to (or through the positions of) the previous episode's observations."""
    agent = make_agent(**MODES[mode])
    obs, done = random_rollout(T=30)
    windows, valid, _, _ = simulate_context(obs, done, agent.context_len)
    windows, valid = windows.flatten(0, 1), valid.flatten(0, 1)
    assert (~valid).any() or agent.context_len == 1
    noisy = windows + 100.0 * torch.randn_like(windows) * (~valid).unsqueeze(-1)
    with torch.no_grad():
        torch.testing.assert_close(agent.features(noisy, valid), agent.features(windows, valid))
        changed = windows + 1.0 * valid.unsqueeze(-1)
        assert not torch.allclose(agent.features(changed, valid), agent.features(windows, valid))


@pytest.mark.parametrize("mode", MODES)
def test_a_future_step_never_changes_earlier_outputs(mode):
    """Bug: a window (or attention mask) that reaches past the current step."""
    agent = make_agent(**MODES[mode])
    obs, done = random_rollout(T=12)
    perturbed = obs.clone()
    perturbed[6:] += 5.0
    with torch.no_grad():
        outputs = [agent.features(*(x.flatten(0, 1) for x in simulate_context(o, done, agent.context_len)[:2]))
                   for o in (obs, perturbed)]
    N = obs.shape[1]
    torch.testing.assert_close(outputs[0][: 6 * N], outputs[1][: 6 * N])
    assert not torch.allclose(outputs[0][6 * N :], outputs[1][6 * N :])


@pytest.mark.parametrize("context_len,episode_length", [(1, 1), (1, 50), (32, 1), (32, 2), (32, 50)])
@pytest.mark.parametrize("gated,pre_ln", [(False, True), (True, False)])
def test_no_nan_with_the_shortest_and_longest_contexts(context_len, episode_length, gated, pre_ln):
    """Bug: a fully masked attention row (softmax over nothing) turning outputs or gradients into NaN."""
    agent = make_agent(context_len=context_len, num_tokens=2, gated=gated, pre_ln=pre_ln)
    T, N = 40, 2
    obs = torch.randn(T, N, 3)
    done = torch.zeros(T, N, dtype=torch.bool)
    done[episode_length - 1 :: episode_length] = True
    windows, valid, _, _ = simulate_context(obs, done, context_len)
    windows, valid = windows.flatten(0, 1), valid.flatten(0, 1)
    logprob, entropy, value = agent.evaluate(windows, valid, torch.randn(T * N, 2))
    (logprob.sum() + value.sum()).backward()
    assert torch.isfinite(logprob).all() and torch.isfinite(value).all()
    assert all(torch.isfinite(p.grad).all() for p in agent.parameters() if p.grad is not None)
    diagnostics = {"attention_entropy": [], "residual_ratio": []}
    with torch.no_grad():
        agent.features(windows, valid, diagnostics)
    assert all(torch.isfinite(e).all() for e in diagnostics["attention_entropy"])


def test_small_init_starts_the_branches_quiet():
    """Bug: --small-init not reaching the branch outputs, so early training is dominated by random attention."""
    obs, done = random_rollout()
    windows, valid, _, _ = simulate_context(obs, done, 4)
    ratios = {}
    for small in (True, False):
        diagnostics = {"attention_entropy": [], "residual_ratio": []}
        with torch.no_grad():
            make_agent(context_len=4, small_init=small).features(windows.flatten(0, 1), valid.flatten(0, 1), diagnostics)
        ratios[small] = max(r.item() for r in diagnostics["residual_ratio"])
    assert ratios[True] < 0.05 < ratios[False]


# ---------------------------------------------------------------- 5: what the update sees
@pytest.mark.parametrize("mode", MODES)
def test_first_minibatch_has_ratio_one_and_zero_kl(tmp_path, mode):
    """Bug: the update scoring actions on other windows than the rollout acted on (lost carried context,
    a missed episode start, observations re-normalised with newer statistics)."""
    summary = ppo.train(small_args(tmp_path, init_log_std=0.5, **MODES[mode]))
    for h in summary["history"]:
        assert h["debug/first_minibatch_ratio_max_dev"] < 1e-5
        assert abs(h["debug/first_minibatch_approx_kl"]) < 1e-6
        assert h["losses/approx_kl"] > 0


def test_attention_diagnostics_are_logged_per_layer_and_head(tmp_path):
    args = small_args(tmp_path, context_len=4, num_tokens=2, num_layers=2, num_heads=2)
    last = ppo.train(args)["history"][-1]
    for layer in range(2):
        for head in range(2):
            entropy = last[f"attention/entropy_layer{layer}_head{head}"]
            assert 0.0 <= entropy <= math.log(4 * 2) + 1e-5  # at most uniform over the window's tokens
        assert last[f"residual/update_ratio_layer{layer}_attention"] > 0
        assert last[f"residual/update_ratio_layer{layer}_ff"] > 0
        assert last[f"gradients/grad_max_layer/{layer}"] > 0


# ---------------------------------------------------------------- 13: reproducibility and resume
def test_same_seed_gives_identical_metrics_and_another_seed_does_not(tmp_path):
    first = ppo.train(small_args(tmp_path, seed=3))["history"]
    second = ppo.train(small_args(tmp_path, seed=3))["history"]
    other = ppo.train(small_args(tmp_path, seed=4))["history"]
    assert metrics_without_timing(first) == metrics_without_timing(second)
    assert metrics_without_timing(first) != metrics_without_timing(other)


def test_resume_continues_exactly_like_an_uninterrupted_run_context_included(tmp_path):
    """Bug: resuming with an empty context window (or fresh episodes) instead of the carried one."""
    straight = ppo.train(small_args(tmp_path, context_len=4, total_timesteps=4 * 48, checkpoint_interval=2))
    midpoint = os.path.join(straight["run_dir"], "checkpoint_000002.pt")
    assert (torch.load(midpoint, weights_only=True)["context"]["episode"] >= 0).any()
    resumed = ppo.train(ppo.Args(resume=midpoint, progress_bar=False))
    assert [h["iteration"] for h in resumed["history"]] == [3, 4]
    assert metrics_without_timing(resumed["history"]) == metrics_without_timing(straight["history"][2:])


def test_evaluation_freezes_the_normaliser_and_windows_reset_at_episode_starts(tmp_path, monkeypatch):
    summary = ppo.train(small_args(tmp_path, context_len=4))
    seen = []
    original = ppo.TransformerAgent.mean_action

    def recording(self, windows, valid):
        seen.append(valid.clone())
        return original(self, windows, valid)

    monkeypatch.setattr(ppo.TransformerAgent, "mean_action", recording)
    monkeypatch.setattr(ppo.RunningMeanStd, "update", lambda *a: pytest.fail("normaliser updated in evaluation"))
    result = ppo.evaluate(summary["checkpoint"], episodes=17, device="cpu")  # 16 envs, 2 episodes each
    assert result["episodes"] == 32 and np.isfinite(result["mean_return"])
    assert seen[0].sum(1).eq(1).all() and seen[7].sum(1).eq(1).all()  # 7-step episodes: fresh window at 0 and 7
    assert seen[5].all()


# ---------------------------------------------------------------- CLI and errors
def run_cli(*flags, cwd):
    return subprocess.run([sys.executable, os.path.join(REPO, "ppo_transformer.py"), *flags], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_help_lists_the_transformer_flags(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    for flag in ("--context-len", "--num-tokens", "--token-dim", "--gated", "--pre-ln", "--small-init",
                 "--pos-encoding", "--critic"):
        assert flag in result.stdout


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--token-dim", "10", "--num-heads", "4"], "--num-heads 4"),
        (["--context-len", "0"], "--context-len"),
        (["--num-minibatches", "7"], "--num-minibatches 7"),
    ],
)
def test_bad_flags_give_a_clear_error_naming_the_flag(tmp_path, flags, message):
    result = run_cli("--env-id", "PendulumNoVel-v1", *flags, "--no-progress-bar", cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr


# ---------------------------------------------------------------- the Genesis path
def test_franka_reach_token_mode_trains_and_evaluates(tmp_path):
    """Bug: the Genesis path (success, reward terms, final_obs windows) breaks the transformer script."""
    args = small_args(tmp_path, env_id="FrankaReach-v0", num_envs=16, num_steps=8, num_minibatches=2,
                      total_timesteps=16 * 8 * 3, sim_device="cpu", policy_device="cpu", context_len=2, num_tokens=2,
                      env_kwargs={"max_episode_steps": 10})
    summary = ppo.train(args)
    last = summary["history"][-1]
    assert "charts/success_rate" in last and last["reward_terms/distance"] < 0
    assert all(h["debug/first_minibatch_ratio_max_dev"] < 1e-5 for h in summary["history"])
    result = ppo.evaluate(summary["checkpoint"], episodes=4, device="cpu", sim_device="cpu")
    assert result["episodes"] == 4 and 0.0 <= result["success_rate"] <= 1.0
