"""docs/design.md §6 on all three scripts at once: every invariant the scripts share, each test named after its bug.

Script-specific invariants (recurrent state, attention windows) are in the scripts' own test files. The loop
tests run a real training loop on a scripted env (tests/conftest.py) and check, for every step, what the loop
hands to compute_gae and to the loss against a reference computed independently from what the env gave and
from a copy of the agent taken when the rollout ended."""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
import re
import shutil

import gymnasium.envs.mujoco
import numpy as np
import pytest
import torch
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

import envs
from conftest import (
    REPO, VARIANTS, ScriptedEnv, run_cli, episode_schedule, metrics_without_timing, naive_gae, script_named,
    use_scripted_env,
)


# ---------------------------------------------------------------- 1, 2: GAE and bootstrapping (pure functions)
@pytest.mark.parametrize("seed", range(4))
def test_gae_matches_a_naive_per_episode_reference(script, seed):
    """Bug: advantages leaking across episode ends, or a wrong bootstrap at the rollout's last step."""
    g = torch.Generator().manual_seed(seed)
    T, N = 17, 6
    rewards, values, final_values = (torch.randn(T, N, generator=g, dtype=torch.float64) for _ in range(3))
    last_value = torch.randn(N, generator=g, dtype=torch.float64)
    terminated = torch.rand(T, N, generator=g) < 0.15
    truncated = (torch.rand(T, N, generator=g) < 0.15) & ~terminated
    terminated[-1, 0], truncated[-1, 1] = True, True  # episode ends on the last rollout step
    advantages, returns = script.module.compute_gae(rewards, values, last_value, final_values, terminated, truncated,
                                                    0.97, 0.9)
    expected = naive_gae(rewards, values, last_value, final_values, terminated, truncated, 0.97, 0.9)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)


def test_truncation_bootstraps_from_final_obs_value_and_termination_does_not_bootstrap(script):
    """Bug: bootstrapping a time-out from V(reset obs) or V(s_t), or a true terminal state from anything."""
    values = torch.tensor([[1.0, 1.0]])
    last_value = torch.tensor([100.0, 100.0])  # V of the reset observation that follows
    final_values = torch.tensor([[5.0, 5.0]])  # V(final_obs) of the ended episodes
    terminated, truncated = torch.tensor([[False, True]]), torch.tensor([[True, False]])
    advantages, _ = script.module.compute_gae(torch.zeros(1, 2), values, last_value, final_values, terminated,
                                              truncated, 0.9, 1.0)
    assert advantages[0, 0].item() == pytest.approx(0.9 * 5.0 - 1.0)  # not 0.9*100-1, not 0.9*1-1
    assert advantages[0, 1].item() == pytest.approx(-1.0)


# ---------------------------------------------------------------- 1-6 inside the training loop
class LoopRecord:
    """Everything that crossed the loop's seams in one training run: each Agent.act call (inputs, outputs),
    each compute_gae call (inputs, a copy of the agent that acted), each ppo_loss call (inputs), and the
    observation statistics after each normaliser update."""

    def __init__(self):
        self.acts, self.gae, self.losses, self.obs_stats = [], [], [], []
        self.agent = None


def clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, tuple):
        return tuple(clone(v) for v in x)
    return x


def agent_class(module):
    return next(getattr(module, name) for name in ("RecurrentAgent", "TransformerAgent", "Agent")
                if hasattr(module, name))


def run_recorded(script, monkeypatch, tmp_path, **overrides):
    monkeypatch.chdir(tmp_path)
    module, record = script.module, LoopRecord()
    cls = agent_class(module)
    acting = getattr(cls, script.act_method)
    original_gae, original_loss = module.compute_gae, module.ppo_loss
    original_update = module.ObsNormalizer.update

    def original_act(agent, *inputs):  # outputs as (action, log-prob, value, ...memory) for every script
        return script.act_outputs(acting(agent, *inputs))

    def act(self, *inputs):
        outputs = acting(self, *inputs)
        if script.samples(inputs):  # an acting step, not the update scoring given actions
            record.agent = self
            record.acts.append((clone(inputs), clone(script.act_outputs(outputs))))
        return outputs

    def compute_gae(*inputs):
        with torch.inference_mode(False):  # a copy of the weights that acted, before the update changes them
            snapshot = copy.deepcopy(record.agent)
        record.gae.append((clone(inputs), snapshot))
        return original_gae(*inputs)

    def ppo_loss(*inputs):
        record.losses.append((len(record.gae) - 1, clone(inputs[1:-1])))
        return original_loss(*inputs)

    def update(self, x):
        original_update(self, x)
        record.obs_stats.append((self.mean.clone(), self.var.clone()))

    monkeypatch.setattr(cls, script.act_method, act)
    monkeypatch.setattr(module, "compute_gae", compute_gae)
    monkeypatch.setattr(module, "ppo_loss", ppo_loss)
    monkeypatch.setattr(module.ObsNormalizer, "update", update)
    args = script.args(**overrides)
    T = args.num_steps
    made = use_scripted_env(monkeypatch, module, episode_schedule(4096, args.num_envs, T))
    module.train(args)
    return record, made[0], args, original_act


LOOP_OVERRIDES = {
    "ppo_continuous": dict(num_envs=3, num_steps=16, num_minibatches=4, total_timesteps=3 * 16 * 3),
    "ppo_recurrent": dict(num_envs=3, num_steps=16, bptt_len=8, num_minibatches=2, total_timesteps=3 * 16 * 3),
    "ppo_transformer": dict(num_envs=3, num_steps=16, num_minibatches=4, context_len=4, num_tokens=2,
                            total_timesteps=3 * 16 * 3),
    "ppo_transformer-memory": dict(num_envs=3, num_steps=16, bptt_len=8, num_minibatches=2, context_len=2,
                                   num_tokens=2, memory_tokens=2, critic="shared", total_timesteps=3 * 16 * 3),
}


@pytest.fixture(scope="module", params=[(s, norm) for s in VARIANTS for norm in (False, True)],
                ids=lambda p: f"{p[0]}-{'normalised' if p[1] else 'raw'}")
def loop(request, tmp_path_factory):
    """One recorded run per script (and the transformer's memory mode), with observation normalisation and reward
    scaling both off or both on."""
    name, norm = request.param
    script = script_named(name)
    with pytest.MonkeyPatch.context() as monkeypatch:
        record, env, args, original_act = run_recorded(
            script, monkeypatch, tmp_path_factory.mktemp(name), update_epochs=1, gamma=0.9, gae_lambda=0.8,
            norm_obs=norm, norm_reward=norm, init_log_std=1.0, **LOOP_OVERRIDES[name])
    return script, record, env, args, original_act


def rollout_of(loop, iteration):
    """The iteration's T steps: act inputs and outputs, the env's outputs, and its compute_gae call."""
    script, record, env, args, _ = loop
    T = args.num_steps
    steps = range(iteration * T, (iteration + 1) * T)
    env_log = {name: torch.stack([getattr(env, name)[k] for k in steps])
               for name in ("received", "rewards", "terminated", "truncated", "final_obs")}
    return [record.acts[k] for k in steps], env_log, record.gae[iteration]


def normalise(loop, x, k):
    """x normalised as the loop must: with the statistics after the update of global step k (the obs it returned)."""
    script, record, _, args, _ = loop
    if not args.norm_obs:
        return x
    normaliser = script.module.ObsNormalizer((x.shape[-1],))
    mean, var = record.obs_stats[1 + k]  # [0]: the reset observations
    normaliser.load_state_dict({"mean": mean, "var": var, "count": torch.tensor(1.0, dtype=torch.float64)})
    return normaliser(x)


def bootstrap_inputs(script, act_inputs, act_outputs, n, final_obs):
    """Inputs for acting on env n's final observation with the memory of its own episode: the recurrent state
    after its last step, or the window of its last step moved on by one (and the memory tokens after that step)."""
    if script.name == "ppo_recurrent":
        return final_obs[None], act_outputs[3][n : n + 1], torch.zeros(1, dtype=torch.bool)
    if script.name.startswith("ppo_transformer"):
        windows, valid = act_inputs[:2]  # then no action and no critic observation: a rollout step
        window = torch.cat([windows[n, 1:], final_obs[None]])
        inputs = (window[None], torch.cat([valid[n, 1:], torch.ones(1, dtype=torch.bool)])[None])
        if len(act_outputs) > 3:  # memory mode: the memory the episode's last step wrote, not reset
            inputs += (None, None, act_outputs[3][n : n + 1], torch.zeros(1, dtype=torch.bool))
        return inputs
    return (final_obs[None],)


def reference_gae_inputs(loop, iteration):
    """rewards, values, last_value, final_values, terminated, truncated as they must be, from what the env gave,
    what the agent output, and the copy of the agent that acted (last_value is None for the run's last rollout)."""
    script, record, env, args, original_act = loop
    acts, env_log, (_, snapshot) = rollout_of(loop, iteration)
    T, N = args.num_steps, args.num_envs
    rewards = env_log["rewards"]
    if args.norm_reward:
        scaler = script.module.RewardScaler(N, args.gamma)
        for i in range(iteration + 1):  # the running returns carry over from earlier rollouts
            log = rollout_of(loop, i)[1]
            rewards = scaler(log["rewards"], log["terminated"] | log["truncated"])
    values = torch.stack([outputs[2] for _, outputs in acts])
    final_values = torch.full((T, N), float("nan"))
    with torch.inference_mode():
        for t, n in env_log["truncated"].nonzero().tolist():
            final_obs = normalise(loop, env_log["final_obs"][t, n], iteration * T + t)
            inputs = bootstrap_inputs(script, *acts[t], n, final_obs)
            final_values[t, n] = original_act(snapshot, *inputs)[2][0]
        last_value = None
        if (iteration + 1) * T < len(record.acts):  # V of what the next rollout's first step acts on, with its memory
            last_value = original_act(snapshot, *record.acts[(iteration + 1) * T][0])[2]
    return rewards, values, last_value, final_values, env_log["terminated"], env_log["truncated"]


def match_rows(rows, reference):
    """For each row, (distance to, index of) the nearest reference row (exact distances: no matmul trick)."""
    return torch.cdist(rows, reference, compute_mode="donot_use_mm_for_euclid_dist").min(1)


def iterations(loop):
    return range(len(loop[1].gae))


def test_loop_hands_gae_the_envs_flags_and_rewards_exactly(loop):
    """Bugs: terminated and truncated swapped or merged, flags or rewards one step off, rewards scaled with the
    wrong done mask, the wrong gamma or lambda."""
    script, record, env, args, _ = loop
    for iteration in iterations(loop):
        (rewards, values, _, _, terminated, truncated, gamma, lam), _ = record.gae[iteration]
        expected = reference_gae_inputs(loop, iteration)
        assert torch.equal(terminated, expected[4]) and torch.equal(truncated, expected[5])
        assert terminated[-1].any() and truncated[-1].any()  # episodes end on the rollout's last step too
        torch.testing.assert_close(rewards, expected[0])
        torch.testing.assert_close(values, expected[1])
        assert (gamma, lam) == (args.gamma, args.gae_lambda)


def test_truncated_steps_bootstrap_from_the_normalised_final_obs_with_their_own_episodes_memory(loop):
    """Bugs: V(reset obs) or V(s_t) instead of V(final_obs); the final obs not normalised (or with other
    statistics); the recurrent state before the last step instead of after it; a window that holds the next
    episode's first observation instead of this episode's last steps."""
    script, record, env, args, _ = loop
    checked = 0
    for iteration in iterations(loop):
        (_, _, _, final_values, _, truncated, _, _), _ = record.gae[iteration]
        expected = reference_gae_inputs(loop, iteration)[3]
        torch.testing.assert_close(final_values[truncated], expected[truncated], atol=1e-5, rtol=1e-5)
        checked += int(truncated.sum())
    assert checked >= 3 * len(iterations(loop))


def test_bootstrap_after_the_last_step_uses_the_next_steps_obs_and_memory(loop):
    """Bugs: V(next_obs) from the un-normalised observation, from the state before the last step or an advanced
    one, from a window without the carried steps (or with the next obs pushed twice)."""
    script, record, env, args, _ = loop
    for iteration in list(iterations(loop))[:-1]:
        (_, _, last_value, *_), _ = record.gae[iteration]
        torch.testing.assert_close(last_value, reference_gae_inputs(loop, iteration)[2], atol=1e-5, rtol=1e-5)


def test_each_step_reads_the_memory_the_previous_step_left_across_rollouts(loop):
    """Bugs: a bootstrap value advancing the carried memory (V(next_obs) run as a step), the memory not carried
    into the next rollout (or the one from before the last step), or not reset where an episode starts."""
    script, record, env, args, _ = loop
    if script.name not in ("ppo_recurrent", "ppo_transformer-memory"):
        pytest.skip("no memory carried from step to step: windows are tested in test_ppo_transformer.py")
    carried_at, starts_at = (1, 2) if script.name == "ppo_recurrent" else (4, 5)
    assert len(record.acts) == len(iterations(loop)) * args.num_steps
    for k in range(len(record.acts) - 1):
        written = record.acts[k][1][3]  # the memory after step k
        done = env.terminated[k] | env.truncated[k]
        inputs = record.acts[k + 1][0]
        assert torch.equal(inputs[starts_at], done)
        if script.name == "ppo_recurrent":  # zeroed where an episode starts; the transformer resets when reading
            written = written * ~done[:, None]
        torch.testing.assert_close(inputs[carried_at], written, atol=0, rtol=0)


def test_value_targets_in_the_update_equal_naive_gae_over_what_the_env_gave(loop):
    """Bugs: a terminated step bootstrapped, returns shifted by a step or mixed across envs on the way to the
    loss, advantages used as targets, or targets taken from another rollout."""
    script, record, env, args, _ = loop
    T, N = args.num_steps, args.num_envs
    for iteration in iterations(loop):
        rewards, values, last_value, final_values, terminated, truncated = reference_gae_inputs(loop, iteration)
        if last_value is None:
            last_value = record.gae[iteration][0][2]
        final_values = torch.where(truncated, final_values, torch.zeros(()))
        expected = naive_gae(rewards.double(), values.double(), last_value.double(), final_values.double(),
                             terminated, truncated, args.gamma, args.gae_lambda) + values.double()
        acted = torch.stack([script.acted_obs(inputs) for inputs, _ in rollout_of(loop, iteration)[0]]).flatten(0, 1)
        rows = [script.loss_rows(inputs) for i, inputs in record.losses if i == iteration]
        obs, returns = torch.cat([r["obs"] for r in rows]), torch.cat([r["returns"] for r in rows])
        distance, match = match_rows(obs, acted)
        assert distance.max() < 1e-5 and sorted(match.tolist()) == list(range(T * N))  # each step exactly once
        torch.testing.assert_close(returns.double(), expected.flatten()[match], atol=1e-4, rtol=1e-4)


def test_env_gets_the_clipped_action_and_the_update_scores_the_unclipped_sample(loop):
    """Bugs (4, 3): storing the clipped action (biased log-probs), scoring another action than was sampled, or
    obs/action/log-prob rows that do not belong together."""
    script, record, env, args, _ = loop
    for iteration in iterations(loop):
        acts, env_log, _ = rollout_of(loop, iteration)
        sampled = torch.stack([outputs[0] for _, outputs in acts])
        assert (sampled.abs() > 0.5).any()  # std e^1: samples beyond the bounds
        torch.testing.assert_close(env_log["received"], sampled.clamp(-0.5, 0.5))
        acted = torch.stack([script.acted_obs(inputs) for inputs, _ in acts]).flatten(0, 1)
        logprobs = torch.stack([outputs[1] for _, outputs in acts]).flatten()
        for i, inputs in record.losses:
            if i == iteration:
                rows = script.loss_rows(inputs)
                distance, match = match_rows(rows["obs"], acted)
                assert distance.max() < 1e-5
                torch.testing.assert_close(rows["actions"], sampled.flatten(0, 1)[match])
                torch.testing.assert_close(rows["logprobs"], logprobs[match])


# ---------------------------------------------------------------- 4, 8: the policy's distribution
def test_tanh_log_prob_includes_the_change_of_variables(script):
    """Bug: a tanh-squashed policy scored without the log-det term (or with an unstable one that overflows)."""
    agent = script.make_agent(obs_dim=3, act_dim=2, low=-2.0, high=1.0, transform="tanh", init_log_std=-0.3)
    obs = torch.randn(64, 3)
    with torch.no_grad():
        mean = script.mean(agent, obs)
        dist = Normal(mean, agent.actor_logstd.exp().expand_as(mean))
        u = dist.sample() * 2
        low, high = agent.action_low, agent.action_high
        squash = [TanhTransform(), AffineTransform((high + low) / 2, (high - low) / 2)]
        reference = TransformedDistribution(dist, squash)
        logprob, _, _ = script.evaluate(agent, obs, u)
        torch.testing.assert_close(logprob, reference.log_prob(agent.env_action(u)).sum(-1), atol=1e-4, rtol=1e-4)
        actions, act_logprob, _ = script.act(agent, obs)
        torch.testing.assert_close(act_logprob, script.evaluate(agent, obs, actions)[0])
        saturated, _, _ = script.evaluate(agent, obs, torch.full((64, 2), 40.0))
    assert torch.isfinite(saturated).all()


def test_clip_mode_scores_the_unclipped_gaussian_sample(script):
    """Bug: scoring clip(u) (a point mass at the bounds) instead of the Gaussian sample u."""
    agent = script.make_agent(obs_dim=3, act_dim=1, transform="clip")
    obs = torch.zeros(1, 3)
    with torch.no_grad():
        mean = script.mean(agent, obs)
        u = torch.tensor([[3.0]])
        expected = Normal(mean, agent.actor_logstd.exp()).log_prob(u).sum(-1)
        torch.testing.assert_close(script.evaluate(agent, obs, u)[0], expected)
    assert agent.env_action(u).item() == 1.0


@pytest.mark.parametrize("log_std", [-8.0, 5.0])
def test_sampling_log_prob_and_entropy_use_exp_log_std_unclamped(script, log_std):
    """Bug: a clamp (or softplus) on log-std in acting or in the loss, which silently stops exploration from
    shrinking or growing; or a slip in the closed-form Gaussian (a missing 1/2, log-std used as std)."""
    agent = script.make_agent(obs_dim=3, act_dim=2, low=-1e6, high=1e6, transform="clip")
    agent.actor_logstd.data = torch.tensor([[log_std, log_std + 0.5]])
    obs = torch.randn(4, 3).repeat_interleave(2000, 0)
    torch.manual_seed(0)
    with torch.no_grad():
        mean = script.mean(agent, obs)
        reference = Normal(mean, torch.exp(agent.actor_logstd).expand_as(mean))
        actions, logprobs, values = script.act(agent, obs)
        new_logprobs, entropy, _ = script.evaluate(agent, obs, actions)
        _, stats = script.loss(agent, obs, actions, logprobs, torch.randn(len(obs)), values, values,
                               script.module.Args(ent_coef=0.0, vf_coef=0.5))
    noise = (actions - mean) / reference.stddev
    assert noise.mean(0).abs().max() < 0.05 and (noise.std(0) - 1).abs().max() < 0.05
    torch.testing.assert_close(logprobs, reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(new_logprobs, reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))
    assert stats["entropy"].item() == pytest.approx(reference.entropy().sum(-1).mean().item(), rel=1e-5)


def test_entropy_bonus_rewards_entropy(script):
    """Bug: `+ ent_coef * H` in the loss, which drives the policy to collapse."""
    agent = script.make_agent(obs_dim=4, act_dim=2)
    obs = torch.randn(32, 4)
    with torch.no_grad():
        actions, logprobs, values = script.act(agent, obs)
    args = script.module.Args(ent_coef=1.0, vf_coef=0.0, norm_adv=False)
    loss, _ = script.loss(agent, obs, actions, logprobs, torch.zeros(32), values, values, args)
    loss.backward()
    assert (agent.actor_logstd.grad < 0).all()  # gradient descent raises log-std


# ---------------------------------------------------------------- 6: the loss
def test_advantages_are_normalised_and_returns_are_not(script):
    """Bug: normalising value targets (the critic learns the wrong scale) or not normalising advantages."""
    agent = script.make_agent(obs_dim=4, act_dim=2)
    g = torch.Generator().manual_seed(0)
    obs, advantages = torch.randn(32, 4, generator=g), torch.randn(32, generator=g)
    with torch.no_grad():
        actions, logprobs, values = script.act(agent, obs)
    args = script.module.Args(clip_vloss=False, ent_coef=0.0, vf_coef=0.5, norm_adv_per_minibatch=True)
    returns = torch.full_like(values, 100.0)
    old_logprobs = logprobs + 0.1 * advantages
    _, stats = script.loss(agent, obs, actions, old_logprobs, advantages, returns, values, args)
    _, scaled = script.loss(agent, obs, actions, old_logprobs, 10 * advantages + 3, returns, values, args)
    assert stats["policy_loss"].item() == pytest.approx(scaled["policy_loss"].item(), rel=1e-5)
    assert stats["value_loss"].item() == pytest.approx(0.5 * (values - 100.0).square().mean().item(), rel=1e-6)


# ---------------------------------------------------------------- 7, 9: schedule and clipping
def test_learning_rate_anneals_once_per_iteration(script, in_tmp):
    """Bug: annealing per minibatch or epoch, which reaches zero long before the end."""
    args = script.args(learning_rate=1e-3, lr_schedule="linear")
    args.total_timesteps = 4 * args.num_envs * args.num_steps
    logged = [h["charts/learning_rate"] for h in script.module.train(args)["history"]]
    assert logged == pytest.approx([1e-3 * (1 - i / 4) for i in range(4)])


@pytest.mark.parametrize("schedule,anneal,expected", [
    ("cosine", True, [1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / 4))) for i in range(4)]),
    ("constant", True, [1e-3] * 4),
    ("linear", False, [1e-3] * 4),  # CleanRL's --no-anneal-lr
    ("adaptive_kl", False, [1e-3] * 4),
])
def test_lr_schedule_flag_sets_the_rate_of_every_iteration(script, in_tmp, schedule, anneal, expected):
    """Bugs: --lr-schedule cosine ignored (linear or constant instead), a cosine that ends at 0 instead of
    --lr-min-fraction, or --no-anneal-lr not stopping a schedule."""
    args = script.args(learning_rate=1e-3, lr_schedule=schedule, anneal_lr=anneal, lr_min_fraction=0.1)
    args.total_timesteps = 4 * args.num_envs * args.num_steps
    logged = [h["charts/learning_rate"] for h in script.module.train(args)["history"]]
    assert logged == pytest.approx(expected)


@pytest.mark.parametrize("desired_kl,bound", [(1e-12, 1e-5), (1e3, 1e-2)])
def test_adaptive_kl_moves_the_rate_every_minibatch_within_its_bounds(script, in_tmp, desired_kl, bound):
    """Bugs: the adaptive rate stepped once per iteration instead of per minibatch, moving only one way, or
    escaping rsl_rl's bounds [1e-5, 1e-2]."""
    args = script.args(learning_rate=1e-3, lr_schedule="adaptive_kl", desired_kl=desired_kl, num_minibatches=4,
                       update_epochs=2)
    args.total_timesteps = 4 * args.num_envs * args.num_steps
    logged = [h["charts/learning_rate"] for h in script.module.train(args)["history"]]
    # 8 minibatch steps per iteration: the first iteration alone moves the rate by more than one factor of 1.5
    if bound < 1e-3:
        assert logged[0] < 1e-3 / 1.5**2
        assert min(logged) == pytest.approx(bound) and all(lr >= bound * (1 - 1e-9) for lr in logged)
    else:
        assert logged[0] > 1e-3 * 1.5**2
        assert max(logged) == pytest.approx(bound) and all(lr <= bound * (1 + 1e-9) for lr in logged)


@pytest.mark.parametrize("per_minibatch,epochs_done", [(False, 1.0), (True, 0.5)])
def test_target_kl_stops_at_the_epochs_end_or_after_the_first_minibatch_over_it(script, in_tmp, per_minibatch,
                                                                                 epochs_done):
    """Bugs: --target-kl-per-minibatch ignored (the rest of an epoch stepped past a KL over the target, as in the
    pick run that collapsed on a GPU), the epoch-end check stopping mid-epoch, or a stopped epoch logged as whole.
    The first minibatch's KL is 0 (the policy that acted): the second is the first over any target."""
    args = script.args(target_kl=1e-12, target_kl_per_minibatch=per_minibatch, num_minibatches=4, update_epochs=3)
    args.total_timesteps = 2 * args.num_envs * args.num_steps
    history = script.module.train(args)["history"]
    assert [h["charts/update_epochs_done"] for h in history] == [epochs_done] * 2


def test_critic_learning_rate_moves_the_critic_alone_at_its_own_rate(script, in_tmp):
    """Bug: --critic-learning-rate ignored (one rate for all parameters), or applied to the actor too."""
    def changes(**flags):
        args = script.args(lr_schedule="constant", **flags)
        args.total_timesteps = args.num_envs * args.num_steps  # one iteration
        summary = script.module.train(args)
        trained = torch.load(summary["checkpoint"], weights_only=True)["model"]
        torch.manual_seed(args.seed)  # the initial weights, drawn as train() draws them
        agent = script.module.build_agent(script.module.resolve_args(args), script.module.make_env(
            args, args.num_envs, args.seed, torch.device("cpu")), torch.device("cpu"))[0]
        diff = {k: (trained[k] - p).abs().max().item() for k, p in agent.named_parameters()}
        critic = max(v for k, v in diff.items() if agent.is_critic(k))
        actor = max(v for k, v in diff.items() if not agent.is_critic(k))
        return critic, actor

    critic, actor = changes()
    frozen_critic, same_actor = changes(critic_learning_rate=1e-12)
    assert critic > 1e-4 and frozen_critic < 1e-9
    assert same_actor == pytest.approx(actor, rel=0.5)


def test_weight_decay_applies_to_weight_matrices_only_decoupled_in_adamw_and_as_l2_in_adam(script):
    """Bugs: --weight-decay ignored, applied by AdamW as an L2 term (or by Adam decoupled), or decaying biases and
    the log-std."""
    agent = script.make_agent(init_log_std=0.5)
    with torch.no_grad():
        for name, p in agent.named_parameters():
            if "bias" in name:
                p.fill_(0.3)  # zero biases would hide a decay applied to them
    matrices = [name for name, p in agent.named_parameters() if "weight" in name.rsplit(".", 1)[-1] and p.dim() >= 2]
    assert matrices and "actor_logstd" not in matrices
    for optimizer_name, decay in (("adamw", 0.5), ("adam", 0.5), ("adam", 0.0)):
        args = script.module.Args(optimizer=optimizer_name, weight_decay=decay, learning_rate=0.1)
        before = {k: v.detach().clone() for k, v in agent.named_parameters()}
        optimizer = script.module.make_optimizer(agent, args)
        for p in agent.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        for name, p in agent.named_parameters():
            if name not in matrices or decay == 0:
                expected = before[name]
            elif optimizer_name == "adamw":  # decoupled: shrunk by lr * decay, whatever Adam's step
                expected = before[name] * (1 - 0.1 * decay)
            else:  # L2: the gradient decay * p, normalised by Adam's first step to about its sign
                g = decay * before[name]
                expected = before[name] - 0.1 * g / (g.abs() + 1e-5)
            torch.testing.assert_close(p.detach(), expected)
    assert script.module.Args(optimizer="adamw").optimizer == "adamw"


@pytest.mark.parametrize("clip_vloss", [False, True])
def test_huber_value_loss_is_linear_beyond_delta(script, clip_vloss):
    """Bug: --value-loss huber ignored (squared error), or dropped when the value loss is clipped."""
    agent = script.make_agent()
    obs, actions = torch.randn(32, 3), torch.randn(32, 2)
    with torch.no_grad():
        _, logprobs, values = script.act(agent, obs)
    returns = values + 100.0  # far beyond delta: Huber = delta * (|error| - delta / 2)
    for value_loss, expected in (("mse", 0.5 * 100.0**2), ("huber", 2.0 * (100.0 - 1.0))):
        args = script.module.Args(value_loss=value_loss, huber_delta=2.0, clip_vloss=clip_vloss, ent_coef=0.0)
        _, stats = script.loss(agent, obs, actions, logprobs, torch.randn(32), returns, values, args)
        assert stats["value_loss"].item() == pytest.approx(expected, rel=1e-4)


def test_robust_advantage_normalisation_only_centres_flat_advantages(script):
    """Bug: --robust-adv-norm ignored, so advantages that are flat up to noise are blown up to unit scale."""
    agent = script.make_agent()
    obs = torch.randn(64, 3)
    with torch.no_grad():
        actions, logprobs, values = script.act(agent, obs)
    logprobs = logprobs + 0.05 * torch.randn(64)  # ratios != 1: the loss weighs the advantages unevenly
    flat = 5.0 + 1e-5 * torch.randn(64)  # a spread below the 1e-4 threshold, above float32's resolution at 5
    losses = {}
    for robust in (False, True):
        args = script.module.Args(robust_adv_norm=robust, norm_adv=True, norm_adv_per_minibatch=True, ent_coef=0.0)
        _, stats = script.loss(agent, obs, actions, logprobs, flat, values, values, args)
        losses[robust] = abs(stats["policy_loss"].item())
    assert losses[True] < 1e-5 and losses[False] > 1e-3
    varied = torch.randn(64)  # a real spread: both normalise alike
    same = [script.loss(agent, obs, actions, logprobs, varied, values, values, script.module.Args(
        robust_adv_norm=robust, norm_adv_per_minibatch=True, ent_coef=0.0))[1]["policy_loss"].item()
        for robust in (False, True)]
    assert same[0] == pytest.approx(same[1], rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("per_network", [False, True])
def test_gradient_clipping_covers_every_parameter(script, in_tmp, monkeypatch, per_network):
    """Bugs: clipping only some parameters (the actor, the heads but not a recurrent or attention trunk, or not
    log-std), so the rest's gradients blow up the step; or --clip-grad-per-network ignored (the joint norm clipped,
    so a large value error shrinks the policy's step) or clipping one of the two networks only."""
    seen, agents = [], []
    original_step, original_make_optimizer = torch.optim.Adam.step, script.module.make_optimizer

    def recording_step(self, *a, **kw):  # the squared gradient norm of the actor's and of the critic's parameters
        critic = {id(p) for name, p in agents[0].named_parameters() if agents[0].is_critic(name)}
        squares = [0.0, 0.0]
        for p in (p for group in self.param_groups for p in group["params"] if p.grad is not None):
            squares[id(p) in critic] += p.grad.norm().item() ** 2
        seen.append([math.sqrt(x) for x in squares])
        return original_step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    monkeypatch.setattr(script.module, "make_optimizer", lambda agent, args: (
        agents.append(agent), original_make_optimizer(agent, args))[1])
    history = script.module.train(script.args(max_grad_norm=0.01, norm_reward=False,
                                              clip_grad_per_network=per_network))["history"]
    assert history[0]["losses/grad_norm_total"] > 0.1  # clipping was needed
    bound = 0.01 * (1 + 1e-4)
    if per_network:
        assert all(actor <= bound and critic <= bound for actor, critic in seen)
        assert max(math.hypot(actor, critic) for actor, critic in seen) > 0.0135  # each clipped to 0.01 on its own
    else:
        assert all(math.hypot(actor, critic) <= bound for actor, critic in seen)


def test_batch_advantage_normalisation_uses_the_whole_rollout_once(script, in_tmp, monkeypatch):
    """Bugs: --no-norm-adv-per-minibatch ignored (each minibatch normalised with its own statistics, or not at all),
    or advantages normalised over the batch and then again per minibatch."""
    seen = []
    original_loss = script.module.ppo_loss

    def recording_loss(*a, **kw):
        seen.append(inspect.signature(original_loss).bind(*a, **kw).arguments["advantages"].detach().flatten())
        return original_loss(*a, **kw)

    monkeypatch.setattr(script.module, "ppo_loss", recording_loss)
    args = script.args(norm_adv_per_minibatch=False, update_epochs=1)
    args.total_timesteps = args.num_envs * args.num_steps  # one iteration, one epoch: each step in one minibatch
    script.module.train(args)
    everything = torch.cat(seen)
    assert len(seen) > 1 and everything.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert everything.std().item() == pytest.approx(1.0, rel=1e-4)
    assert max(abs(minibatch.mean().item()) for minibatch in seen) > 1e-3  # not each minibatch's own statistics
    agent = script.make_agent()  # and the loss takes them as they come
    obs = torch.randn(32, 3)
    with torch.no_grad():
        actions, logprobs, values = script.act(agent, obs)
    logprobs = logprobs + 0.1 * torch.randn(32)
    losses = [script.loss(agent, obs, actions, logprobs, advantages, values, values, args)[1]["policy_loss"].item()
              for advantages in (everything[:32], 10 * everything[:32] + 3)]
    assert losses[1] != pytest.approx(losses[0], rel=1e-3)


def test_update_threads_apply_to_the_update_alone(script, in_tmp, monkeypatch):
    """Bugs: --update-threads ignored, or left in force for the rollout (where the simulator needs the cores)."""
    seen = {"rollout": set(), "update": set()}
    original_step, original_loss = envs.GymnasiumVecEnv.step, script.module.ppo_loss

    def recording_step(self, action):
        seen["rollout"].add(torch.get_num_threads())
        return original_step(self, action)

    def recording_loss(*args, **kwargs):
        seen["update"].add(torch.get_num_threads())
        return original_loss(*args, **kwargs)

    monkeypatch.setattr(envs.GymnasiumVecEnv, "step", recording_step)
    monkeypatch.setattr(script.module, "ppo_loss", recording_loss)
    threads = torch.get_num_threads()
    try:
        script.module.train(script.args(torch_threads=1, update_threads=3))
    finally:
        torch.set_num_threads(threads)
    assert seen == {"rollout": {1}, "update": {3}}


# ---------------------------------------------------------------- 10, 13: normalisers, checkpoints, evaluation
@pytest.fixture(scope="module", params=VARIANTS)
def trained(request, tmp_path_factory):
    """A finished tiny run per script (and the transformer's memory mode): (script, args, summary)."""
    script = script_named(request.param)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(tmp_path_factory.mktemp(request.param))
        args = script.args()
        summary = script.module.train(args)
        for key in ("run_dir", "checkpoint"):
            summary[key] = os.path.abspath(summary[key])
    return script, args, summary


def test_normaliser_updates_only_from_rollout_data_and_is_saved(trained):
    """Bugs: statistics updated from final_obs, the bootstrap or the update's minibatches; or not saved."""
    script, args, summary = trained
    checkpoint = torch.load(summary["checkpoint"], weights_only=True)
    # The reset observation plus one per env and step: nothing else counted.
    expected_count = 1e-4 + args.num_envs * (1 + summary["global_step"] // args.num_envs)
    assert checkpoint["obs_normalizer"]["count"].item() == pytest.approx(expected_count)
    assert checkpoint["obs_normalizer"]["var"].min() > 0 and checkpoint["obs_normalizer"]["mean"].abs().sum() > 0
    assert checkpoint["reward_scaler"]["return_rms.count"].item() == pytest.approx(1e-4 + summary["global_step"])


def test_norm_obs_until_freezes_the_statistics_once_they_hold_that_many(script, in_tmp):
    """Bugs: --norm-obs-until ignored (the inputs keep drifting), or freezing the statistics from the start."""
    def statistics(until):
        summary = script.module.train(script.args(norm_obs_until=until, seed=3))
        return torch.load(summary["checkpoint"], weights_only=True)["obs_normalizer"]

    moving, frozen = statistics(0), statistics(30)
    num_envs = script.args().num_envs
    # updated step by step (num_envs observations each, the reset ones first) until the count reaches 30
    assert frozen["count"].item() == pytest.approx(1e-4 + num_envs * math.ceil(30 / num_envs))
    assert moving["count"].item() > 2 * frozen["count"].item()
    assert frozen["mean"].abs().sum() > 0 and not torch.allclose(frozen["mean"], moving["mean"])


def test_evaluation_freezes_the_normaliser_and_never_samples(trained, monkeypatch):
    """Bugs: evaluation updating the observation statistics, or acting with sampled instead of mean actions
    (seeded or not)."""
    script, _, summary = trained

    def no_sampling(*args, **kwargs):
        raise AssertionError("evaluation sampled an action")

    results = []
    for seed in (1, 2):  # a different global RNG state: a sampling evaluation would play differently
        torch.manual_seed(seed)
        with monkeypatch.context() as patch:  # what acting samples with (building the agent may draw: allowed)
            for name in ("randn_like", "normal"):
                patch.setattr(torch, name, no_sampling)
            patch.setattr(torch.distributions.Normal, "sample", no_sampling)
            patch.setattr(torch.distributions.Normal, "rsample", no_sampling)
            patch.setattr(script.module.RunningMeanStd, "update", lambda *a: pytest.fail("normaliser updated"))
            results.append(script.module.evaluate(summary["checkpoint"], episodes=3, device="cpu"))
    assert results[0] == results[1] and np.isfinite(results[0]["mean_return"])


def test_checkpoint_restores_every_piece_of_training_state(trained):
    """Bug: a checkpoint with a key present but empty, stale or None (model, optimiser moments, normalisers,
    step counters, RNG, the policy's memory), which key-presence checks would pass."""
    script, args, summary = trained
    checkpoint = torch.load(summary["checkpoint"], weights_only=True)
    assert checkpoint["global_step"] == summary["global_step"] == args.total_timesteps
    assert checkpoint["iteration"] == summary["iteration"] == args.total_timesteps // (args.num_envs * args.num_steps)
    assert checkpoint["args"]["env_id"] == args.env_id and checkpoint["args"]["seed"] == args.seed
    module = script.module
    saved_args = module.resolve_args(module.args_from_checkpoint(checkpoint))
    agent = module.build_agent(saved_args, module.make_env(saved_args, 1, 0, torch.device("cpu")), "cpu")[0]
    agent.load_state_dict(checkpoint["model"])  # strict: every tensor of the trained network, nothing else
    assert all(torch.isfinite(p).all() for p in agent.parameters())
    optimizer = checkpoint["optimizer"]
    assert len(optimizer["state"]) == len(list(agent.parameters()))  # Adam's moments for every parameter
    assert all(s["exp_avg_sq"].abs().sum() > 0 for s in optimizer["state"].values())
    assert checkpoint["torch_rng"].dtype == torch.uint8 and checkpoint["torch_rng"].numel() > 0
    assert checkpoint["obs_normalizer"]["count"].item() > 1
    assert checkpoint["reward_scaler"]["returns"].shape == (args.num_envs,)
    assert checkpoint["env"] is not None and checkpoint["next_obs_raw"].shape[0] == args.num_envs
    memory = [t for key in script.memory_keys
              for t in (checkpoint[key].values() if isinstance(checkpoint[key], dict) else [checkpoint[key]])]
    assert all(t.shape[0] == args.num_envs for t in memory)
    if memory:  # the carried hidden state or context window, not zeros
        assert any(t.abs().sum() > 0 for t in memory if t.is_floating_point())
    assert not any(name.endswith(".tmp") for name in os.listdir(summary["run_dir"]))


# ---------------------------------------------------------------- 5, 13: what the update sees, seeds, resume
def test_first_minibatch_has_ratio_one_and_zero_kl_with_normalisers_on(variant, in_tmp):
    """Bug: the update sees different observations (re-normalised with newer statistics), memory or actions
    than the rollout acted on."""
    summary = variant.module.train(variant.args(norm_obs=True, norm_reward=True, init_log_std=0.5))
    for h in summary["history"]:
        assert h["debug/first_minibatch_ratio_max_dev"] < 1e-4
        assert h["losses/approx_kl"] > 0  # later minibatches did move the policy


def test_same_seed_gives_identical_metrics_and_another_seed_does_not(variant, in_tmp):
    """Bug: unseeded sampling, permutation, initial state or env somewhere in the loop."""
    first = variant.module.train(variant.args(seed=3))["history"]
    second = variant.module.train(variant.args(seed=3))["history"]
    other = variant.module.train(variant.args(seed=4))["history"]
    assert metrics_without_timing(first) == metrics_without_timing(second)
    assert metrics_without_timing(first) != metrics_without_timing(other)


def test_resume_continues_exactly_like_an_uninterrupted_run(variant, in_tmp):
    """Bug: resuming resets the step counter, optimiser, normalisers, RNG, envs or the policy's memory."""
    args = variant.args(checkpoint_interval=2)
    args.total_timesteps = 4 * args.num_envs * args.num_steps
    straight = variant.module.train(args)
    midpoint = os.path.join(straight["run_dir"], "checkpoint_000002.pt")
    resumed = variant.module.train(variant.module.Args(resume=midpoint, progress_bar=False))
    assert resumed["run_dir"] == straight["run_dir"] and resumed["global_step"] == straight["global_step"]
    assert [h["iteration"] for h in resumed["history"]] == [3, 4]
    assert metrics_without_timing(resumed["history"]) == metrics_without_timing(straight["history"][2:])


def test_a_warm_start_takes_the_network_and_normalisers_and_nothing_else(variant, in_tmp, capsys):
    """Bugs: --init-from loads nothing; loads the network but not the observation normaliser, or the normaliser
    restarted rather than counting on; carries the old run's optimizer over; continues the old run (its directory,
    its step counter) rather than starting its own; does not say which flags differ from the source run's."""
    source = variant.module.train(variant.args(seed=2, norm_obs=True))
    # A learning rate of 1e-12 leaves the weights where the run started (Adam's steps are about the rate's size).
    frozen = dict(seed=3, norm_obs=True, learning_rate=1e-12, lr_schedule="constant")
    capsys.readouterr()
    warm = variant.module.train(variant.args(init_from=source["run_dir"], **frozen))
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[init-from]")]
    assert len(said) == 1 and said[0].endswith("flags unlike its run's: --seed, --learning-rate, --lr-schedule"), said
    cold = variant.module.train(variant.args(**frozen))
    source_state, warm_state, cold_state = (torch.load(run["checkpoint"], weights_only=True)
                                            for run in (source, warm, cold))
    assert warm["run_dir"] not in (source["run_dir"], cold["run_dir"])
    assert warm["global_step"] == cold["global_step"] and warm["history"][0]["iteration"] == 1
    for name, weight in source_state["model"].items():
        torch.testing.assert_close(warm_state["model"][name], weight, rtol=0, atol=1e-8, msg=name)
    assert any(not torch.allclose(cold_state["model"][name], weight) for name, weight in source_state["model"].items())
    counts = [state["obs_normalizer"]["count"].item() for state in (source_state, warm_state, cold_state)]
    assert counts[1] == pytest.approx(counts[0] + counts[2] - 1e-4)  # each count starts at 1e-4
    warm_steps, cold_steps = ([p["step"].item() for p in state["optimizer"]["state"].values()]
                              for state in (warm_state, cold_state))
    assert warm_steps == cold_steps


def test_a_warm_start_onto_a_task_with_other_action_bounds_acts_within_this_tasks(script, in_tmp):
    """Bug: --init-from loads the source run's action bounds with its network (they are buffers of the model): a run
    on a task whose actions are limited otherwise (--env-kwargs: the Go2's clip_actions, another xml_file) clips or
    squashes its actions to the old limits, and its checkpoints and exported policy carry them."""
    assets = os.path.join(os.path.dirname(gymnasium.envs.mujoco.__file__), "assets")
    with open(os.path.join(assets, "inverted_pendulum.xml")) as f:  # its motor's ctrlrange is -3 3
        (in_tmp / "narrow.xml").write_text(f.read().replace('ctrlrange="-3 3"', 'ctrlrange="-1 1"'))
    source = script.module.train(script.args(env_id="InvertedPendulum-v5", seed=2))
    warm = script.module.train(script.args(env_id="InvertedPendulum-v5", init_from=source["run_dir"],
                                           env_kwargs={"xml_file": str(in_tmp / "narrow.xml")}))
    source_model, warm_model = (torch.load(run["checkpoint"], weights_only=True)["model"] for run in (source, warm))
    assert (source_model["action_low"].tolist(), source_model["action_high"].tolist()) == ([-3.0], [3.0])
    assert (warm_model["action_low"].tolist(), warm_model["action_high"].tolist()) == ([-1.0], [1.0])


def test_a_warm_started_run_resumes_without_its_source(script, in_tmp):
    """Bug: a resumed warm-started run (its args.json keeps --init-from) reads the source checkpoint again: gone
    (moved, cleaned up), the resume fails; there, it is loaded for nothing (the run's own checkpoint replaces it)."""
    source = script.module.train(script.args(seed=2))
    args = script.args(init_from=source["run_dir"], checkpoint_interval=2)
    args.total_timesteps = 4 * args.num_envs * args.num_steps
    straight = script.module.train(args)
    shutil.rmtree(source["run_dir"])
    resumed = script.module.train(script.module.Args(resume=os.path.join(straight["run_dir"], "checkpoint_000002.pt"),
                                                     progress_bar=False))
    assert metrics_without_timing(resumed["history"]) == metrics_without_timing(straight["history"][2:])


def test_a_warm_start_records_the_steps_behind_its_network_its_sources_included(script, in_tmp):
    """Bug: a curriculum's stages (--init-from) each count from step 0 and nothing says how many steps trained the
    network a stage started from, so "5M steps in all" is summed by hand from run names; or the sum leaves out the
    source's own warm start, is taken again from the source on a resume (gone, or trained on since), or comes from
    the source's latest checkpoint where an earlier one was given."""
    def recorded(run):
        with open(os.path.join(run["run_dir"], "args.json")) as f:
            return json.load(f)["init_from_steps"], torch.load(run["checkpoint"])["args"]["init_from_steps"]

    source = script.module.train(script.args(seed=2, checkpoint_interval=1))
    assert recorded(source) == (0, 0)
    first = os.path.join(source["run_dir"], "checkpoint_000001.pt")  # the source's first iteration, not its last
    first_steps = torch.load(first)["global_step"]
    assert 0 < first_steps < source["global_step"]
    args = script.args(init_from=first, checkpoint_interval=2)
    args.total_timesteps = 4 * args.num_envs * args.num_steps
    middle = script.module.train(args)
    assert recorded(middle) == (first_steps, first_steps)
    last = script.module.train(script.args(init_from=middle["run_dir"]))
    assert recorded(last) == (first_steps + middle["global_step"],) * 2
    shutil.rmtree(source["run_dir"])
    resumed = script.module.train(script.module.Args(resume=os.path.join(middle["run_dir"], "checkpoint_000002.pt"),
                                                     progress_bar=False))
    assert recorded(resumed) == (first_steps, first_steps)


def test_a_warm_start_from_a_run_warm_started_before_the_steps_were_kept_says_it_counts_that_run_alone(
        script, in_tmp, capsys):
    """Bug: a stage started from a run that was itself warm-started before runs kept init_from_steps (its args hold
    init_from but no init_from_steps) silently counts that run's steps alone, the stages before it lost, and
    --steps-in-all then reads a curriculum as shorter than it was."""
    source = script.module.train(script.args(seed=2))
    old = torch.load(source["checkpoint"], weights_only=True)
    old["args"]["init_from"] = "runs/an_earlier_stage"
    del old["args"]["init_from_steps"]
    old_path = os.path.join(source["run_dir"], "before_the_record.pt")
    torch.save(old, old_path)
    capsys.readouterr()
    warm = script.module.train(script.args(init_from=old_path))
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[init-from]")]
    assert len(said) == 2 and "itself warm-started (from runs/an_earlier_stage)" in said[1], said
    assert f"counts its {old['global_step']:,} steps alone" in said[1]
    assert torch.load(warm["checkpoint"], weights_only=True)["args"]["init_from_steps"] == old["global_step"]
    script.module.train(script.args(init_from=warm["run_dir"]))  # a source that keeps the record: no such line
    assert [line for line in capsys.readouterr().out.splitlines() if "itself warm-started" in line] == []


class GraphReplays:
    """A stand-in for torch.compile(fn, mode="reduce-overhead") on a GPU, as far as the caller can see: CUDA graphs
    write their outputs (those outside autograd) into one shared memory pool, so an output kept past a later call
    of any compiled function reads what that call wrote (torch raises when it notices; not always). Here every call
    first overwrites all earlier outputs with NaN (or -1), the strictest reading of that."""

    def __init__(self):
        self.returned: list[torch.Tensor] = []

    def compile(self, fn, **_):
        def replayed(*args, **kwargs):
            with torch.inference_mode():  # the acting's outputs are inference tensors
                for tensor in self.returned:
                    tensor.fill_(math.nan if tensor.is_floating_point() else -1)
            self.returned.clear()
            leaves, spec = torch.utils._pytree.tree_flatten(fn(*args, **kwargs))
            for leaf in leaves:
                if isinstance(leaf, torch.Tensor) and not leaf.requires_grad:
                    self.returned.append(leaf)
            return torch.utils._pytree.tree_unflatten(leaves, spec)

        return replayed


def test_no_compiled_output_is_read_after_the_next_call(variant, in_tmp, monkeypatch):
    """Bug: an output of the compiled acting or loss kept past the function's next call: with CUDA graphs
    (torch.compile's reduce-overhead mode) the next replay overwrites it. The fourth GPU session's CUDA-graph trial
    stopped on the first minibatch's ratio deviation, kept for the log while the other minibatches ran."""
    eager = variant.module.train(variant.args(seed=5))["history"]
    monkeypatch.setattr(torch, "compile", GraphReplays().compile)
    replayed = variant.module.train(variant.args(seed=5, compile=True, compile_mode="reduce-overhead"))["history"]
    assert metrics_without_timing(replayed) == metrics_without_timing(eager)


def test_compile_mode_reaches_torch_compile(script, in_tmp, monkeypatch):
    """Bug: --compile-mode ignored: the policy and the loss compiled in torch.compile's default mode, without the
    CUDA graphs asked for."""
    modes = []
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **_: modes.append(mode) or fn)
    args = script.args(compile=True, compile_mode="max-autotune")
    args.total_timesteps = args.num_envs * args.num_steps  # one iteration
    script.module.train(args)
    assert modes == ["max-autotune", "max-autotune"]


# ---------------------------------------------------------------- the running statistics (a copy per script)
def test_running_statistics_merged_batch_by_batch_equal_those_of_all_data_at_once(script):
    """Bugs: a wrong merge formula (a missing between-batch term, count-weighted the wrong way), a count that
    stops tracking the data, or a host copy of the count that a loaded state dict does not refresh."""
    module = script.module
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(n, 3, generator=generator) * 3 + 5 for n in (1, 7, 1, 30, 2)]
    stats = module.RunningMeanStd((3,), epsilon=1e-4)
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
    restored = module.ObsNormalizer((3,))
    # Nested, as in a checkpoint of a larger module: the hook must run for submodules too.
    torch.nn.ModuleDict({"norm": restored}).load_state_dict(torch.nn.ModuleDict({"norm": stats}).state_dict())
    assert restored.host_count == pytest.approx(count)
    restored.update(batches[0]), stats.update(batches[0])
    torch.testing.assert_close(restored.var, stats.var)


def test_reward_scaling_of_a_whole_rollout_equals_scaling_step_by_step(script):
    """Bugs: the discounted return restarting one step early or late around an episode's end, the return not
    carried into the next rollout, or statistics merged in the wrong order (each step must be scaled by the
    statistics that include it and nothing later)."""
    module = script.module
    gamma, num_envs, num_steps = 0.9, 3, 12
    generator = torch.Generator().manual_seed(1)

    def step_by_step(stats, running, rewards, dones):
        scaled = []
        for reward, done in zip(rewards, dones):
            running = gamma * running + reward.double()
            stats.update(running)
            running = running.masked_fill(done, 0.0)
            scaled.append(reward / torch.sqrt(stats.var + 1e-8))
        return torch.stack(scaled).float(), running

    scaler = module.RewardScaler(num_envs, gamma)
    reference_stats, reference_running = module.RunningMeanStd(), torch.zeros(num_envs, dtype=torch.float64)
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


# ---------------------------------------------------------------- the Genesis path
def test_genesis_arm_trains_logs_success_and_reward_terms_and_evaluates(variant, in_tmp):
    """Bug: the Genesis path (sim device, success, reward terms, staggered starts, final_obs memory) breaks a
    script while every Gymnasium test passes."""
    args = variant.args(num_envs=16, num_steps=8, num_minibatches=2, update_epochs=2, total_timesteps=16 * 8 * 3,
                       sim_device="cpu", policy_device="cpu", env_kwargs={"max_episode_steps": 10}, **variant.genesis)
    summary = variant.module.train(args)
    last = summary["history"][-1]
    assert "charts/success_rate" in last and last["reward_terms/distance"] < 0
    assert all(h["debug/first_minibatch_ratio_max_dev"] < 1e-4 for h in summary["history"])
    result = variant.module.evaluate(summary["checkpoint"], episodes=4, device="cpu", sim_device="cpu")
    assert result["episodes"] == 4 and 0.0 <= result["success_rate"] <= 1.0


def test_a_task_metric_is_averaged_over_the_episodes_it_applies_to(variant, monkeypatch, in_tmp):
    """Bugs: a NaN task metric (one that does not apply to an episode, as another terrain type's level) poisoning
    the logged mean or counted as 0, a metric no ended episode had logged as NaN, and a reward term logged as
    anything but its mean over the iteration's steps and envs (they are reduced once per rollout)."""
    ends = episode_schedule(4096, 9, 16)  # training steps 3 envs, evaluation 9
    made = use_scripted_env(monkeypatch, variant.module, ends, metrics=True)
    args = variant.args(**LOOP_OVERRIDES[variant.name])
    summary = variant.module.train(args)
    history = summary["history"]
    assert len(history) == 3
    training = made[0]
    rewards = torch.stack(training.rewards).double()
    acted_on = torch.stack([training.first_obs, *training.obs_log])[:-1, :, 1].double()  # from_obs, step by step
    for iteration, h in enumerate(history):
        steps = slice(iteration * 16, (iteration + 1) * 16)
        assert h["reward_terms/from_obs"] == pytest.approx(float(acted_on[steps].mean()), rel=1e-5, abs=1e-6)
        assert h["reward_terms/from_obs"] + h["reward_terms/from_action"] == pytest.approx(
            float(rewards[steps].mean()), rel=1e-5, abs=1e-6)
        episodes = (ends[iteration * 16:(iteration + 1) * 16, :3] > 0).sum(0).double()  # ended per env
        env = torch.arange(3, dtype=torch.float64)
        assert h["episode_metrics/env_index"] == pytest.approx(float((env * episodes).sum() / episodes.sum()))
        even = episodes * (env % 2 == 0)
        assert h["episode_metrics/on_even_envs"] == pytest.approx(float((env * even).sum() / even.sum()))
        assert "episode_metrics/on_no_env" not in h
    result = variant.module.evaluate(summary["checkpoint"], episodes=9, device="cpu")
    assert result["env_index"] == pytest.approx(4.0)  # one episode of each of envs 0-8
    assert result["on_even_envs"] == pytest.approx(4.0) and "on_no_env" not in result  # of envs 0, 2, 4, 6, 8


class FlatThenMovingEnv(ScriptedEnv):
    """The scripted env with observation entry 1 at 0 up to global step 16, then at 1: a feature that never moved
    while the normaliser's statistics were gathered (a cube resting on the table), and then moves. The critic's
    observation (entry 0 as the scripted env's) has its entry 1 move later, from global step 33."""

    def _obs(self):
        obs = super()._obs()
        obs[:, 1] = float(self.k > 16)
        return obs

    @staticmethod
    def critic_of(obs):
        step = obs[..., 0].floor() % 100  # the global step (a final observation adds 0.5 to entry 0)
        return torch.stack([3 - 0.01 * obs[..., 0], (step > 32).float()], -1)


@pytest.mark.parametrize("norm_obs, norm_obs_eps", [(True, 0.0), (True, 0.5), (False, 0.0)],
                         ids=["normalised", "std_floored", "raw"])
def test_a_saturated_observation_feature_is_logged_as_clipped(script, norm_obs, norm_obs_eps, monkeypatch, in_tmp):
    """Bug: a feature that barely varied while the normaliser's statistics were gathered sits at the +-10 clip once
    it moves, and the networks cannot tell how far: nothing in the logs said so. `debug/obs_clipped_share` is the
    largest share of one feature's rollout entries at the clip: here the statistics stop after the first rollout
    (3 envs x 17 observations, entry 1 always 0), entry 1 is 1 from the second rollout's second step on. The
    privileged critic's own observations, normalised apart, have theirs (`debug/critic_obs_clipped_share`): its entry
    1 moves a rollout later. Raw observations (--no-norm-obs) are never clipped, however large (entry 0 reaches 247).
    Bug: --norm-obs-eps not added to the std of either normaliser: with 0.5 the move of 1 normalises to about 2."""
    use_scripted_env(monkeypatch, script.module, episode_schedule(4096, 9, 16), critic=True,
                     env_class=FlatThenMovingEnv)
    args = script.args(**LOOP_OVERRIDES[script.name], norm_obs=norm_obs, norm_obs_until=3 * 17, privileged_critic=True,
                       norm_obs_eps=norm_obs_eps)
    history = script.module.train(args)["history"]
    saturates = norm_obs and not norm_obs_eps
    policy, critic = ([0.0, 15 / 16, 1.0], [0.0, 0.0, 15 / 16]) if saturates else ([0.0] * 3, [0.0] * 3)
    assert [h["debug/obs_clipped_share"] for h in history] == pytest.approx(policy)
    assert [h["debug/critic_obs_clipped_share"] for h in history] == pytest.approx(critic)


def test_quadruped_trains_and_logs_and_evaluates_the_task_metrics(script, in_tmp):
    """Bugs: a task's own episode metrics (tracking errors, falls) lost between info and the logs, averaged over
    steps instead of over the episodes that ended, or missing from the evaluation's report (eval/*, run while
    training by the loop --eval-checkpoint runs: tests/test_evaluation.py)."""
    args = script.args(env_id="Go2WalkNoVel-v0", num_envs=8, num_steps=8, num_minibatches=2, update_epochs=1,
                       total_timesteps=8 * 8 * 2, hidden_sizes=(16,), env_kwargs={"max_episode_steps": 5},
                       eval_interval=20, eval_episodes=3)
    summary = script.module.train(args)
    for h in summary["history"]:
        # The robots drop to the ground for the 5 steps, so the error is about the commanded speed (0 to 1 m/s,
        # about 0.5 over 8 episodes); averaged over every env's steps instead, it would be about 8 times smaller.
        assert 0.2 < h["episode_metrics/lin_vel_error"] < 1.0 and h["episode_metrics/fell"] == 0.0
    result = summary["history"][-1]  # evaluated at the last iteration
    assert result["eval/episode_length"] == 5.0 and result["eval/fell"] == 0.0
    assert 0.05 < result["eval/lin_vel_error"] < 1.0 and 0.0 < result["eval/ang_vel_error"] < 1.0


# ---------------------------------------------------------------- the command line
def help_defaults(script, *flags) -> dict[str, str]:
    """--help's shown default of every flag, for the given flags (e.g. the task)."""
    text = run_cli(script.name, *flags, "--help", cwd=REPO).stdout
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())
    return dict(re.findall(r"(--[a-z0-9-]+)(?:, --no-[a-z0-9-]+)? .*?\(default: (.*?)\)", text))


@pytest.mark.parametrize("env_id", [None, "Pendulum-v1", "Hopper-v5"])
def test_help_shows_the_settings_that_will_run_for_the_chosen_task(script, env_id):
    """Bugs: --help printing None for hyperparameters filled in later, or another task's defaults than the
    chosen one (the script's default task, a task with a preset, any other Gymnasium task)."""
    shown = help_defaults(script, *(["--env-id", env_id] if env_id else []))
    expected = script.module.task_args(env_id or script.module.Args.env_id)
    for name in ("learning_rate", "lr_schedule", "num_envs", "num_steps", "total_timesteps", "gamma", "ent_coef",
                 "target_kl", "init_log_std", "num_minibatches", "update_epochs", "vf_coef", "max_grad_norm"):
        assert shown[f"--{name.replace('_', '-')}"] == str(getattr(expected, name)), name
    runtime = ("--wandb-entity", "--wandb-group", "--resume", "--init-from", "--eval-checkpoint", "--export-checkpoint",
               "--env-kwargs")
    assert [flag for flag, default in shown.items() if default == "None" and flag not in runtime] == []
    assert len(shown) > 40  # every flag was found
