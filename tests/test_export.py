"""From training to the robot: --export-checkpoint writes policy.onnx and policy.pt, which act exactly as the script's
own policy does (normaliser, clipping and memory inside), and --eval-checkpoint runs policy.onnx with onnxruntime
alone under the same protocol as the checkpoint.

The reference is each script's own acting code, written out here as the scripts run it in training (the normaliser
applied outside the agent, the recurrent state zeroed by episode-start flags, the transformer's window kept by its
`Context`), not `DeployedPolicy`, so a bug in the deployed module shows."""

import dataclasses
import json
import os

import numpy as np
import onnxruntime
import pytest
import torch

from conftest import SCRIPTS, VARIANTS, script_named

TOLERANCE = 1e-5


def train_tiny(script, **overrides) -> str:
    """A few iterations of the script's tiny run (Pendulum with 7-step episodes, or the Genesis arm); returns the
    checkpoint's path."""
    summary = script.module.train(script.args(**{"env_kwargs": {"max_episode_steps": 7}, **overrides}))
    return summary["checkpoint"]


def load(script, checkpoint_path, vec):
    module = script.module
    checkpoint = torch.load(checkpoint_path, weights_only=False)
    args = module.args_from_checkpoint(checkpoint)
    agent, obs_norm, _ = module.build_agent(args, vec, torch.device("cpu"))
    agent.load_state_dict(checkpoint["model"])
    obs_norm.load_state_dict(checkpoint["obs_normalizer"])
    return args, agent, obs_norm


@torch.inference_mode()
def record(script, checkpoint_path, steps: int, num_envs: int = 2):
    """Observations of real episodes, whether each step ended an episode, and the script's own mean actions."""
    module = script.module
    args = module.args_from_checkpoint(torch.load(checkpoint_path, weights_only=False))
    vec = module.make_env(args, num_envs, 123, torch.device("cpu"), stagger_episodes=False)
    args, agent, obs_norm = load(script, checkpoint_path, vec)
    obs, _ = vec.reset()
    state = agent.initial_state(num_envs) if script.name == "ppo_recurrent" else None
    starts = torch.ones(num_envs, dtype=torch.bool)
    memory_shape = (args.memory_tokens, args.token_dim) if getattr(args, "memory_tokens", 0) else None
    context = module.Context(num_envs, args.context_len, obs.shape[1], torch.device("cpu"), memory_shape) \
        if script.name.startswith("ppo_transformer") else None
    observations, dones, actions = [], [], []
    for _ in range(steps):
        if script.name == "ppo_recurrent":  # the rollout's path: every trunk, zeroed by the episode-start flags
            features, _, state = agent.features(obs_norm(obs)[None], state, starts[None])
            action = agent.env_action(agent.actor_mean(features[0]))
        elif context is not None:  # the rollout's path: the memory carried by the context, reset by episode ids
            context.push(obs_norm(obs))
            memory = None if context.memory is None else agent.reset_memory(context.memory, context.memory_starts())
            action, memory = agent.mean_action(context.obs, context.valid(), memory)
            if memory is not None:
                context.write_memory(memory)
        else:
            action = agent.mean_action(obs_norm(obs))
        observations.append(obs)
        actions.append(action)
        obs, _, terminated, truncated, _ = vec.step(action)
        starts = terminated | truncated
        if context is not None:
            context.end_episodes(starts)
        dones.append(starts)
    vec.close()
    return observations, dones, actions


def replay(run, memory, observations, dones):
    """The exported policy stepped through the recorded observations, its memory carried and zeroed at each new
    episode as a controller does; `run(obs, *memory)` returns (action, *next_memory) as numpy arrays."""
    actions = []
    for obs, done in zip(observations, dones):
        action, *memory = run(obs.numpy(), *memory)
        actions.append(torch.as_tensor(np.asarray(action)))
        memory = [np.where(done.numpy().reshape(-1, *[1] * (m.ndim - 1)), np.zeros_like(m), m) for m in memory]
    return actions


def onnx_runner(path):
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs = session.get_inputs()

    def run(obs, *memory):
        return session.run(None, {i.name: x for i, x in zip(inputs, (obs, *memory))})

    def initial_memory(batch):
        return [np.zeros((batch, *i.shape[1:]), dtype=bool if i.type == "tensor(bool)" else np.float32)
                for i in inputs[1:]]

    return run, initial_memory, session


def torchscript_runner(path):
    module = torch.jit.load(path)

    @torch.no_grad()
    def run(obs, *memory):
        return [x.numpy() for x in module(torch.from_numpy(obs), *(torch.from_numpy(m) for m in memory))]

    return run


def check_export_acts_as_the_script(script, checkpoint_path, steps):
    onnx_path, torchscript_path = script.module.export_policy(checkpoint_path)
    assert os.path.dirname(onnx_path) == os.path.dirname(os.path.abspath(checkpoint_path))
    observations, dones, expected = record(script, checkpoint_path, steps)
    assert torch.stack(dones).any(), "no episode ended: the memory's reset is not exercised"
    run, initial_memory, _ = onnx_runner(onnx_path)
    for name, runner in (("onnx", run), ("torchscript", torchscript_runner(torchscript_path))):
        got = replay(runner, initial_memory(len(observations[0])), observations, dones)
        for t, (a, b) in enumerate(zip(got, expected)):
            torch.testing.assert_close(a, b, atol=TOLERANCE, rtol=TOLERANCE, msg=f"{name}, step {t}")
    return onnx_path


@pytest.mark.parametrize("norm_obs", [False, True], ids=["raw", "normalised"])
@pytest.mark.parametrize("name", VARIANTS)
def test_exported_policy_acts_as_the_script_across_episode_ends(name, norm_obs, in_tmp):
    """Bugs: the normaliser left out of the export (or applied with --no-norm-obs), the recurrent state, the
    transformer's window or its memory tokens not carried from step to step, or not emptied at an episode's start
    (7-step episodes: 30 steps cross four of their ends)."""
    script = script_named(name)
    checkpoint = train_tiny(script, norm_obs=norm_obs)
    check_export_acts_as_the_script(script, checkpoint, steps=30)


@pytest.mark.parametrize("name", VARIANTS)
def test_exported_policy_acts_as_the_script_on_the_genesis_arm(name, in_tmp):
    script = script_named(name)
    checkpoint = train_tiny(script, **script.genesis, num_envs=8, num_steps=8, num_minibatches=2,
                            total_timesteps=8 * 8, env_kwargs={"max_episode_steps": 6})
    check_export_acts_as_the_script(script, checkpoint, steps=10)


@pytest.mark.parametrize("name", SCRIPTS)
def test_exported_actions_are_clipped_to_the_envs_bounds(name, in_tmp):
    """Bug: the clip (or tanh) left out of the export: the robot receives actions beyond its limits."""
    script = script_named(name)
    checkpoint_path = train_tiny(script)
    checkpoint = torch.load(checkpoint_path, weights_only=False)
    last_bias = [key for key in checkpoint["model"] if key.startswith("actor_mean.") and key.endswith(".bias")][-1]
    checkpoint["model"][last_bias] += 5.0  # mean actions far beyond Pendulum's +-2
    torch.save(checkpoint, checkpoint_path)
    onnx_path = check_export_acts_as_the_script(script, checkpoint_path, steps=8)
    run, initial_memory, session = onnx_runner(onnx_path)
    obs_dim = session.get_inputs()[0].shape[1]
    action = run(np.zeros((3, obs_dim), np.float32), *initial_memory(3))[0]
    np.testing.assert_allclose(action, 2.0)


@pytest.mark.parametrize("name", VARIANTS)
def test_evaluating_policy_onnx_gives_the_checkpoints_summary(name, in_tmp):
    """Bugs: the ONNX evaluation on other seeds or another episode protocol, or its memory reset differently."""
    script = script_named(name)
    checkpoint = train_tiny(script)
    onnx_path, _ = script.module.export_policy(checkpoint)
    from_checkpoint = script.module.evaluate(checkpoint, episodes=5, device="cpu", sim_device="cpu")
    from_onnx = script.module.evaluate(onnx_path, episodes=5, device="cpu", sim_device="cpu")
    assert from_onnx.keys() == from_checkpoint.keys() and from_onnx["episodes"] == 5
    for key, value in from_checkpoint.items():
        assert from_onnx[key] == pytest.approx(value, rel=1e-4, abs=1e-4), key


def test_an_export_stopped_between_its_two_files_leaves_the_last_pair_whole(in_tmp, monkeypatch):
    """Bug: an export stopped (Ctrl-C, a TorchScript trace that fails) after policy.onnx was replaced and before
    policy.pt was: a new policy.onnx beside the old policy.pt, and a policy.pt.tmp or policy.onnx.tmp left behind."""
    script = script_named("ppo_continuous")
    checkpoint_path = train_tiny(script)
    exported = script.module.export_policy(checkpoint_path)
    before = [open(path, "rb").read() for path in exported]
    checkpoint = torch.load(checkpoint_path, weights_only=False)
    last_bias = [key for key in checkpoint["model"] if key.startswith("actor_mean.") and key.endswith(".bias")][-1]
    checkpoint["model"][last_bias] += 1.0  # another policy to export over the first
    torch.save(checkpoint, checkpoint_path)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch.jit, "trace", stopped)
    with pytest.raises(KeyboardInterrupt):
        script.module.export_policy(checkpoint_path)
    assert [open(path, "rb").read() for path in exported] == before
    assert not [name for name in os.listdir(os.path.dirname(checkpoint_path)) if name.endswith(".tmp")]


def test_onnx_metadata_holds_what_a_controller_needs(in_tmp):
    script = script_named("ppo_recurrent")
    checkpoint = train_tiny(script)
    onnx_path, _ = script.module.export_policy(checkpoint)
    _, _, session = onnx_runner(onnx_path)
    metadata = session.get_modelmeta().custom_metadata_map
    assert metadata["script"] == "ppo_recurrent" and metadata["env_id"] == "PendulumNoVel-v1"
    assert json.loads(metadata["observation_size"]) == 2 and json.loads(metadata["action_size"]) == 1
    assert json.loads(metadata["action_low"]) == [-2.0] and json.loads(metadata["control_dt"]) == 0.05
    assert json.loads(metadata["iteration"]) == torch.load(checkpoint, weights_only=False)["iteration"]
    assert [i.name for i in session.get_inputs()] == ["obs", "state"]
    assert [o.name for o in session.get_outputs()] == ["action", "next_state"]
    assert json.loads(metadata["inputs"])["state"][0] == ["batch", 16]  # the actor's trunk alone (GRU 16)
    run, initial_memory, _ = onnx_runner(onnx_path)
    for batch in (1, 5):  # a dynamic batch size
        action, state = run(np.zeros((batch, 2), np.float32), *initial_memory(batch))
        assert action.shape == (batch, 1) and state.shape == (batch, 16)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_settings_come_back_whole_from_an_exported_models_json_metadata(name):
    """Bug: an --env-kwargs range read back from policy.onnx's metadata as a list, not a tuple: the task then takes
    `[1.0, 1.0] != (1.0, 1.0)` for a range to draw from, and --eval-checkpoint policy.onnx runs another task."""
    module = script_named(name).module
    args = module.Args(env_id="Go2Walk-v0", hidden_sizes=(32, 16),
                       env_kwargs={"friction_range": (1.0, 1.0), "decimation": 4, "observe_base_velocity": False})
    assert module.args_from_checkpoint({"args": json.loads(json.dumps(dataclasses.asdict(args)))}) == args


@pytest.mark.parametrize("name", SCRIPTS)
def test_evaluating_another_scripts_onnx_is_refused_in_one_line(name, in_tmp):
    other = script_named(SCRIPTS[(SCRIPTS.index(name) + 1) % 3])
    onnx_path, _ = other.module.export_policy(train_tiny(other))
    with pytest.raises(script_named(name).module.UsageError, match=f"was not exported by {name}.py"):
        script_named(name).module.evaluate(onnx_path, episodes=1, device="cpu", sim_device="cpu")


@pytest.mark.parametrize("trunks", [(("shared_trunk", False),), (("shared_trunk", True),)],
                         ids=["two-trunks", "shared"])
def test_exported_lstm_policy_of_two_layers_acts_as_the_script(trunks, in_tmp):
    """Bugs: an LSTM exported as if it were a GRU (its cell state dropped), layers or trunks mixed up in the flat
    state (the deployed state is the actor trunk's slice of the script's)."""
    script = script_named("ppo_recurrent")
    checkpoint = train_tiny(script, rnn_type="lstm", rnn_layers=2, **dict(trunks))
    onnx_path = check_export_acts_as_the_script(script, checkpoint, steps=20)
    _, _, session = onnx_runner(onnx_path)
    assert session.get_inputs()[1].shape[1:] == [2 * 2 * 16]  # (hidden, cell) x 2 layers x 16


def test_exported_memory_gated_policy_acts_as_the_script(in_tmp):
    """Bug: the deployed transformer writing its memory the plain way where the script gates it (--memory-gate)."""
    script = script_named("ppo_transformer-memory")
    check_export_acts_as_the_script(script, train_tiny(script, memory_gate=True), steps=20)
