"""What every natively batched Genesis task shares: one scene holding all `num_envs` robots, stepped as one.

A task subclasses `GenesisVecEnv` and fills in these hooks; this class owns the contract of docs/design.md §3
(same-step autoreset with `final_obs`, raw episode statistics, subset reset, per-env simulator errors,
exact-resume state, headless rendering), so every task keeps it the same way:

    _reset_envs(envs_idx)   new episodes for these envs (pose, commands, targets, the task's counters)
    _apply_action(action)   turn the (clamped) action into actuator commands
    _read_state()           read what the task needs from the simulator (after physics and after resets)
    _read_started_state(envs_idx)  the state after these envs started new episodes, optional (default: read again)
    _evaluate(action)       reward terms and the `terminated` mask from that state
    _observe()              the observation from that state
    _episode_info(ended)    task metrics for the envs whose episode ends on this step (`success`, ...), optional
    _send_commands()        re-send actuator commands that persist between steps (after a restore), optional
    _load_bodies(state)     restore bodies besides `self.robot`, or their drawn dynamics (a resume), optional
    _observe_critic()       the critic's observation from that state, for a task that offers one (it calls
                            `_offer_critic_observation(size)` in its __init__), optional

and lists its own tensors in `STATE` (saved and restored with the simulator's joint state).
"""

from __future__ import annotations

import os
import sys

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from envs.core import EpisodeTracker, as_bool_mask, reset_seed, torch_device

_genesis_backend: str | None = None


def init_genesis(sim_device: str) -> str:
    """Initialises Genesis once per process on "cpu" or "gpu" ("auto": the GPU if CUDA is available)."""
    global _genesis_backend
    if sim_device not in ("cpu", "gpu", "cuda", "auto"):
        raise ValueError(f"sim_device must be 'cpu', 'gpu' or 'auto', got {sim_device!r}")
    if sim_device == "auto":
        sim_device = "gpu" if torch.cuda.is_available() else "cpu"
    sim_device = "gpu" if sim_device == "cuda" else sim_device
    if sim_device == "gpu" and not torch.cuda.is_available():
        raise ValueError("sim_device='gpu' but torch sees no CUDA GPU; use sim_device='cpu'")
    try:  # before Genesis imports Python 3.11's own distutils: torch.compile's builder later imports setuptools,
        import setuptools  # noqa: F401  whose distutils shim then fails on the stdlib one already loaded
    except ImportError:  # Python 3.12 venvs have neither
        pass
    import genesis as gs

    if _genesis_backend is None and not gs._initialized:
        if os.environ.get("GS_ENABLE_NDARRAY") == "0":  # Genesis's performance mode (docs/tasks.md)
            when = ("in performance mode (GS_ENABLE_NDARRAY=0): each new scene compiles its kernels (about 40 s on 2 "
                    "CPU cores), about 24 s from the cache")
        else:
            when = ("the first scene build compiles its kernels (about 80 s on 2 CPU cores); later builds load them "
                    "from the cache (about 7 s)")
        print(f"[envs] Initialising Genesis on the {sim_device.upper()}: {when}.", flush=True)
        gs.init(backend=gs.gpu if sim_device == "gpu" else gs.cpu, precision="32", logging_level="error")
        _genesis_backend = sim_device
    elif _genesis_backend is not None and _genesis_backend != sim_device:
        raise RuntimeError(
            f"Genesis is already initialised on the {_genesis_backend} in this process and cannot switch to the "
            f"{sim_device}; use one sim_device per process"
        )
    return sim_device


def release_genesis() -> None:
    """Destroys Genesis in this process, if it was initialised: the only way to free the native memory of the scenes
    it built, which it keeps after each scene is destroyed (genesis-world#949; measured here: ~45 MiB per 64-env
    FrankaReach-v0 scene, 230-330 MiB per 512-env one). Close every env first: one left open cannot step again.
    The next env initialises Genesis again (about 5 s from the kernel cache on 2 CPU cores)."""
    global _genesis_backend
    gs = sys.modules.get("genesis")
    if gs is not None and gs._initialized:
        gs.destroy()
    _genesis_backend = None


class GenesisVecEnv(gym.vector.VectorEnv):
    """`num_envs` copies of a Genesis task; torch tensors in, torch tensors out (on `device`)."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": ["rgb_array"]}
    STATE: tuple[str, ...] = ()  # the task's own tensors that `state_dict` saves

    def __init__(self, num_envs: int, seed: int, device, sim_device: str, max_episode_steps: int, decimation: int,
                 obs_dim: int, action_bound: float, action_dim: int, stagger_episodes: bool,
                 max_abs_value: float | None, render_mode: str | None):
        for name, value in (("num_envs", num_envs), ("max_episode_steps", max_episode_steps),
                            ("decimation", decimation)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if max_abs_value is not None and not max_abs_value > 0:
            raise ValueError(f"max_abs_value must be positive, got {max_abs_value!r}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.num_envs = num_envs
        self.device = torch_device(device)
        # None: only non-finite values count (inf exceeds the largest float32, NaN compares false)
        self.max_abs_value = max_abs_value if max_abs_value is not None else float(torch.finfo(torch.float32).max)
        self.seed = seed
        self.max_episode_steps = max_episode_steps
        self.decimation = decimation
        self.stagger_episodes = stagger_episodes
        self.render_mode = render_mode
        self.action_bound = action_bound
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.single_action_space = gym.spaces.Box(-action_bound, action_bound, (action_dim,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.single_critic_observation_space = None  # a task with a critic observation sets it (docs/design.md §3)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.single_action_space.seed(seed)

        self.sim_device = init_genesis(sim_device)
        import genesis as gs

        self.generator = torch.Generator(device=gs.device)
        self.episode_step = torch.zeros(num_envs, dtype=torch.int64, device=gs.device)
        self.episodes = EpisodeTracker(num_envs, self.device)
        self.seeded = False
        self.scene = self.camera = None

    def _build(self, scene, camera: dict) -> None:
        """Builds `scene` for all envs, with a camera on env 0 (`camera`: gs add_camera options) if rendering."""
        if self.render_mode == "rgb_array":
            self.camera = scene.add_camera(**camera)
        scene.build(n_envs=self.num_envs)
        self.scene = scene
        self._rigid_solver = scene.sim.rigid_solver

    def _uniform(self, n: int, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        """n draws, uniform between `low` and `high` (tensors of one shape), from the task's seeded generator."""
        u = torch.rand(n, *low.shape, generator=self.generator, device=low.device)
        return low + (high - low) * u

    # ------------------------------------------------------------------ the task's hooks
    def _reset_envs(self, envs_idx: torch.Tensor) -> None:
        raise NotImplementedError

    def _apply_action(self, action: torch.Tensor) -> None:
        raise NotImplementedError

    def _read_state(self) -> None:
        raise NotImplementedError

    def _read_started_state(self, envs_idx: torch.Tensor) -> None:
        """The state once these envs have started new episodes (the others as `_read_state` left them): read
        again here. A task whose episodes start in a state it knows writes that in instead, as Genesis's own
        locomotion example does: a second read is a few dozen small ops, kernels on a GPU, on almost every step."""
        self._read_state()

    def _evaluate(self, action: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        raise NotImplementedError

    def _observe(self) -> torch.Tensor:
        raise NotImplementedError

    def _episode_info(self, ended: torch.Tensor) -> dict:
        return {}

    def _cut_short(self) -> torch.Tensor | None:
        """Envs whose episode the task ends early without a failure of the agent's (truncated, so bootstrapped),
        after `_evaluate`; None: none."""
        return None

    def _observe_critic(self) -> torch.Tensor:
        raise NotImplementedError

    def _offer_critic_observation(self, size: int) -> None:
        """Declares that the task gives a critic `size` numbers of its own (`_observe_critic`) every step."""
        self.single_critic_observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)

    def _observe_both(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The policy's observation and the critic's (None for a task without one)."""
        return self._observe(), self._observe_critic() if self.single_critic_observation_space is not None else None

    # ------------------------------------------------------------------ the contract
    def _start_episodes(self, envs_idx: torch.Tensor) -> None:
        self._reset_envs(envs_idx)
        self.episode_step.index_fill_(0, envs_idx, 0)

    def reset(self, seed: int | None = None, options: dict | None = None):
        """Resets every env, or only those in `options["reset_mask"]`; the first reset uses the seed of `make`."""
        first = not self.seeded
        seed = reset_seed(self, seed)
        if seed is not None:
            self.generator.manual_seed(seed)
            self.single_action_space.seed(seed)
        import genesis as gs

        if options and "reset_mask" in options:
            mask = as_bool_mask(options["reset_mask"], self.num_envs).to(gs.device)
        else:
            mask = torch.ones(self.num_envs, dtype=torch.bool, device=gs.device)
        self._start_episodes(mask.nonzero().squeeze(-1))
        if first and self.stagger_episodes:
            # Like rsl_rl's init_at_random_ep_len: without it every env truncates on the same step and each
            # short rollout sees only one phase of the episode.
            self.episode_step.random_(0, self.max_episode_steps, generator=self.generator)
        self.episodes.clear(mask.to(self.device))
        self._read_state()
        self._last_obs, self._last_critic_obs = self._observe_both()
        info = {} if self._last_critic_obs is None else {"critic_obs": self._last_critic_obs.to(self.device)}
        return self._last_obs.to(self.device), info

    def step(self, action: torch.Tensor | np.ndarray):
        """Actions as a (num_envs, action_dim) tensor on any device, or a numpy array (`action_space.sample()`)."""
        import genesis as gs

        action = torch.as_tensor(action, dtype=torch.float32, device=gs.device)
        shape = (self.num_envs, self.single_action_space.shape[0])
        if action.shape != shape:
            raise ValueError(f"action must have shape {shape}, got {tuple(action.shape)}")
        # Out-of-range actions saturate, as a real actuator command would; keeps every reward term bounded.
        action = action.clamp(-self.action_bound, self.action_bound)
        self._apply_action(action)
        failed = torch.zeros(self.num_envs, dtype=torch.bool, device=gs.device)
        for _ in range(self.decimation):
            self.scene.step()
            # Genesis checks its error flags every few substeps and raises for the whole batch: start new
            # episodes in failed envs right away (clearing Genesis's per-env error flag); they truncate below.
            step_failed = self._rigid_solver.get_error_envs_mask()
            failed_idx = step_failed.nonzero().squeeze(-1)  # a host sync (its length), the substep's only one
            if len(failed_idx):
                self._start_episodes(failed_idx)
                failed |= step_failed

        self.episode_step += 1
        self._read_state()
        terms, terminated = self._evaluate(action)
        obs, critic_obs = self._observe_both()
        failed |= ~(obs.abs() <= self.max_abs_value).all(dim=-1)  # NaN, inf or absurd: a blow-up
        if critic_obs is not None:  # it holds what the policy's may hide (a velocity that blew up)
            failed |= ~(critic_obs.abs() <= self.max_abs_value).all(dim=-1)
        # The terms stacked: one where and one sum for all of them instead of one of each per term (kernels on a GPU)
        stacked = torch.where(failed[:, None], 0.0, torch.stack(tuple(terms.values()), dim=1))
        reward = stacked.sum(dim=1)
        terms = dict(zip(terms, stacked.unbind(1)))
        terminated = terminated & ~failed
        truncated = (self.episode_step >= self.max_episode_steps) | failed
        cut_short = self._cut_short()
        truncated = (truncated if cut_short is None else truncated | cut_short) & ~terminated
        ended = terminated | truncated
        task_info = self._episode_info(ended & ~failed)
        # A failed env's last state is not finite: bootstrap from the observation it acted on instead.
        final_obs = torch.where(failed[:, None], self._last_obs, obs)
        if critic_obs is not None:
            final_critic_obs = torch.where(failed[:, None], self._last_critic_obs, critic_obs)
        ended_idx = ended.nonzero().squeeze(-1)  # the step's other host sync; none elsewhere (docs/tasks.md)
        if len(ended_idx):
            self._start_episodes(ended_idx)
            self._read_started_state(ended_idx)
            obs, critic_obs = self._observe_both()
        self._last_obs, self._last_critic_obs = obs, critic_obs

        out = self.device
        reward, terminated, truncated = reward.to(out), terminated.to(out), truncated.to(out)
        info = {
            "final_obs": final_obs.to(out),
            "episode": self.episodes.update(reward, terminated | truncated),
            "reward_terms": {name: term.to(out) for name, term in terms.items()},
            "sim_errors": failed.to(out),
            **{name: value.to(out) if torch.is_tensor(value) else {k: v.to(out) for k, v in value.items()}
               for name, value in task_info.items()},
        }
        if critic_obs is not None:
            info["critic_obs"], info["final_critic_obs"] = critic_obs.to(out), final_critic_obs.to(out)
        return obs.to(out), reward, terminated, truncated, info

    def state_dict(self) -> dict:
        """Joint state, the task's tensors (`STATE`), counters, the RNG and the simulator's own state (for resuming a
        run), as CPU tensors of its own: later steps leave a saved state as it was."""
        state = {name: getattr(self, name).to("cpu", copy=True) for name in self.STATE}
        return {"qpos": self.robot.get_qpos().cpu(), "dofs_velocity": self.robot.get_dofs_velocity().cpu(),
                "episode_step": self.episode_step.to("cpu", copy=True), "generator": self.generator.get_state(),
                "last_obs": self._last_obs.to("cpu", copy=True), "episodes": self.episodes.state_dict(), **state,
                "simulator": self._simulator_state(),
                **({} if self._last_critic_obs is None
                   else {"last_critic_obs": self._last_critic_obs.to("cpu", copy=True)})}

    def load_state_dict(self, state: dict) -> None:
        """Restores `state_dict()`: the bodies' joints and the task's tensors, then the simulator's own state over
        them, so that a resumed run steps on bit for bit as the uninterrupted one would have. A simulator state from
        another kind of device or another Genesis is left out: the joints alone match to about 1e-7, and a run
        resumed so goes on close to the uninterrupted one, no longer the same (training amplifies the difference)."""
        import genesis as gs

        for name in ("episode_step", *self.STATE):
            getattr(self, name).copy_(state[name])
        self._load_bodies(state)
        saved = state["generator"]
        if saved.numel() == self.generator.get_state().numel():
            self.generator.set_state(saved)
        else:  # another kind of device's generator (a GPU run resumed on the CPU): its stream cannot go on here
            self.generator.manual_seed(int(saved.long().sum()) + len(saved))  # the same seed on every such resume
            print(f"[envs] the saved random state is a {'GPU' if len(saved) < 64 else 'CPU'} generator's: the "
                  "task's draws go on from a seed made of it")
        self._last_obs = state["last_obs"].to(gs.device)
        if "last_critic_obs" in state:
            self._last_critic_obs = state["last_critic_obs"].to(gs.device)
        self.episodes.load_state_dict(state["episodes"])
        self._send_commands()
        self._load_simulator_state(state.get("simulator"))
        self.seeded = True

    def _load_bodies(self, state: dict) -> None:
        """Sets the task's bodies as `state_dict` saved them (after its `STATE` tensors): the robot's joints here; a
        task with more bodies, or with drawn masses and frictions, adds those."""
        import genesis as gs

        self.robot.set_qpos(state["qpos"].to(gs.device), zero_velocity=False)
        self.robot.set_dofs_velocity(state["dofs_velocity"].to(gs.device))

    def _simulator_items(self) -> list:
        """The arrays of Genesis's own state that a resume writes back over the joints (Genesis's checkpoint names
        and kinds): its STATE and INFO (velocities, accelerations, actuator commands, the warm starts of the
        constraint solve and of collision detection, masses and frictions) and, of what it calls DERIVED, the link
        poses and the flags saying whether they are current, which its next step reads before recomputing them.
        Without these a resumed run leaves the uninterrupted one at the seventh digit on its first step."""
        from genesis.utils.array_class import DataKind

        return [item for item in self.scene.sim.data(frozenset(DataKind))
                if item.kind in (DataKind.STATE, DataKind.INFO)
                or item.name.startswith(("RigidSolver.dyn_state.links.", "RigidSolver._is_forward_"))]

    def _simulator_state(self) -> dict:
        """`_simulator_items()` as CPU tensors, with the Genesis version and device kind that wrote them."""
        import genesis as gs
        from genesis.utils.misc import data_to_array

        arrays = {}
        for item in self._simulator_items():
            if hasattr(item, "array"):
                arrays[item.name] = data_to_array(item.array, to_torch=True, copy=True).cpu()
            else:  # a Python scalar of the solver's (a flag)
                arrays[item.name] = torch.tensor(getattr(item.owner, item.attr))
        return {"genesis": gs.__version__, "device": gs.device.type, "arrays": arrays}

    def _load_simulator_state(self, saved: dict | None) -> None:
        """Writes `_simulator_state()` back, or, when another Genesis version or device kind wrote it (its arrays'
        layout may differ though their shapes match) or its arrays do not fit this scene, says so and leaves it."""
        if saved is None:  # a state from before it was saved
            return
        import genesis as gs
        from genesis.utils import array_class

        here = {"genesis": gs.__version__, "device": gs.device.type}
        why = "; ".join(f"{key} {saved[key]} when saved, {value} now" for key, value in here.items()
                        if saved[key] != value)
        items = self._simulator_items()
        values = {name: value.to(gs.device) if gs.use_zerocopy else value.numpy()
                  for name, value in saved["arrays"].items()}
        if not why:
            try:
                array_class.check_data(items, values)
            except gs.GenesisException as error:
                why = str(error).strip().splitlines()[0][:200]
        if why:
            print(f"[envs] the saved simulator state is left out ({why}): the run goes on from the saved joints, "
                  "close to the uninterrupted run, not the same")
            return
        array_class.fill_data(items, values)
        self._rigid_solver._restart()  # forgets the contacts it reported before the state was written over

    def _send_commands(self) -> None:
        """Sends the actuator commands that the task's state implies (after `load_state_dict`); tasks whose
        commands are all sent by `_apply_action` need nothing here."""

    def render(self) -> np.ndarray:
        """RGB frame of env 0 (make the env with render_mode="rgb_array")."""
        if self.camera is None:
            raise RuntimeError('make the env with render_mode="rgb_array" to render it')
        rgb = self.camera.render()[0]
        return np.asarray(rgb[0] if rgb.ndim == 4 else rgb, dtype=np.uint8)

    def close(self, **kwargs) -> None:
        if getattr(self, "scene", None) is not None:
            self.scene.destroy()
            self.scene = None
