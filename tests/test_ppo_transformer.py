"""ppo_transformer.py alone: docs/design.md §6 items 5 and 12 for attention over steps and tokens (windows rebuilt
exactly, no attention across an episode boundary, causal), each test named after the bug it catches. The
invariants shared with the other scripts are tested on all three in test_invariants.py."""

import math

import numpy as np
import pytest
import torch

import ppo_transformer as ppo
from conftest import run_cli, script_named, spaces

SCRIPT = script_named("ppo_transformer")
MODES = {"history": dict(context_len=4, num_tokens=1), "tokens": dict(context_len=1, num_tokens=3),
         "both": dict(context_len=3, num_tokens=2)}


def make_agent(obs_dim=3, seed=0, **overrides):
    torch.manual_seed(seed)
    small = dict(token_dim=8, num_heads=2, num_layers=2, critic="shared", small_init=False)
    args = ppo.resolve_args(ppo.task_args("PendulumNoVel-v1", **{**small, **overrides}))
    return ppo.TransformerAgent(args, *spaces(obs_dim, 2, -1.0, 1.0))


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
    _, logprob, entropy, value = agent.get_action_and_value(windows, valid, torch.randn(T * N, 2))
    (logprob.sum() + value.sum()).backward()
    assert torch.isfinite(logprob).all() and torch.isfinite(value).all()
    assert all(torch.isfinite(p.grad).all() for p in agent.parameters() if p.grad is not None)
    diagnostics = {"attention_entropy": [], "residual_ratio": []}
    with torch.no_grad():
        agent.features(windows, valid, diagnostics=diagnostics)
    assert all(torch.isfinite(e).all() for e in diagnostics["attention_entropy"])


def test_small_init_starts_the_branches_quiet():
    """Bug: --small-init not reaching the branch outputs, so early training is dominated by random attention."""
    obs, done = random_rollout()
    windows, valid, _, _ = simulate_context(obs, done, 4)
    ratios = {}
    for small in (True, False):
        diagnostics = {"attention_entropy": [], "residual_ratio": []}
        with torch.no_grad():
            make_agent(context_len=4, small_init=small).features(windows.flatten(0, 1), valid.flatten(0, 1),
                                                                 diagnostics=diagnostics)
        ratios[small] = max(r.item() for r in diagnostics["residual_ratio"])
    assert ratios[True] < 0.05 < ratios[False]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gated,pre_ln", [(False, True), (True, False)])
def test_diagnostic_attention_equals_the_fused_attention_it_stands_for(mode, gated, pre_ln):
    """Bug: the written-out attention that logs entropies drifting from the fused kernel that trains (another
    scale, mask or softmax axis), so the diagnostics describe a different network."""
    agent = make_agent(gated=gated, pre_ln=pre_ln, **MODES[mode])
    obs, done = random_rollout(T=30)
    windows, valid, _, _ = simulate_context(obs, done, agent.context_len)
    windows, valid = windows.flatten(0, 1), valid.flatten(0, 1)
    with torch.no_grad():
        diagnostics = {"attention_entropy": [], "residual_ratio": []}
        written_out = agent.features(windows, valid, diagnostics=diagnostics)
        torch.testing.assert_close(written_out, agent.features(windows, valid), atol=1e-5, rtol=1e-5)


def test_attention_entropy_is_that_of_the_attention_over_the_valid_tokens(monkeypatch):
    """Bug: an entropy summed over the wrong axis, counting masked keys, or averaged over the wrong queries."""
    agent = make_agent(context_len=4, num_tokens=2, num_layers=2)
    D = agent.token_dim
    with torch.no_grad():
        for block in agent.blocks:  # zero queries: every query attends uniformly to the keys it may see
            block.qkv.weight[:D] = 0.0
            block.qkv.bias[:D] = 0.0
    obs, done = random_rollout(T=30)
    windows, valid, _, _ = simulate_context(obs, done, agent.context_len)
    windows, valid = windows.flatten(0, 1), valid.flatten(0, 1)
    diagnostics = {"attention_entropy": [], "residual_ratio": []}
    with torch.no_grad():
        agent.features(windows, valid, diagnostics=diagnostics)
    expected = torch.log(valid.sum(1).float() * agent.num_tokens).mean()  # log(number of valid tokens)
    assert (valid.sum(1) < agent.context_len).any()
    for entropy in diagnostics["attention_entropy"]:  # one per layer: (heads,)
        torch.testing.assert_close(entropy, expected.expand_as(entropy))


# ---------------------------------------------------------------- 5: what the update sees
@pytest.mark.parametrize("mode", MODES)
def test_first_minibatch_has_ratio_one_and_zero_kl(in_tmp, mode):
    """Bug: the update scoring actions on other windows than the rollout acted on (lost carried context,
    a missed episode start, observations re-normalised with newer statistics)."""
    summary = ppo.train(SCRIPT.args(init_log_std=0.5, **MODES[mode]))
    for h in summary["history"]:
        assert h["debug/first_minibatch_ratio_max_dev"] < 1e-5
        assert h["losses/approx_kl"] > 0


def test_attention_diagnostics_are_logged_per_layer_and_head(in_tmp):
    """Bug: diagnostics missing for some layer or head, or entropies out of their range."""
    args = SCRIPT.args(context_len=4, num_tokens=2, num_layers=2, num_heads=2)
    last = ppo.train(args)["history"][-1]
    for layer in range(2):
        for head in range(2):
            entropy = last[f"attention/entropy_layer{layer}_head{head}"]
            assert 0.0 <= entropy <= math.log(4 * 2) + 1e-5  # at most uniform over the window's tokens
        assert last[f"residual/update_ratio_layer{layer}_attention"] > 0
        assert last[f"residual/update_ratio_layer{layer}_ff"] > 0
        assert last[f"gradients/grad_max_layer/{layer}"] > 0


# ---------------------------------------------------------------- evaluation
def test_evaluation_windows_reset_at_episode_starts(in_tmp, monkeypatch):
    """Bug: evaluation windows that reach into the previous episode (or forget the current one)."""
    summary = ppo.train(SCRIPT.args(context_len=4))
    seen = []
    original = ppo.TransformerAgent.mean_action

    def recording(self, windows, valid, memory=None):
        seen.append(valid.clone())
        return original(self, windows, valid, memory)

    monkeypatch.setattr(ppo.TransformerAgent, "mean_action", recording)
    result = ppo.evaluate(summary["checkpoint"], episodes=17, device="cpu")  # 16 envs, the first plays 2
    assert result["episodes"] == 17 and np.isfinite(result["mean_return"])
    assert seen[0].sum(1).eq(1).all() and seen[7].sum(1).eq(1).all()  # 7-step episodes: fresh window at 0 and 7
    assert seen[5].all()


# ---------------------------------------------------------------- memory mode: memory tokens carried step to step
def memory_agent(context_len=1, seed=0, **overrides):
    return make_agent(context_len=context_len, num_tokens=2, memory_tokens=3, bptt_len=32, seed=seed, **overrides)


def episode_starts(done):
    """starts[t]: step t begins an episode (the first step, and every step after an episode's end)."""
    return torch.cat([torch.ones_like(done[:1]), done[:-1]])


def run_memory(agent, obs, done, memory=None):
    """The rollout's acting path over (T, N) steps, one step at a time as collect_rollout steps: windows from the
    Context, the memory reset when read at an episode's first step. Returns (T, N, M * D) features and the memory
    entering each step as carried (T, N, P, D)."""
    T, N, D = obs.shape
    context = ppo.Context(N, agent.context_len, D, torch.device("cpu"), (agent.memory_tokens, agent.token_dim))
    if memory is not None:
        context.memory = memory
    features, carried = [], []
    for t in range(T):
        context.push(obs[t])
        carried.append(context.memory)
        out, memory = agent.read(context.obs, context.valid(), agent.reset_memory(context.memory,
                                                                                  context.memory_starts()))
        context.write_memory(memory)
        context.end_episodes(done[t])
        features.append(out)
    return torch.stack(features), torch.stack(carried)


def test_memory_never_carries_across_an_episode_start():
    """Bugs: an episode's first step reading the previous episode's memory (the reset skipped, or applied a step
    late), in acting or in the update's sequences."""
    agent = memory_agent(context_len=2)
    obs, done = random_rollout(T=30)  # env 0's first episode ends at step 4 (done[4, 0])
    first_end = int(done[:, 0].nonzero()[0])
    other = obs.clone()
    other[: first_end + 1, 0] += 3.0  # another first episode for env 0, the same afterwards
    with torch.no_grad():
        acted, _ = run_memory(agent, obs, done)
        acted_other, _ = run_memory(agent, other, done, memory=100.0 * torch.randn(3, 3, 8))
        windows, valid, _, _ = simulate_context(obs, done, agent.context_len)
        updated, _ = agent.sequence_features(windows, valid, 100.0 * torch.randn(3, 3, 8), episode_starts(done))
    torch.testing.assert_close(acted_other[first_end + 1:, 0], acted[first_end + 1:, 0])
    assert not torch.allclose(acted_other[: first_end + 1, 0], acted[: first_end + 1, 0])
    torch.testing.assert_close(updated, acted, atol=1e-5, rtol=1e-5)  # the update's path: what acting saw


def test_the_memory_outlives_the_window_within_an_episode():
    """Bugs: the memory tokens' outputs never written back (each step reads the initial memory), or the memory
    dropped from attention: then an observation outside the window could not change a later step."""
    obs, done = random_rollout(T=12)
    done[:] = False
    changed = obs.clone()
    changed[0] += 3.0  # the first step only, long out of a one-step window by step 11
    for memory_tokens, expect_change in ((3, True), (0, False)):
        agent = make_agent(context_len=1, num_tokens=2, memory_tokens=memory_tokens, bptt_len=32 * bool(memory_tokens))
        with torch.no_grad():
            windows, valid, _, _ = simulate_context(obs, done, 1)
            changed_windows = simulate_context(changed, done, 1)[0]
            memory = torch.zeros(3, memory_tokens, 8) if memory_tokens else None
            starts = episode_starts(done) if memory_tokens else None
            last = [agent.sequence_features(w, valid, memory, starts)[0][-1] for w in (windows, changed_windows)]
        assert (not torch.allclose(*last, atol=1e-6)) == expect_change


def test_a_network_that_writes_nothing_keeps_its_memory_step_after_step():
    """Bug: the memory tokens' position (added every step to tag them for attention) written back with the memory:
    it piles up over an episode and crowds out what the memory holds, even where the blocks write nothing."""
    agent = memory_agent(context_len=2)
    with torch.no_grad():
        for block in agent.blocks:  # every branch silent: each block passes its input through
            for layer in (block.out, block.ff[-1]):
                layer.weight.zero_()
                layer.bias.zero_()
        obs, done = random_rollout(T=50)
        done[:] = False
        windows, valid, _, _ = simulate_context(obs, done, agent.context_len)
        memory = torch.randn(3, 3, 8)
        _, last = agent.sequence_features(windows, valid, memory, torch.zeros(50, 3, dtype=torch.bool))
    torch.testing.assert_close(last, agent.memory_norm(memory), atol=1e-4, rtol=1e-4)


def test_a_closed_memory_gate_holds_the_initial_memory_through_an_episode():
    """Bugs in --memory-gate: the gate mixing the new write with something other than the memory the step read (the
    write itself, the memory with its position tag), or layer-normed after mixing, so a gate that keeps everything
    still changes the memory; or the plain write used in its place."""
    agent = memory_agent(context_len=2, memory_gate=True)
    obs, done = random_rollout(T=30)
    done[:] = False
    windows, valid, _, _ = simulate_context(obs, done, agent.context_len)
    starts = torch.zeros(30, 3, dtype=torch.bool)
    starts[0] = True  # the episode starts from memory_init, not the memory passed in
    with torch.no_grad():
        agent.memory_gate.bias.fill_(1e4)  # z = 0: every step keeps the whole memory
        _, kept = agent.sequence_features(windows, valid, torch.randn(3, 3, 8), starts)
        agent.memory_gate.bias.fill_(-1e4)  # z = 1: every step replaces it with the gate's candidate
        _, replaced = agent.sequence_features(windows, valid, torch.randn(3, 3, 8), starts)
    torch.testing.assert_close(kept, agent.memory_init.expand(3, -1, -1))
    assert (replaced - agent.memory_init).abs().min() > 1e-3 and replaced.abs().max() < 1  # tanh's range


def test_recomputed_memories_equal_the_acted_ones_under_the_same_weights():
    """Bugs: --recompute-memory rerunning from the wrong memory or the wrong chunk (shifted by one), or returning
    the sequences' memories in another order than the update's sequences (c * N + n)."""
    agent = memory_agent(context_len=2)
    obs, done = random_rollout(T=24)
    with torch.no_grad():
        _, carried = run_memory(agent, obs, done, memory=torch.randn(3, 3, 8))
        windows, valid, _, _ = simulate_context(obs, done, agent.context_len)
        recomputed = agent.sequence_start_memories(windows, valid, carried[0], episode_starts(done), 6)
    torch.testing.assert_close(recomputed, carried[::6].flatten(0, 1), atol=1e-5, rtol=1e-5)


def test_memory_flags_change_the_run_and_are_refused_without_memory(in_tmp):
    """Bugs: --recompute-memory or --bptt-len accepted but ignored; either, or --memory-gate, silently accepted
    without memory."""
    base = dict(memory_tokens=2, context_len=1, num_minibatches=3, critic="shared")
    losses = {name: [{k: v for k, v in h.items() if k.startswith("losses/")}
                     for h in ppo.train(SCRIPT.args(**base, **flags))["history"]]
              for name, flags in (("whole", dict(bptt_len=16)), ("short", dict(bptt_len=4)),
                                  ("recomputed", dict(bptt_len=4, recompute_memory=True)))}
    assert losses["short"] != losses["whole"] and losses["recomputed"] != losses["short"]
    for flags in (dict(bptt_len=8), dict(recompute_memory=True), dict(memory_gate=True), dict(memory_tokens=-1)):
        with pytest.raises(ppo.UsageError, match="--(bptt-len|recompute-memory|memory-gate|memory-tokens)"):
            ppo.resolve_args(SCRIPT.args(**flags))
    with pytest.raises(ppo.UsageError, match="--bptt-len 5 does not divide --num-steps 16"):
        ppo.resolve_args(SCRIPT.args(**base, bptt_len=5))


def test_memory_diagnostics_are_logged_per_layer_and_head(in_tmp):
    """Bug: the share of attention on the memory missing for a layer or head, or out of [0, 1]."""
    last = ppo.train(SCRIPT.args(memory_tokens=2, bptt_len=4, context_len=2, num_layers=2, num_heads=2))["history"][-1]
    for layer in range(2):
        for head in range(2):
            assert 0.0 < last[f"attention/memory_share_layer{layer}_head{head}"] < 1.0
    assert last["policy/memory_norm"] > 0


def test_evaluation_starts_every_episode_from_the_initial_memory(in_tmp, monkeypatch):
    """Bug: the deployed policy carrying the previous episode's memory (or zeros) into an episode's first step."""
    summary = ppo.train(SCRIPT.args(memory_tokens=2, bptt_len=4, context_len=1, critic="shared"))
    seen, initial = [], []
    original = ppo.TransformerAgent.mean_action

    def recording(self, windows, valid, memory=None):
        seen.append(memory.clone())
        initial.append(self.memory_init.detach().clone())
        return original(self, windows, valid, memory)

    monkeypatch.setattr(ppo.TransformerAgent, "mean_action", recording)
    result = ppo.evaluate(summary["checkpoint"], episodes=17, device="cpu")  # 16 envs, the first plays 2
    assert result["episodes"] == 17
    for step in (0, 7):  # 7-step episodes
        torch.testing.assert_close(seen[step], initial[0].expand_as(seen[step]))
    for step in (1, 5, 8):
        assert not torch.allclose(seen[step], initial[0].expand_as(seen[step]))


# ---------------------------------------------------------------- the command line
def test_help_lists_the_transformer_flags(tmp_path):
    result = run_cli("ppo_transformer", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for flag in ("--context-len", "--num-tokens", "--token-dim", "--gated", "--pre-ln", "--small-init",
                 "--critic"):
        assert flag in result.stdout
