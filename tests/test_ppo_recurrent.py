"""ppo_recurrent.py alone: docs/design.md §6 items 5 and 11 for recurrent policies (sequences rebuild the rollout's
hidden states, state zeroed at episode starts, the bootstrap does not advance it), each test named after its bug.
The invariants shared with the other scripts are tested on all three in test_invariants.py."""

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch

import ppo_recurrent as ppo
from conftest import REPO, run_cli, script_named, spaces

SCRIPT = script_named("ppo_recurrent")
TRUNKS = [("gru", True, 1), ("gru", False, 2), ("lstm", True, 2), ("lstm", False, 1)]


def make_agent(rnn_type="gru", shared=False, layers=1, obs_dim=3, hidden=8, seed=0, heads_see_obs=False):
    torch.manual_seed(seed)
    args = ppo.Args(rnn_type=rnn_type, rnn_hidden_size=hidden, rnn_layers=layers, shared_trunk=shared,
                    heads_see_obs=heads_see_obs, hidden_sizes=(8,), activation="tanh", init_log_std=0.0)
    return ppo.RecurrentAgent(args, *spaces(obs_dim, 2, -1.0, 1.0))


def step_by_step(agent, obs, state, starts):
    """The rollout's computation: one step at a time, zeroing the state where an episode starts."""
    actor, critic = [], []
    for t in range(obs.shape[0]):
        state = state * ~starts[t, :, None]
        a, c, state = agent.features(obs[t : t + 1], state, starts[t : t + 1])
        actor.append(a[0])
        critic.append(c[0])
    return torch.stack(actor), torch.stack(critic), state


def random_sequences(agent, K=9, B=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(K, B, 3, generator=g)
    state = torch.randn(B, agent.state_size, generator=g)
    starts = torch.rand(K, B, generator=g) < 0.25
    starts[:, 0] = False  # one sequence without any episode start
    starts[0, 1] = True  # one that starts an episode on its first step
    starts[3, 2] = starts[4, 2] = True  # a one-step episode inside a sequence
    starts[K - 1, 3] = True  # an episode that starts on the last step
    return obs, state, starts


def record_acting_and_training(monkeypatch):
    """Records every rollout step's (obs, state, starts) and every loss call's (a copy of the agent before its
    step, the sequences' obs, starting states and starts)."""
    acted, trained = [], []
    original_act, original_loss = ppo.RecurrentAgent.get_action_and_value, ppo.ppo_loss

    def recording_act(self, obs, state, starts, action=None, critic_obs=None):
        if action is None:  # a rollout step (the update scores stored actions through ppo_loss)
            acted.append((obs.clone(), state.clone(), starts.clone()))
        return original_act(self, obs, state, starts, action, critic_obs)

    def recording_loss(agent, obs, actions, states, starts, *rest):
        trained.append((copy.deepcopy(agent), obs.clone(), states.clone(), starts.clone()))
        return original_loss(agent, obs, actions, states, starts, *rest)

    monkeypatch.setattr(ppo.RecurrentAgent, "get_action_and_value", recording_act)
    monkeypatch.setattr(ppo, "ppo_loss", recording_loss)
    return acted, trained


# ---------------------------------------------------------------- 11: sequences in training == the rollout
@pytest.mark.parametrize("rnn_type,shared,layers", TRUNKS)
def test_sequence_forward_reproduces_the_step_by_step_rollout(rnn_type, shared, layers):
    """Bugs: not zeroing the state at an episode start inside a sequence, starting a segment from the wrong
    state, scattering segment outputs back to the wrong steps, or reading padding."""
    agent = make_agent(rnn_type, shared, layers)
    obs, state, starts = random_sequences(agent)
    with torch.no_grad():
        expected_actor, expected_critic, expected_state = step_by_step(agent, obs, state, starts)
        actor, critic, final_state = agent.features(obs, state, starts)  # packed segments
        padded_actor, padded_critic, _ = agent.features(obs, state, starts, final_state=False)  # end-padded
    torch.testing.assert_close(actor, expected_actor, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(critic, expected_critic, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final_state, expected_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded_actor, expected_actor, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded_critic, expected_critic, atol=1e-5, rtol=1e-5)
    if not shared:
        assert not torch.allclose(actor, critic)  # separate trunks really are separate


@pytest.mark.parametrize("rnn_type,packed", [("gru", True), ("gru", False), ("lstm", True), ("lstm", False)])
def test_nothing_before_an_episode_start_reaches_the_steps_after_it(rnn_type, packed):
    """Bug: the hidden state (or an observation) of a previous episode leaks into the next one in training."""
    agent = make_agent(rnn_type, layers=2, heads_see_obs=True)
    obs, state, starts = random_sequences(agent)
    with torch.no_grad():
        actor, critic, _ = agent.features(obs, state, starts, final_state=packed)
        noisy_obs = obs + 10 * torch.randn_like(obs)
        mask = torch.zeros(obs.shape[:2], dtype=torch.bool)
        for b in range(obs.shape[1]):
            begins = torch.where(starts[:, b])[0]
            if len(begins):
                mask[begins[0]:, b] = True
        noisy_obs[mask] = obs[mask]  # change only steps before each sequence's first episode start
        noisy_actor, noisy_critic, _ = agent.features(noisy_obs, state + 5.0, starts, final_state=packed)
    assert mask.any() and (~mask).any()
    torch.testing.assert_close(noisy_actor[mask], actor[mask])
    torch.testing.assert_close(noisy_critic[mask], critic[mask])
    assert not torch.allclose(noisy_actor[~mask], actor[~mask])  # the perturbation did matter before the start


@pytest.mark.parametrize("rnn_type,shared,layers", TRUNKS)
def test_first_minibatch_has_ratio_one_and_zero_kl(in_tmp, rnn_type, shared, layers):
    """Bug: training sequences that do not rebuild the rollout's hidden states (wrong starting state, missed
    reset, off-by-one sequence cut), or observations re-normalised with newer statistics."""
    summary = ppo.train(SCRIPT.args(rnn_type=rnn_type, shared_trunk=shared, rnn_layers=layers,
                                   init_log_std=0.5))
    for h in summary["history"]:
        assert h["debug/first_minibatch_ratio_max_dev"] < 1e-4
        assert h["losses/approx_kl"] > 0  # later minibatches did move the policy


def test_recompute_hidden_starts_every_later_epoch_from_the_states_the_current_weights_produce(in_tmp, monkeypatch):
    """Bugs: --recompute-hidden that never runs (every epoch trains from the rollout's stored states), reruns
    from the wrong chunk or starting state, or without the episode resets."""
    rollout, calls = record_acting_and_training(monkeypatch)
    epochs = 3
    args = SCRIPT.args(recompute_hidden=True, update_epochs=epochs, num_minibatches=1, learning_rate=3e-3,
                       lr_schedule="constant")
    ppo.train(args)
    T, K = args.num_steps, args.bptt_len
    for iteration in range(len(calls) // epochs):
        steps = rollout[iteration * T : (iteration + 1) * T]
        obs, states, starts = (torch.stack([r[i] for r in steps]) for i in range(3))
        stored = states[::K].flatten(0, 1)  # the state entering each chunk's first step, per (chunk, env)
        for epoch in range(epochs):
            agent, sequence_obs, sequence_states, sequence_starts = calls[iteration * epochs + epoch]
            expected = stored
            if epoch > 0:  # the rollout rerun step by step with the weights this epoch starts from
                with torch.no_grad():
                    state, chunk_states = states[0], []
                    for t in range(T):
                        state = state * ~starts[t, :, None]
                        if t % K == 0:
                            chunk_states.append(state)
                        _, _, state = agent.features(obs[t][None], state, starts[t][None])
                expected = torch.stack(chunk_states).flatten(0, 1)
            match = torch.cdist(sequence_obs[0], obs[::K].flatten(0, 1),
                                compute_mode="donot_use_mm_for_euclid_dist").argmin(1)
            entering = sequence_states * ~sequence_starts[0, :, None]  # the loss zeroes it where an episode starts
            torch.testing.assert_close(entering, expected[match], atol=1e-5, rtol=1e-5)
            if epoch > 0:
                assert not torch.allclose(entering, stored[match], atol=1e-4)  # the weights moved: so did the states


# ---------------------------------------------------------------- 5: hidden state at episode starts, bootstrap
def test_stored_state_is_zero_at_every_episode_start_and_sequences_start_from_the_stored_state(in_tmp, monkeypatch):
    """Bugs: carrying the hidden state into a new episode, or training sequences that start from some other
    state (or step) than the one the rollout stored for their first step."""
    acted, trained = record_acting_and_training(monkeypatch)
    args = SCRIPT.args(update_epochs=1, num_minibatches=1)
    ppo.train(args)
    obs, states, starts = (torch.stack([a[i] for a in acted]) for i in range(3))
    assert starts.sum() >= 9 and (~starts).sum() > 0
    assert (states[starts] == 0).all()
    assert (states[~starts].abs().sum(-1) > 0).all()
    T, K = args.num_steps, args.bptt_len
    for iteration, (_, sequence_obs, sequence_states, sequence_starts) in enumerate(trained):
        rollout = slice(iteration * T, (iteration + 1) * T)
        first_obs = obs[rollout][::K].flatten(0, 1)  # every (chunk, env): the observation of its first step
        first_states = states[rollout][::K].flatten(0, 1)
        first_starts = starts[rollout][::K].flatten(0, 1)
        # Match each shuffled training sequence to the rollout step whose observation it starts with.
        match = torch.cdist(sequence_obs[0], first_obs).argmin(1)
        assert sorted(match.tolist()) == list(range(len(first_obs)))
        torch.testing.assert_close(sequence_states, first_states[match])
        assert torch.equal(sequence_starts[0], first_starts[match])
        for k in range(K):  # and the sequence holds the next K steps of that env, in order
            torch.testing.assert_close(sequence_obs[k], obs[rollout][k::K].flatten(0, 1)[match])


def test_bootstrap_value_does_not_advance_the_carried_state(in_tmp, monkeypatch):
    """Bug: computing V(next_obs) by stepping the recurrent trunk and keeping its state, so the next rollout
    starts one observation ahead (the last observation is consumed twice)."""
    acted = []
    original_act = ppo.RecurrentAgent.get_action_and_value

    def recording_act(self, obs, state, starts, action=None, critic_obs=None):
        out = original_act(self, obs, state, starts, action, critic_obs)
        if action is None:
            acted.append((state.clone(), starts.clone(), out[4].clone()))
        return out

    monkeypatch.setattr(ppo.RecurrentAgent, "get_action_and_value", recording_act)
    args = SCRIPT.args()
    ppo.train(args)
    for boundary in range(args.num_steps, len(acted), args.num_steps):
        _, _, state_after_last_step = acted[boundary - 1]
        state_in, starts_in, _ = acted[boundary]
        torch.testing.assert_close(state_in, state_after_last_step * ~starts_in[:, None])
        assert (~starts_in).any()


# ---------------------------------------------------------------- evaluation
def test_evaluation_resets_the_hidden_state_at_episode_starts(in_tmp, monkeypatch):
    """Bug: evaluation carrying memory across episodes (or not carrying it inside one)."""
    summary = ppo.train(SCRIPT.args())
    seen = []
    original = ppo.RecurrentAgent.actor_step

    def recording(self, obs, actor_state):
        seen.append(actor_state.clone())
        return original(self, obs, actor_state)

    monkeypatch.setattr(ppo.RecurrentAgent, "actor_step", recording)
    result = ppo.evaluate(summary["checkpoint"], episodes=17, device="cpu")  # 16 envs, the first plays 2
    assert result["episodes"] == 17 and np.isfinite(result["mean_return"])
    # The deployed policy is handed zeros where an episode starts (a controller's job).
    states = torch.stack(seen)
    assert (states[0] == 0).all() and (states[21] == 0).all()  # 21-step episodes: the second starts at step 21
    assert (states[1:21].abs().sum(-1) > 0).all()  # memory is carried inside an episode


# ---------------------------------------------------------------- the command line
def test_cudnn_rnns_keep_full_float32_so_a_gpu_trained_policy_is_the_network_deployed():
    """cuDNN computes a float32 GRU or LSTM as TF32 unless `torch.backends.cudnn.allow_tf32` is off, which PyTorch
    leaves on: the same checkpoint evaluated on a GPU and on the CPU gave different returns (benchmarks/results/gpu.md).
    Importing the script turns it off, for training, evaluation and export alike (a fresh interpreter: the default)."""
    code = "import torch; before = torch.backends.cudnn.allow_tf32; import ppo_recurrent; " \
           "print(before, torch.backends.cudnn.allow_tf32)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["True", "False"]


def test_help_lists_the_recurrent_flags(tmp_path):
    result = run_cli("ppo_recurrent", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for flag in ("--rnn-type", "--bptt-len", "--shared-trunk", "--recompute-hidden", "--resume"):
        assert flag in result.stdout


# ---------------------------------------------------------------- learning
def test_recurrent_policy_learns_a_masked_cue_that_no_memoryless_policy_can_use(in_tmp):
    """Bug: memory that does not work (state not carried in the rollout, no gradient through time, sequences
    cut from the wrong steps): the return then stays at or below the memoryless optimum, -7."""
    args = SCRIPT.args(env_id="MemoryCue-v0", env_kwargs=None, num_envs=16, num_steps=32, bptt_len=16,
                      num_minibatches=4, update_epochs=4, total_timesteps=16 * 32 * 16, learning_rate=3e-3,
                      anneal_lr=False, gamma=0.9, norm_reward=False, init_log_std=-0.5)
    history = ppo.train(args)["history"]
    returns = [h["charts/episodic_return"] for h in history]
    assert np.mean(returns[:2]) < -6
    assert np.mean(returns[-3:]) > -2  # about -0.2 on the reference machine
