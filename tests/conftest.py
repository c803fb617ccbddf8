"""What the test files share: one adapter per script (so a test written once runs on all three), tiny run
settings, a scripted env whose every observation, reward and episode end is known, and small helpers.

The scripts are copies by design; a test parametrised with the `script` fixture holds an invariant on every
copy, and a fourth script only needs an adapter here."""

from __future__ import annotations

import copy
import gc
import importlib
import os
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from envs import EpisodeTracker, release_genesis

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("ppo_continuous", "ppo_recurrent", "ppo_transformer")
# The scripts and the modes of one that carry a policy's memory differently: the invariants on memory run on each.
VARIANTS = SCRIPTS + ("ppo_transformer-memory",)
TIMING_KEYS = ("charts/SPS", "time/rollout_s", "time/update_s", "time/eval_s")

# A loaded 2-core machine (CI beside a Genesis build or trainings) starts and runs processes many times slower than an
# idle one: waits are on what a test needs, bounded by a deadline that only a hang reaches.
SLOW_MACHINE_S = 600


def metrics_without_timing(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if k not in TIMING_KEYS} for h in history]


def run_cli(script: str, *flags: str, cwd, timeout: int = SLOW_MACHINE_S) -> subprocess.CompletedProcess:
    """Runs `python <script>.py FLAGS` in `cwd` and returns the finished process (text output)."""
    return subprocess.run([sys.executable, os.path.join(REPO, f"{script}.py"), *flags], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def as_flags(settings: dict) -> list[str]:
    """Args fields as command-line flags."""
    flags = []
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (tuple, list)):
            flags += [flag, *map(str, value)]
        elif isinstance(value, dict):
            flags += [flag, *(str(x) for item in value.items() for x in item)]
        else:
            flags += [flag, str(value)]
    return flags


def wait_until(condition, stage: str, timeout: float = SLOW_MACHINE_S, process=None, interval: float = 0.2):
    """Polls `condition()` until it returns something truthy (returned); fails naming `stage` and how long it waited
    if `timeout` seconds pass first, or if `process` (a Popen) exits first (with the end of its output)."""
    started = time.monotonic()
    while True:
        result = condition()
        if result:
            return result
        elapsed = time.monotonic() - started
        if process is not None and process.poll() is not None:
            output = process.communicate()[0] if process.stdout else ""
            pytest.fail(f"{stage}: the process exited (status {process.returncode}) after {elapsed:.0f} s, before "
                        f"that; its output ends: {(output or '')[-2000:]}")
        if elapsed > timeout:
            pytest.fail(f"{stage}: not done after {elapsed:.0f} s (the limit, {timeout} s, is for a hang)")
        time.sleep(interval)


def communicate(process, stage: str, timeout: float = SLOW_MACHINE_S) -> str:
    """The output of `process` once it exits; fails naming `stage` and the wait if it has not within `timeout` s."""
    started = time.monotonic()
    try:
        return process.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired as error:
        process.kill()
        output = error.output.decode() if isinstance(error.output, bytes) else (error.output or "")
        pytest.fail(f"{stage}: the process had not exited after {time.monotonic() - started:.0f} s; its output ends: "
                    f"{output[-2000:]}")


def naive_gae(rewards, values, last_value, final_values, terminated, truncated, gamma, lam):
    """Per env, per step: the explicit discounted sum of TD errors up to the end of the episode (or rollout)."""
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


def spaces(obs_dim: int, act_dim: int, low: float, high: float) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    """An observation and an action space of these sizes (what an agent is built from)."""
    return gym.spaces.Box(-np.inf, np.inf, (obs_dim,)), gym.spaces.Box(low, high, (act_dim,))


def check_episode_statistics(vec, actions, on_step=None) -> int:
    """Steps `vec` with `actions`, checking info["episode"] against the raw rewards summed here (mask = the
    envs whose episode ended, returns and lengths of exactly those episodes); `on_step(terminated, truncated,
    info)` adds a task's own checks. Returns the number of finished episodes."""
    running = torch.zeros(vec.num_envs, dtype=torch.float64)
    lengths = torch.zeros(vec.num_envs, dtype=torch.int64)
    finished = 0
    for action in actions:
        _, reward, terminated, truncated, info = vec.step(action)
        running += reward.double()
        lengths += 1
        done = terminated | truncated
        assert torch.equal(info["episode"]["mask"], done)
        if on_step is not None:
            on_step(terminated, truncated, info)
        torch.testing.assert_close(info["episode"]["r"][done], running[done].float())
        assert torch.equal(info["episode"]["l"][done], lengths[done])
        finished += int(done.sum())
        running[done] = 0
        lengths[done] = 0
    return finished


def assert_same_state(got, expected, where: str = "state") -> None:
    """`got` equals `expected` exactly: nested dicts and lists of tensors and plain values (strings, numbers)."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), where
        for key in expected:
            assert_same_state(got[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_same_state(a, b, f"{where}[{i}]")
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected, atol=0, rtol=0, equal_nan=True, msg=lambda m: f"{where}: {m}")
    else:
        assert got == expected, where


def check_resume(vec, make_other, later_actions) -> None:
    """Saves `vec.state_dict()` where it stands, steps `later_actions` (past an episode's end: give more than its
    length), and checks that the saved state is still what was saved (a copy, not the env's live tensors), and that a
    fresh env from `make_other()`, loaded with it, steps to the same observations, rewards and ends, the critic's
    observation too, bit for bit: a resumed run on the CPU continues as the uninterrupted one."""
    state = vec.state_dict()
    saved = copy.deepcopy(state)
    expected = [vec.step(action) for action in later_actions]
    assert sum(int((terminated | truncated).sum()) for _, _, terminated, truncated, _ in expected) > 0, \
        "no episode ended in the steps compared: give more actions"
    assert_same_state(state, saved)
    other = make_other()
    other.reset()
    other.load_state_dict(state)
    try:
        for step, (action, want) in enumerate(zip(later_actions, expected)):
            got = other.step(action)
            for name, got_value, value in zip(("obs", "reward", "terminated", "truncated"), got[:4], want[:4]):
                torch.testing.assert_close(got_value, value, atol=0, rtol=0, msg=lambda m: f"{name}, step {step}: {m}")
            if "critic_obs" in want[4]:  # the critic's observation resumes with the policy's
                torch.testing.assert_close(got[4]["critic_obs"], want[4]["critic_obs"], atol=0, rtol=0)
    finally:
        other.close()


# What the Go2 tasks read of the simulator each step (`_read_state`), the rough task adding the ground under its scan
GO2_STATE_READ = ("base_pos", "base_height", "base_quat", "base_lin_vel", "base_ang_vel", "projected_gravity",
                  "dof_pos", "dof_vel", "link_forces")


def check_started_state_is_what_a_read_gives(vec, names: tuple[str, ...], actions) -> None:
    """Steps `actions`, then one more with the first half of the envs at their episode's last step, and checks that
    the state the task keeps for them after their new episodes started (`_read_started_state`, which may write in
    what it knows instead of reading) is what reading the simulator again gives, for every attribute in `names`."""
    vec.reset(seed=1)
    for action in actions[:-1]:
        vec.step(action)
    half = vec.num_envs // 2
    vec.episode_step[:half] = vec.max_episode_steps - 1
    _, _, terminated, truncated, _ = vec.step(actions[-1])
    assert (terminated | truncated)[:half].all()
    kept = {name: getattr(vec, name).clone() for name in names}
    vec._read_state()
    for name in names:
        torch.testing.assert_close(kept[name], getattr(vec, name), atol=1e-5, rtol=1e-5, msg=name)


def check_seeding(runs, actions, atol: float) -> None:
    """`runs`: three (env, seed) pairs, the first two alike; the observations after resetting each with its seed and
    stepping `actions` must agree for the first two (to `atol`) and differ for the third."""
    trajectories = []
    for env, seed in runs:
        obs, _ = env.reset(seed=seed)
        trajectories.append(torch.stack([obs] + [env.step(action)[0] for action in actions]))
    torch.testing.assert_close(trajectories[0], trajectories[1], atol=atol, rtol=atol)
    assert not torch.allclose(trajectories[0], trajectories[2])


# ---------------------------------------------------------------- one adapter per script
class Script:
    """Calls one script's agent and loss the same way for every script: single steps from a fresh episode
    (zero recurrent state, a window holding only the current step)."""

    #: tiny runs of a few iterations on a Pendulum task (each script's own, see SMALL_ARGS)
    small: dict
    #: checkpoint entries that carry the policy's memory between rollouts
    memory_keys: tuple[str, ...] = ()
    #: a few iterations on the Genesis arm (its task variant and the script's own settings for it)
    genesis = dict(env_id="FrankaReach-v0")

    def __init__(self, name: str):
        self.name = name
        self.module = importlib.import_module(name.split("-")[0])

    def __repr__(self):
        return self.name

    #: the agent's acting (and scoring) method, as CleanRL names it, and where its `action` argument is
    act_method = "get_action_and_value"
    action_position: int

    def act_outputs(self, outputs: tuple) -> tuple:
        """get_action_and_value's outputs as (action, log-prob, value, ...memory after the step)."""
        action, logprob, _, value, *memory = outputs
        return (action, logprob, value, *memory)

    def samples(self, act_inputs: tuple) -> bool:
        """Whether a call of the acting method with these arguments samples actions (else it scores given ones)."""
        return len(act_inputs) <= self.action_position or act_inputs[self.action_position] is None

    def args(self, **overrides):
        """The task's settings (its preset) with the tiny run's sizes and `overrides` on top. The tests' recorded
        numbers and hand-built agents are on the CPU; a GPU machine would otherwise pick cuda."""
        flags = {"policy_device": "cpu", "sim_device": "cpu", **self.small, **overrides}
        if hasattr(self.module, "task_args"):
            return self.module.task_args(flags.pop("env_id"), **flags)
        return self.module.Args(**flags)

    def make_agent(self, obs_dim=3, act_dim=2, low=-1.0, high=1.0, transform="clip", init_log_std=0.0, seed=0):
        raise NotImplementedError

    def act(self, agent, obs):
        """(action, logprob, value) for (B, obs_dim) observations, sampled as in the rollout."""
        raise NotImplementedError

    def evaluate(self, agent, obs, actions):
        """(logprob, entropy, value) as the loss computes them."""
        raise NotImplementedError

    def mean(self, agent, obs):
        """The Gaussian's mean (before any clip or squash)."""
        raise NotImplementedError

    def loss(self, agent, obs, actions, old_logprobs, advantages, returns, old_values, args):
        raise NotImplementedError

    def loss_rows(self, loss_inputs: tuple) -> dict[str, torch.Tensor]:
        """From the arguments of one ppo_loss call less the agent and args: per step (rows), the current
        observation, the action, the old log-prob and the value target."""
        raise NotImplementedError

    def acted_obs(self, act_inputs: tuple) -> torch.Tensor:
        """From the arguments of one Agent.act call: the current observation of each env."""
        return act_inputs[0]


class MLPScript(Script):
    small = dict(env_id="Pendulum-v1", num_envs=2, num_steps=64, num_minibatches=4, update_epochs=2,
                 total_timesteps=2 * 64 * 4, progress_bar=False)

    def make_agent(self, obs_dim=3, act_dim=2, low=-1.0, high=1.0, transform="clip", init_log_std=0.0, seed=0):
        torch.manual_seed(seed)
        args = self.module.Args(hidden_sizes=(16,), activation="tanh", init_log_std=init_log_std,
                                action_transform=transform)
        return self.module.Agent(args, *spaces(obs_dim, act_dim, low, high))

    action_position = 1

    def act(self, agent, obs):
        return self.act_outputs(agent.get_action_and_value(obs))

    def evaluate(self, agent, obs, actions):
        return agent.get_action_and_value(obs, actions)[1:]

    def mean(self, agent, obs):
        return agent.actor_mean(obs)

    def loss(self, agent, obs, actions, old_logprobs, advantages, returns, old_values, args):
        return self.module.ppo_loss(agent, obs, actions, old_logprobs, advantages, returns, old_values, None, args)

    def loss_rows(self, loss_inputs):
        obs, actions, logprobs, _, returns, *_ = loss_inputs  # then old values, critic observations
        return dict(obs=obs, actions=actions, logprobs=logprobs, returns=returns)


class RecurrentScript(Script):
    # 21-step episodes and 8-step sequences: episode starts fall at every offset inside the sequences.
    small = dict(env_id="PendulumNoVel-v1", num_envs=3, num_steps=32, bptt_len=8, num_minibatches=4,
                 update_epochs=2, total_timesteps=3 * 32 * 3, rnn_hidden_size=16, hidden_sizes=(16,),
                 env_kwargs={"max_episode_steps": 21}, progress_bar=False)
    memory_keys = ("rnn_state", "next_start")
    genesis = dict(env_id="FrankaReachNoVel-v0", bptt_len=0)  # whole-rollout sequences, staggered episode starts

    action_position = 3

    def make_agent(self, obs_dim=3, act_dim=2, low=-1.0, high=1.0, transform="clip", init_log_std=0.0, seed=0):
        torch.manual_seed(seed)
        args = self.module.Args(rnn_type="gru", rnn_hidden_size=8, rnn_layers=1, shared_trunk=False,
                                heads_see_obs=False, hidden_sizes=(16,), activation="tanh", init_log_std=init_log_std,
                                action_transform=transform)
        return self.module.RecurrentAgent(args, *spaces(obs_dim, act_dim, low, high))

    @staticmethod
    def _fresh(agent, obs):
        return agent.initial_state(obs.shape[0]), torch.ones(obs.shape[0], dtype=torch.bool)

    def act(self, agent, obs):
        return self.act_outputs(agent.get_action_and_value(obs, *self._fresh(agent, obs)))[:3]

    def evaluate(self, agent, obs, actions):
        state, starts = self._fresh(agent, obs)
        _, logprob, entropy, value, _ = agent.get_action_and_value(obs[None], state, starts[None], actions[None])
        return logprob[0], entropy[0], value[0]

    def mean(self, agent, obs):
        state, starts = self._fresh(agent, obs)
        actor_features, _, _ = agent.features(obs[None], state, starts[None])
        return agent.actor_mean(actor_features[0])

    def loss(self, agent, obs, actions, old_logprobs, advantages, returns, old_values, args):
        state, starts = self._fresh(agent, obs)
        return self.module.ppo_loss(agent, obs[None], actions[None], state, starts[None], old_logprobs[None],
                                    advantages[None], returns[None], old_values[None], None, args)

    def loss_rows(self, loss_inputs):
        obs, actions, _, _, logprobs, _, returns, *_ = loss_inputs  # (K, B, ...) sequences, then critic obs
        rows = lambda x: x.transpose(0, 1).flatten(0, 1)  # noqa: E731
        return dict(obs=rows(obs), actions=rows(actions), logprobs=rows(logprobs), returns=rows(returns))


class TransformerScript(Script):
    # 7-step episodes: windows cross episode starts all the time.
    small = dict(env_id="PendulumNoVel-v1", num_envs=3, num_steps=16, num_minibatches=4, update_epochs=2,
                 total_timesteps=3 * 16 * 3, token_dim=8, num_heads=2, num_layers=2, hidden_sizes=(16,),
                 env_kwargs={"max_episode_steps": 7}, progress_bar=False)
    memory_keys = ("context",)
    genesis = dict(env_id="FrankaReach-v0", context_len=2, num_tokens=2)

    def make_agent(self, obs_dim=3, act_dim=2, low=-1.0, high=1.0, transform="clip", init_log_std=0.0, seed=0):
        torch.manual_seed(seed)
        args = self.module.resolve_args(self.module.task_args(
            "PendulumNoVel-v1", token_dim=8, num_heads=2, num_layers=1, context_len=3, num_tokens=2,
            hidden_sizes=(16,), init_log_std=init_log_std, action_transform=transform, critic="shared"))
        return self.module.TransformerAgent(args, *spaces(obs_dim, act_dim, low, high))

    @staticmethod
    def _window(agent, obs):
        windows = obs.new_zeros(obs.shape[0], agent.context_len, obs.shape[1])
        windows[:, -1] = obs
        valid = torch.zeros(obs.shape[0], agent.context_len, dtype=torch.bool)
        valid[:, -1] = True
        return windows, valid

    action_position = 2

    def act(self, agent, obs):
        return self.act_outputs(agent.get_action_and_value(*self._window(agent, obs)))

    def evaluate(self, agent, obs, actions):
        return agent.get_action_and_value(*self._window(agent, obs), actions)[1:]

    def mean(self, agent, obs):
        return agent.actor_mean(agent.features(*self._window(agent, obs)))

    def loss(self, agent, obs, actions, old_logprobs, advantages, returns, old_values, args):
        return self.module.ppo_loss(agent, *self._window(agent, obs), None, None, actions, old_logprobs, advantages,
                                    returns, old_values, None, args)

    def loss_rows(self, loss_inputs):
        windows, _, _, _, actions, logprobs, _, returns, *_ = loss_inputs  # (L, B, ...) sequences, then old values...
        rows = lambda x: x.transpose(0, 1).flatten(0, 1)  # noqa: E731
        return dict(obs=rows(windows[:, :, -1]), actions=rows(actions), logprobs=rows(logprobs), returns=rows(returns))

    def acted_obs(self, act_inputs):
        return act_inputs[0][:, -1]


class TransformerMemoryScript(TransformerScript):
    """ppo_transformer.py in memory mode: memory tokens carried step to step, 8-step sequences in the update (with
    7-step episodes, starts at every offset), a 2-step window beside the memory."""
    # Full-size residual branches (not --small-init's quiet ones): the current step must read the memory from the
    # first iteration, or a wrong memory in the update moves the first minibatch's ratio by only 1e-5.
    small = dict(TransformerScript.small, memory_tokens=2, context_len=2, bptt_len=8, num_minibatches=2,
                 critic="shared", small_init=False)
    memory_keys = ("context",)
    genesis = dict(env_id="FrankaReach-v0", context_len=1, num_tokens=2, memory_tokens=2, bptt_len=0)

    def make_agent(self, obs_dim=3, act_dim=2, low=-1.0, high=1.0, transform="clip", init_log_std=0.0, seed=0):
        torch.manual_seed(seed)
        args = self.module.resolve_args(self.module.task_args(
            "PendulumNoVel-v1", token_dim=8, num_heads=2, num_layers=1, context_len=3, num_tokens=2, memory_tokens=2,
            hidden_sizes=(16,), init_log_std=init_log_std, action_transform=transform, critic="shared"))
        return self.module.TransformerAgent(args, *spaces(obs_dim, act_dim, low, high))

    @staticmethod
    def _fresh(agent, obs):
        return (obs.new_zeros(obs.shape[0], agent.memory_tokens, agent.token_dim),
                torch.ones(obs.shape[0], dtype=torch.bool))

    def act(self, agent, obs):
        return self.act_outputs(agent.get_action_and_value(*self._window(agent, obs), None, None,
                                                           *self._fresh(agent, obs)))[:3]

    def evaluate(self, agent, obs, actions):
        return agent.get_action_and_value(*self._window(agent, obs), actions, None, *self._fresh(agent, obs))[1:4]

    def mean(self, agent, obs):
        memory, starts = self._fresh(agent, obs)
        return agent.actor_mean(agent.features(*self._window(agent, obs), agent.reset_memory(memory, starts)))

    def loss(self, agent, obs, actions, old_logprobs, advantages, returns, old_values, args):
        memory, starts = self._fresh(agent, obs)
        windows, valid = self._window(agent, obs)
        return self.module.ppo_loss(agent, windows[None], valid[None], memory, starts[None], actions[None],
                                    old_logprobs[None], advantages[None], returns[None], old_values[None], None, args)


ADAPTERS = {"ppo_continuous": MLPScript, "ppo_recurrent": RecurrentScript, "ppo_transformer": TransformerScript,
            "ppo_transformer-memory": TransformerMemoryScript}


@pytest.fixture(params=SCRIPTS)
def script(request) -> Script:
    """Each of the three scripts in turn."""
    return ADAPTERS[request.param](request.param)


@pytest.fixture(params=VARIANTS)
def variant(request) -> Script:
    """Each of the three scripts, and the transformer's memory mode, in turn: for the invariants on memory."""
    return ADAPTERS[request.param](request.param)


def script_named(name: str) -> Script:
    return ADAPTERS[name](name)


# Genesis keeps the memory of every scene destroyed in a process until Genesis itself is destroyed
# (genesis-world#949): the suite's process grew to 5.8 GB. Destroying it costs the next scene ~5 s (Genesis's init and
# its kernels from the cache), so a module ends with it only once the process holds this much (twice in the suite,
# at 4.7-4.8 GB).
RELEASE_GENESIS_ABOVE_MIB = 4096


def resident_mib() -> float:
    """This process's resident memory (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.fixture(autouse=True, scope="module")
def genesis_released_after_a_module_once_it_holds_too_much():
    """The module's own scenes are closed by then (its fixtures end first). Its garbage is collected first: what
    `collection_skips_what_was_alive_before_the_test` froze comes back to the collector."""
    yield
    gc.unfreeze()
    gc.collect()
    if resident_mib() > RELEASE_GENESIS_ABOVE_MIB:
        release_genesis()


@pytest.fixture(autouse=True)
def collection_skips_what_was_alive_before_the_test():
    """Genesis runs a full garbage collection in every scene it destroys, over every object of the process: 0.26 s a
    close in a process holding Genesis and the three scripts (566k objects), more in the suite's. What exists when a
    test starts is frozen out of collections (gc.freeze), so a collection within the test scans only the test's own
    objects; the module's end gives them back."""
    gc.freeze()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Runs the test from tmp_path, so that runs/ and wandb/ land there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------- a scripted env
class ScriptedEnv:
    """A batched env under the envs/ contract whose outputs are all known in advance.

    Observation of env n at global step k: [k + 100 n, sin(1.3 t + n)] (t: the step within the episode), so
    every observation is unique and identifies its env and step; a final observation adds 0.5 to the first
    entry, so it never equals an observation acted on. Episodes end on the schedule `ends[k, n]` (0: go on,
    1: terminated, 2: truncated). The reward depends on the observation acted on and the action received.
    Records every action received and every (final) observation, reward and flag given. With `critic`, a critic
    observation of the same size that no policy observation equals: (3 - 0.01 x[0], x[1] + 5) of each (final)
    observation x. With `metrics`, info["episode_metrics"] holds `env_index` (the env's number), `on_even_envs`
    (the same, NaN on odd envs: a metric that does not apply to their episodes) and `on_no_env` (NaN everywhere),
    and info["reward_terms"] splits the reward into `from_obs` and `from_action` (the rest).
    """

    def __init__(self, num_envs: int, ends: torch.Tensor, device="cpu", action_bound: float = 0.5,
                 critic: bool = False, metrics: bool = False):
        self.num_envs, self.device, self.ends, self.metrics = num_envs, device, ends, metrics
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_critic_observation_space = self.single_observation_space if critic else None
        self.single_action_space = gym.spaces.Box(-action_bound, action_bound, (1,), np.float32)
        self.episodes = EpisodeTracker(num_envs, device)
        self.received, self.rewards, self.terminated, self.truncated, self.final_obs = [], [], [], [], []
        self.obs_log = []  # the observation each step returned (the reset's is `first_obs`)
        self.t = torch.zeros(num_envs)
        self.k = 0

    def _obs(self):
        env = torch.arange(self.num_envs)
        return torch.stack([self.k + 100.0 * env, torch.sin(self.t * 1.3 + env)], -1)

    @staticmethod
    def critic_of(obs):
        return torch.stack([3 - 0.01 * obs[..., 0], obs[..., 1] + 5], -1)

    def reset(self, seed=None, options=None):
        self.t.zero_()
        self.k = 0
        self.obs = self._obs()
        self.first_obs = self.obs.clone()
        return self.obs.clone(), {} if self.single_critic_observation_space is None else {
            "critic_obs": self.critic_of(self.obs)}

    def step(self, action):
        action = torch.as_tensor(action, dtype=torch.float32)
        self.received.append(action.clone())
        reward = self.obs[:, 1] + action[:, 0] + 0.01 * self.k
        terms = {"from_obs": self.obs[:, 1].clone(), "from_action": reward - self.obs[:, 1]}
        ends = self.ends[self.k]
        terminated, truncated = ends == 1, ends == 2
        self.t += 1
        final_obs = self._obs()
        final_obs[:, 0] += 0.5
        self.k += 1
        self.t[terminated | truncated] = 0
        self.obs = self._obs()
        final_obs = torch.where((terminated | truncated)[:, None], final_obs, self.obs)
        for log, value in ((self.rewards, reward), (self.terminated, terminated), (self.truncated, truncated),
                           (self.final_obs, final_obs), (self.obs_log, self.obs)):
            log.append(value.clone())
        info = {"final_obs": final_obs, "episode": self.episodes.update(reward, terminated | truncated),
                "sim_errors": torch.zeros(self.num_envs, dtype=torch.bool)}
        if self.single_critic_observation_space is not None:
            info["critic_obs"], info["final_critic_obs"] = self.critic_of(self.obs), self.critic_of(final_obs)
        if self.metrics:
            env, nan = torch.arange(self.num_envs, dtype=torch.float32), torch.tensor(float("nan"))
            ended = terminated | truncated
            info["episode_metrics"] = {"env_index": torch.where(ended, env, 0.0),
                                       "on_even_envs": torch.where(ended & (env % 2 == 0), env, nan),
                                       "on_no_env": torch.full((self.num_envs,), float("nan"))}
            info["reward_terms"] = terms
        return self.obs.clone(), reward, terminated, truncated, info

    def state_dict(self):
        raise NotImplementedError

    def close(self):
        pass


def episode_schedule(steps: int, num_envs: int, rollout: int, seed: int = 0) -> torch.Tensor:
    """Irregular episode ends (one-step episodes included), with a termination and a truncation on the last
    step of every rollout."""
    generator = torch.Generator().manual_seed(seed)
    draw = torch.rand(steps, num_envs, generator=generator)
    ends = torch.where(draw < 0.12, 1, torch.where(draw < 0.24, 2, 0))
    ends[rollout - 1 :: rollout, 0] = 1
    ends[rollout - 1 :: rollout, 1] = 2
    return ends


def use_scripted_env(monkeypatch, module, ends: torch.Tensor, action_bound: float = 0.5,
                     critic: bool = False, metrics: bool = False, env_class=None) -> list[ScriptedEnv]:
    """Makes `module`'s envs.make return ScriptedEnvs (or `env_class`'s, a subclass); returns the list they are
    appended to."""
    made: list[ScriptedEnv] = []

    def make(env_id, num_envs, seed, device, **kwargs):
        made.append((env_class or ScriptedEnv)(num_envs, ends[:, :num_envs], device, action_bound, critic, metrics))
        return made[-1]

    monkeypatch.setattr(module.envs, "make", make)
    return made
