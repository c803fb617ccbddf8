"""The batched torch-tensor interface over Gymnasium vector environments.

`GymnasiumVecEnv` adapts any Gymnasium id (`gym.make_vec` with same-step autoreset; in sync mode it steps the
vector env's sub-envs itself) to the contract in docs/design.md §3 (its raw episode statistics in numpy);
`EpisodeTracker` keeps them in torch for the natively batched tasks.
"""

from __future__ import annotations

import math
import numbers

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode


class EpisodeTracker:
    """Raw (un-normalised) return and length of the running episode of every env."""

    def __init__(self, num_envs: int, device: torch.device | str):
        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.int64, device=device)

    def update(self, reward: torch.Tensor, done: torch.Tensor) -> dict[str, torch.Tensor]:
        """Adds one step; returns {"r", "l", "mask"} where `mask` marks the envs whose episode ended."""
        self.returns += reward
        self.lengths += 1
        episode = {"r": self.returns.float(), "l": self.lengths.clone(), "mask": done.clone()}
        self.clear(done)
        return episode

    def state_dict(self) -> dict:
        return {"returns": self.returns.to("cpu", copy=True), "lengths": self.lengths.to("cpu", copy=True)}

    def load_state_dict(self, state: dict) -> None:
        self.returns.copy_(state["returns"])
        self.lengths.copy_(state["lengths"])

    def clear(self, mask: torch.Tensor | None = None) -> None:
        if mask is None:
            self.returns.zero_()
            self.lengths.zero_()
        else:
            self.returns.masked_fill_(mask, 0.0)
            self.lengths.masked_fill_(mask, 0)


# Observations or rewards beyond this magnitude count as a simulator blow-up, like NaN or inf: a value of 1e30
# from a diverged simulator is finite but would poison an observation normaliser's statistics for good.
MAX_ABS_VALUE = 1e6


def check_ranges(positive: bool = False, **ranges) -> None:
    """A ValueError naming the first of `ranges` (option name: value) that is not a (low, high) pair of finite
    numbers (Python's or numpy's) with low <= high, or, when `positive`, whose low is not above 0."""
    for name, value in ranges.items():
        if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(
                isinstance(bound, numbers.Real) and not isinstance(bound, bool) and math.isfinite(bound)
                for bound in value)):
            raise ValueError(f"{name} must be a (low, high) pair of finite numbers, got {value!r}")
        low, high = value
        if not low <= high:
            raise ValueError(f"{name} must be (low, high) with low <= high, got {value!r}")
        if positive and not low > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


def torch_device(device: torch.device | str) -> torch.device:
    """`device` as a torch.device, with a clear error where CUDA is asked for and torch sees no GPU."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} but torch sees no CUDA GPU; use device='cpu'")
    return device


def reset_seed(env, seed: int | None) -> int | None:
    """The seed for `env.reset(seed)`: the first reset uses the seed `env` was made with, later ones continue its
    RNG unless given one."""
    if seed is None and not env.seeded:
        seed = env.seed
    env.seeded = True
    return seed


def as_bool_mask(reset_mask, num_envs: int) -> torch.Tensor:
    """Validates `options["reset_mask"]` (tensor or array of bools, one per env) and returns it on the CPU."""
    mask = torch.as_tensor(reset_mask).cpu()
    if mask.dtype != torch.bool or mask.shape != (num_envs,):
        raise ValueError(
            f"options['reset_mask'] must be a bool tensor of shape ({num_envs},), "
            f"got dtype {mask.dtype} and shape {tuple(mask.shape)}"
        )
    return mask


def _wrapper_chain(env: gym.Env) -> list[gym.Env]:
    chain = [env]
    while hasattr(chain[-1], "env"):
        chain.append(chain[-1].env)
    return chain


class GymnasiumVecEnv:
    """Any Gymnasium id as a batch of envs that takes and returns torch tensors on `device`.

    Same-step autoreset (Gymnasium's, or in sync mode the same loop run here) returns the first observation of the
    next episode; the true last observations go into one dense `final_obs` tensor (rows of envs that did not finish
    equal `obs`). The adapter also tracks raw episode statistics, and truncates-and-resets any env whose
    observation or reward stops being finite or exceeds `max_abs_value` in magnitude (a MuJoCo blow-up)
    instead of failing the batch (None: only non-finite values count).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int = 1,
        seed: int = 0,
        device: torch.device | str = "cpu",
        vectorization_mode: str = "sync",
        render_mode: str | None = None,
        max_abs_value: float | None = MAX_ABS_VALUE,
        **env_kwargs,
    ):
        if max_abs_value is not None and not max_abs_value > 0:
            raise ValueError(f"max_abs_value must be positive (or None), got {max_abs_value!r}")
        options = dict(env_kwargs)  # the caller's, for the message below
        if render_mode is not None:
            env_kwargs["render_mode"] = render_mode
        try:
            self.env = gym.make_vec(
                env_id,
                num_envs=num_envs,
                vectorization_mode=vectorization_mode,
                # copy=False: Gymnasium then hands back its own observation buffer instead of a deep copy of it;
                # every step converts it to float32 anyway (a copy), which is all the copying needed
                vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP, "copy": False},
                **env_kwargs,
            )
        except (TypeError, ValueError, OSError, AssertionError) as error:
            # A Gymnasium task checks its options its own way (an xml_file that is not there, a malformed one, a
            # float max_episode_steps): one line that says so. An unknown option is envs.make's to name.
            if not options or "unexpected keyword argument" in str(error):
                raise
            typed = " ".join(f"{key} {value}" for key, value in options.items())
            said = " ".join(str(error).split())  # one line (MuJoCo's XML errors take several)
            raise ValueError(f"{env_id} refused its options ({typed}): {type(error).__name__}: {said}") from None
        self.num_envs = num_envs
        self.single_observation_space = self.env.single_observation_space
        self.single_action_space = self.env.single_action_space
        for name, space in (("observation", self.single_observation_space), ("action", self.single_action_space)):
            if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1 or space.shape[0] == 0:
                self.env.close()
                raise ValueError(
                    f"{env_id} has a {type(space).__name__}{getattr(space, 'shape', '')} {name} space; "
                    "these scripts need flat, non-empty Box observations and continuous (Box) actions"
                )
        self.device = torch_device(device)
        # Arrays become tensors on `device`; on the CPU without a copy (every array passed is a fresh one). Nine per
        # step: with one env this conversion is as costly as the rest of the bookkeeping, hence no extra call layer.
        self._tensor = torch.from_numpy if self.device.type == "cpu" else lambda a: torch.from_numpy(a).to(self.device)
        # A task with a critic observation (the partially observable variants: the base task's whole observation)
        # hands it out in info["critic_obs"]; None: the critic reads the policy's observation.
        # Seconds between two actions (MuJoCo's and classic control's `dt`), for a controller; None if unknown.
        try:
            self.control_dt = float(self.env.get_attr("dt")[0])
        except AttributeError:
            self.control_dt = None
        self.single_critic_observation_space = None
        if "keep" in gym.spec(env_id).kwargs:
            self.single_critic_observation_space = self.env.get_attr("critic_observation_space")[0]
        self._last_critic_obs: np.ndarray | None = None
        self.seed = seed
        self.single_action_space.seed(seed)
        self._action_shape = (num_envs, *self.single_action_space.shape)
        largest = float(np.finfo(np.float64).max)  # without a bound: only inf and NaN exceed it
        self._max_abs = float(max_abs_value) if max_abs_value is not None else largest
        self._max_square_sum = min(self._max_abs, 1e154) ** 2 if max_abs_value is not None else largest
        # Raw episode statistics in numpy: the bookkeeping of a step costs about as much as one torch op on the
        # small tensors of a few envs (EpisodeTracker, in torch, serves the natively batched tasks).
        self.episode_returns = np.zeros(num_envs)
        self.episode_lengths = np.zeros(num_envs, dtype=np.int64)
        self.seeded = False
        self._last_obs: np.ndarray | None = None  # float32, the last observation returned
        self._obs_size = self.single_observation_space.shape[0]
        # Sync mode steps the sub-envs itself (`_step_in_process`); async mode goes through Gymnasium's vector env.
        self._in_process = self.env.envs if isinstance(self.env, gym.vector.SyncVectorEnv) else None

    def reset(self, seed: int | None = None, options: dict | None = None):
        """Resets every env, or only those in `options["reset_mask"]`; the first reset uses the seed of `make`."""
        options = dict(options or {})
        seed = reset_seed(self, seed)
        mask = None
        if "reset_mask" in options:
            mask = as_bool_mask(options["reset_mask"], self.num_envs)
            options["reset_mask"] = mask.numpy()
        obs, reset_info = self.env.reset(seed=seed, options=options or None)
        obs = obs.astype(np.float32)
        critic_obs = reset_info.get("critic_obs")
        if mask is not None and self._last_obs is not None:
            obs = np.where(mask.numpy()[:, None], obs, self._last_obs)
            if critic_obs is not None:
                critic_obs = np.where(mask.numpy()[:, None], critic_obs, self._last_critic_obs)
        self._last_obs, self._last_critic_obs = obs, critic_obs
        cleared = slice(None) if mask is None else mask.numpy()
        self.episode_returns[cleared], self.episode_lengths[cleared] = 0.0, 0
        info = {} if critic_obs is None else {"critic_obs": self._tensor(critic_obs.astype(np.float32))}
        return self._tensor(obs.copy()), info

    def step(self, action: torch.Tensor | np.ndarray):
        """Actions as a (num_envs, action dims) tensor on any device, or a numpy array (`action_space.sample()`)."""
        if isinstance(action, torch.Tensor):
            action = action.numpy(force=True)  # detached, on the CPU
        action = np.asarray(action, dtype=self.single_action_space.dtype)
        if action.shape != self._action_shape:
            raise ValueError(f"action must have shape {self._action_shape} (num_envs, action dims), got {action.shape}")
        if self._in_process is not None:
            obs, reward, terminated, truncated, final_obs, critic_obs, final_critic_obs = self._step_in_process(action)
        else:
            obs, reward, terminated, truncated, info = self.env.step(action)
            obs = obs.astype(np.float32)
            final_obs = obs
            critic_obs = final_critic_obs = info.get("critic_obs")
            if "_final_obs" in info:
                final_obs = obs.copy()
                for i in np.flatnonzero(info["_final_obs"]):
                    final_obs[i] = info["final_obs"][i]
                if critic_obs is not None:
                    final_critic_obs = critic_obs.copy()
                    for i in np.flatnonzero(info["_final_obs"]):
                        final_critic_obs[i] = info["final_info"]["critic_obs"][i]
        any_ended = final_obs is not obs  # only then do episode statistics need clearing

        # A blow-up (a non-finite or absurdly large state or reward) truncates that env and resets it; the batch
        # goes on. One scalar check per step: NaN, inf or any value beyond the bound makes the sum of squares
        # NaN or larger than the bound squared. Only then are the per-env masks computed.
        sim_errors = np.zeros(self.num_envs, dtype=bool)
        # A critic observation counts too: it holds what the policy's hides (a velocity that blew up).
        checked = [obs, final_obs] if final_obs is not obs else [obs]
        if critic_obs is not None:
            checked += [critic_obs, final_critic_obs] if final_critic_obs is not critic_obs else [critic_obs]
        square_sum = sum(float(np.vdot(x, x)) for x in checked) + float(np.vdot(reward, reward))
        if not square_sum <= self._max_square_sum:
            limit = self._max_abs
            sim_errors = (np.abs(reward) <= limit)
            for x in checked:
                sim_errors = sim_errors & (np.abs(x) <= limit).all(axis=1)
            sim_errors = ~sim_errors
            if sim_errors.any():
                any_ended = True
                reward = np.where(sim_errors, 0.0, reward)
                final_obs = np.where(sim_errors[:, None], self._last_obs, final_obs)
                terminated = terminated & ~sim_errors
                truncated = truncated | sim_errors
                reset_obs, reset_critic_obs = self._reset_envs(sim_errors)
                obs = np.where(sim_errors[:, None], reset_obs, obs)
                if critic_obs is not None:
                    final_critic_obs = np.where(sim_errors[:, None], self._last_critic_obs, final_critic_obs)
                    critic_obs = np.where(sim_errors[:, None], reset_critic_obs, critic_obs)
        if final_obs is obs:  # a separate array: the tensor handed out must not alias the one kept below
            final_obs = obs.copy()
        self._last_obs = obs

        done = terminated | truncated
        self.episode_returns += reward
        self.episode_lengths += 1
        ended_returns, ended_lengths = self.episode_returns.astype(np.float32), self.episode_lengths.copy()
        if any_ended:
            self.episode_returns[done], self.episode_lengths[done] = 0.0, 0
        info = {
            "final_obs": self._tensor(final_obs),
            "episode": {"r": self._tensor(ended_returns), "l": self._tensor(ended_lengths), "mask": self._tensor(done)},
            "sim_errors": self._tensor(sim_errors),
        }
        if critic_obs is not None:  # astype copies: the tensors handed out alias neither each other nor the kept one
            self._last_critic_obs = critic_obs
            info["critic_obs"] = self._tensor(critic_obs.astype(np.float32))
            info["final_critic_obs"] = self._tensor(final_critic_obs.astype(np.float32))
        return (self._tensor(obs.copy()), self._tensor(reward.astype(np.float32)), self._tensor(terminated),
                self._tensor(truncated), info)

    def _step_in_process(self, action: np.ndarray):
        """Steps the sub-envs of the sync vector env one after the other with same-step autoreset, as
        `SyncVectorEnv.step` does, writing straight into fresh arrays: Gymnasium's own step (its info dicts,
        concatenation and copies) costs about half a MuJoCo step at one env. Returns float32 observations and final
        observations, float64 rewards, bool terminated and truncated, and the critic's observations and final
        observations (None for a task without them)."""
        obs = np.empty((self.num_envs, self._obs_size), dtype=np.float32)
        critic_space = self.single_critic_observation_space
        critic_obs = None if critic_space is None else np.empty((self.num_envs, *critic_space.shape), np.float32)
        reward = np.empty(self.num_envs)
        terminated = np.empty(self.num_envs, dtype=bool)
        truncated = np.empty(self.num_envs, dtype=bool)
        final_rows = []
        for i, env in enumerate(self._in_process):
            env_obs, reward[i], terminated[i], truncated[i], env_info = env.step(action[i])
            if terminated[i] or truncated[i]:
                final_rows.append((i, env_obs, env_info.get("critic_obs")))
                env_obs, env_info = env.reset()
            obs[i] = env_obs
            if critic_obs is not None:
                critic_obs[i] = env_info["critic_obs"]
        final_obs, final_critic_obs = obs, critic_obs
        if final_rows:
            final_obs = obs.copy()
            final_critic_obs = None if critic_obs is None else critic_obs.copy()
            for i, env_obs, env_critic_obs in final_rows:
                final_obs[i] = env_obs
                if critic_obs is not None:
                    final_critic_obs[i] = env_critic_obs
        return obs, reward, terminated, truncated, final_obs, critic_obs, final_critic_obs

    def _reset_envs(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Resets the envs in `mask`, continuing their RNGs; returns observations and critic observations (None
        for a task without them) whose rows in `mask` are their first ones."""
        if self._in_process is None:
            obs, info = self.env.reset(options={"reset_mask": mask})
            return obs.astype(np.float32), info.get("critic_obs")
        obs = np.zeros((self.num_envs, self._obs_size), dtype=np.float32)
        critic_space = self.single_critic_observation_space
        critic_obs = None if critic_space is None else np.zeros((self.num_envs, *critic_space.shape), np.float32)
        for i in np.flatnonzero(mask):
            obs[i], info = self._in_process[i].reset()
            if critic_obs is not None:
                critic_obs[i] = info["critic_obs"]
        return obs, critic_obs

    def state_dict(self) -> dict:
        """Simulator state, RNGs and time limits of every env, as tensors and ints (for exact resume).

        Covers classic-control tasks (`state`) and MuJoCo tasks (qpos, qvel, act, warm start, time); other
        tasks raise, and a resumed run then starts them from a fresh reset.
        """
        if not isinstance(self.env, gym.vector.SyncVectorEnv):
            raise NotImplementedError("env state is saved for vectorization_mode='sync' only")
        per_env = []
        for env in self.env.envs:
            sim, state = env.unwrapped, {}
            if hasattr(sim, "data") and hasattr(sim.data, "qpos"):  # MuJoCo
                for key in ("qpos", "qvel", "act", "qacc_warmstart"):
                    state[key] = torch.from_numpy(getattr(sim.data, key).copy())
                state["time"] = float(sim.data.time)
            elif isinstance(getattr(sim, "state", None), np.ndarray):  # classic control
                state["state"] = torch.from_numpy(sim.state.copy())
            else:
                raise NotImplementedError(f"no saved-state support for {type(sim).__name__}")
            state["np_random"] = sim.np_random.bit_generator.state
            state["elapsed_steps"] = [getattr(w, "_elapsed_steps", None) for w in _wrapper_chain(env)]
            per_env.append(state)
        return {
            "envs": per_env,
            "last_obs": torch.from_numpy(self._last_obs.copy()),
            **({} if self._last_critic_obs is None
               else {"last_critic_obs": torch.from_numpy(self._last_critic_obs.copy())}),
            "episodes": {"returns": torch.from_numpy(self.episode_returns.copy()),
                         "lengths": torch.from_numpy(self.episode_lengths.copy())},
        }

    def load_state_dict(self, state: dict) -> None:
        for env, saved in zip(self.env.envs, state["envs"], strict=True):
            sim = env.unwrapped
            if "qpos" in saved:
                for key in ("qpos", "qvel", "act", "qacc_warmstart"):
                    getattr(sim.data, key)[:] = saved[key].numpy()
                sim.data.time = saved["time"]
                import mujoco

                mujoco.mj_forward(sim.model, sim.data)
            else:
                sim.state = saved["state"].numpy().copy()
            sim.np_random.bit_generator.state = saved["np_random"]
            for wrapper, steps in zip(_wrapper_chain(env), saved["elapsed_steps"], strict=True):
                if steps is not None:
                    wrapper._elapsed_steps = steps
        self._last_obs = state["last_obs"].numpy().astype(np.float32)
        if "last_critic_obs" in state:
            self._last_critic_obs = state["last_critic_obs"].numpy().astype(np.float32)
        self.episode_returns[:] = state["episodes"]["returns"].numpy()
        self.episode_lengths[:] = state["episodes"]["lengths"].numpy()
        self.seeded = True

    def render(self) -> np.ndarray:
        """The RGB frame of env 0 (make the env with render_mode="rgb_array")."""
        return self.env.render()[0]

    def close(self) -> None:
        self.env.close()
