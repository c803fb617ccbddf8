"""FrankaReach-v0: a Franka Panda moves its fingertip point to a random target, simulated in Genesis.

Natively batched: one Genesis scene holds all `num_envs` arms (`scene.build(n_envs=N)`), stepped as one.
Registered with `vector_entry_point`, so `gym.make_vec("FrankaReach-v0", num_envs=N)` and
`envs.make("FrankaReach-v0", num_envs=N)` both return this class. The observation, action and reward
tables are in the README ("FrankaReach-v0").

Time: the physics runs at `sim_dt` (0.01 s); each agent step repeats the action for `decimation`
physics steps, so the agent acts every `sim_dt * decimation` seconds (0.02 s by default, 50 Hz) and an
episode of `max_episode_steps` agent steps lasts `max_episode_steps * sim_dt * decimation` seconds.
Raising the decimation makes each decision cover more time (fewer, cheaper decisions per second of
motion, so a larger `gamma` horizon in seconds) and makes `action_scale` a larger change per second.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from envs.core import MAX_ABS_VALUE, EpisodeTracker, as_bool_mask, reset_seed, torch_device

# From Genesis's own Franka examples (examples/tutorials/control_your_robot.py, manipulation examples).
HOME_QPOS = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785, 0.04, 0.04)  # 7 arm joints, 2 fingers (open)
KP = (4500.0, 4500.0, 3500.0, 3500.0, 2000.0, 2000.0, 2000.0, 100.0, 100.0)
KV = (450.0, 450.0, 350.0, 350.0, 200.0, 200.0, 200.0, 10.0, 10.0)
FORCE_LIMIT = (87.0, 87.0, 87.0, 87.0, 12.0, 12.0, 12.0, 100.0, 100.0)
TCP_OFFSET = (0.0, 0.0, 0.1034)  # from the hand link origin to the point between the fingertips (Panda TCP)
NUM_ARM_JOINTS = 7
# How far the arm's joint-velocity penalty can grow, in (rad/s)^2: keeps the term bounded.
JOINT_VELOCITY_SQ_CAP = 100.0

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
    import genesis as gs

    if _genesis_backend is None and not gs._initialized:
        print(
            "[envs] Initialising Genesis on the %s. The first scene build compiles its kernels "
            "(about 80 s on 2 CPU cores); later builds load them from the cache (about 7 s)." % sim_device.upper(),
            flush=True,
        )
        gs.init(backend=gs.gpu if sim_device == "gpu" else gs.cpu, precision="32", logging_level="error")
        _genesis_backend = sim_device
    elif _genesis_backend is not None and _genesis_backend != sim_device:
        raise RuntimeError(
            f"Genesis is already initialised on the {_genesis_backend} in this process and cannot switch to the "
            f"{sim_device}; use one sim_device per process"
        )
    return sim_device


class FrankaReachVecEnv(gym.vector.VectorEnv):
    """`num_envs` Panda arms reaching random targets; torch tensors in, torch tensors out."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": ["rgb_array"]}

    def __init__(
        self,
        num_envs: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
        sim_device: str = "auto",
        max_episode_steps: int = 100,
        decimation: int = 2,
        sim_dt: float = 0.01,
        action_scale: float = 0.05,
        success_threshold: float = 0.02,
        target_low: tuple[float, float, float] = (0.30, -0.25, 0.15),
        target_high: tuple[float, float, float] = (0.60, 0.25, 0.50),
        init_noise: float = 0.1,
        stagger_episodes: bool = True,
        distance_weight: float = 1.0,
        success_bonus: float = 0.5,
        action_rate_weight: float = 0.01,
        joint_velocity_weight: float = 0.001,
        observe_velocities: bool = True,
        max_abs_value: float | None = MAX_ABS_VALUE,
        render_mode: str | None = None,
    ):
        for name, value in (("num_envs", num_envs), ("max_episode_steps", max_episode_steps), ("decimation", decimation)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name, value in (("sim_dt", sim_dt), ("action_scale", action_scale), ("success_threshold", success_threshold),
                            ("max_abs_value", 1.0 if max_abs_value is None else max_abs_value)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.num_envs = num_envs
        self.device = torch_device(device)
        # None: only non-finite values count (inf exceeds the largest float32, NaN compares false)
        self.max_abs_value = max_abs_value if max_abs_value is not None else float(torch.finfo(torch.float32).max)
        self.seed = seed
        self.max_episode_steps = max_episode_steps
        self.decimation = decimation
        self.action_scale = action_scale
        self.success_threshold = success_threshold
        self.init_noise = init_noise
        self.stagger_episodes = stagger_episodes
        self.weights = {
            "distance": distance_weight,
            "success_bonus": success_bonus,
            "action_rate": action_rate_weight,
            "joint_velocity": joint_velocity_weight,
        }
        self.render_mode = render_mode

        # FrankaReachNoVel-v0 drops the joint and end-effector velocities: a policy must infer them from memory.
        self.observe_velocities = observe_velocities
        obs_dim = 3 * NUM_ARM_JOINTS + 12  # q, q̇, previous action; ee pos, ee vel, target, ee→target
        if not observe_velocities:
            obs_dim -= NUM_ARM_JOINTS + 3
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (NUM_ARM_JOINTS,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.single_action_space.seed(seed)

        self.sim_device = init_genesis(sim_device)
        import genesis as gs
        from genesis.utils.geom import transform_by_quat

        self._transform_by_quat = transform_by_quat
        self.scene = gs.Scene(
            sim_options=gs.options.SimOptions(dt=sim_dt),
            rigid_options=gs.options.RigidOptions(constraint_timeconst=max(0.02, 2 * sim_dt)),
            vis_options=gs.options.VisOptions(rendered_envs_idx=[0]),
            show_viewer=False,
        )
        self.scene.add_entity(gs.morphs.Plane())
        self.robot = self.scene.add_entity(gs.morphs.MJCF(file="xml/franka_emika_panda/panda.xml"))
        self.camera = None
        if render_mode == "rgb_array":
            self.camera = self.scene.add_camera(res=(480, 360), pos=(1.4, -1.1, 1.0), lookat=(0.35, 0.0, 0.3), fov=40)
        self.scene.build(n_envs=num_envs)
        self.hand = self.robot.get_link("hand")
        self._rigid_solver = self.scene.sim.rigid_solver

        sim = gs.device
        self.robot.set_dofs_kp(torch.tensor(KP, device=sim))
        self.robot.set_dofs_kv(torch.tensor(KV, device=sim))
        force = torch.tensor(FORCE_LIMIT, device=sim)
        self.robot.set_dofs_force_range(-force, force)
        self.home_qpos = torch.tensor(HOME_QPOS, device=sim)
        lower, upper = self.robot.get_dofs_limit()
        self.arm_lower, self.arm_upper = lower[:NUM_ARM_JOINTS].to(sim), upper[:NUM_ARM_JOINTS].to(sim)
        self.tcp_offset = torch.tensor(TCP_OFFSET, device=sim).expand(num_envs, 3)
        self.target_low = torch.tensor(target_low, device=sim)
        self.target_high = torch.tensor(target_high, device=sim)
        self.generator = torch.Generator(device=sim)

        self.arm_target = torch.zeros(num_envs, NUM_ARM_JOINTS, device=sim)  # integrated joint-position command
        self.prev_action = torch.zeros(num_envs, NUM_ARM_JOINTS, device=sim)
        self.target_pos = torch.zeros(num_envs, 3, device=sim)
        self.episode_step = torch.zeros(num_envs, dtype=torch.int64, device=sim)
        self.episodes = EpisodeTracker(num_envs, self.device)
        self.seeded = False

    # ------------------------------------------------------------------ reset
    def _uniform(self, n: int, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        u = torch.rand(n, low.numel(), generator=self.generator, device=low.device)
        return low + (high - low) * u

    def _reset_envs(self, envs_idx: torch.Tensor) -> None:
        """New episode for the envs at `envs_idx`: home pose plus noise, zero velocity, a fresh target."""
        n = len(envs_idx)
        qpos = self.home_qpos.repeat(n, 1)
        noise = self.init_noise * torch.ones(NUM_ARM_JOINTS, device=qpos.device)
        qpos[:, :NUM_ARM_JOINTS] += self._uniform(n, -noise, noise)
        qpos[:, :NUM_ARM_JOINTS] = qpos[:, :NUM_ARM_JOINTS].clamp(self.arm_lower, self.arm_upper)
        self.robot.set_dofs_position(qpos, envs_idx=envs_idx, zero_velocity=True)
        self.robot.control_dofs_position(qpos, envs_idx=envs_idx)
        self.arm_target[envs_idx] = qpos[:, :NUM_ARM_JOINTS]
        self.prev_action[envs_idx] = 0.0
        self.target_pos[envs_idx] = self._uniform(n, self.target_low, self.target_high)
        self.episode_step[envs_idx] = 0

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
        self._reset_envs(mask.nonzero().squeeze(-1))
        if first and self.stagger_episodes:
            # Like rsl_rl's init_at_random_ep_len: without it every env truncates on the same step and each
            # short rollout sees only one phase of the episode.
            self.episode_step.random_(0, self.max_episode_steps, generator=self.generator)
        self.episodes.clear(mask.to(self.device))
        self._last_obs = self._observe()[0]
        return self._last_obs.to(self.device), {}

    # ------------------------------------------------------------------ step
    def _observe(self):
        q = self.robot.get_dofs_position()[:, :NUM_ARM_JOINTS]
        qd = self.robot.get_dofs_velocity()[:, :NUM_ARM_JOINTS]
        hand_quat = self.hand.get_quat()
        offset = self._transform_by_quat(self.tcp_offset, hand_quat)
        ee_pos = self.hand.get_pos() + offset
        ee_vel = self.hand.get_vel() + torch.cross(self.hand.get_ang(), offset, dim=-1)
        to_target = self.target_pos - ee_pos
        parts = [q - self.home_qpos[:NUM_ARM_JOINTS], qd, ee_pos, ee_vel, self.target_pos, to_target, self.prev_action]
        if not self.observe_velocities:
            del parts[3], parts[1]
        obs = torch.cat(parts, dim=-1)
        return obs, qd, to_target.norm(dim=-1)

    def _send_command(self) -> None:
        """Arm joints track `arm_target`; the fingers are held open."""
        fingers = self.home_qpos[NUM_ARM_JOINTS:].expand(self.num_envs, 2)
        self.robot.control_dofs_position(torch.cat([self.arm_target, fingers], dim=-1))

    def step(self, action: torch.Tensor | np.ndarray):
        """Actions as a (num_envs, 7) tensor on any device, or a numpy array (`action_space.sample()`)."""
        import genesis as gs

        action = torch.as_tensor(action, dtype=torch.float32, device=gs.device)
        if action.shape != (self.num_envs, NUM_ARM_JOINTS):
            raise ValueError(f"action must have shape ({self.num_envs}, {NUM_ARM_JOINTS}), got {tuple(action.shape)}")
        # Out-of-range actions saturate, as a real actuator command would; keeps every reward term bounded.
        action = action.clamp(-1.0, 1.0)
        self.arm_target = (self.arm_target + self.action_scale * action).clamp(self.arm_lower, self.arm_upper)
        self._send_command()

        failed = torch.zeros(self.num_envs, dtype=torch.bool, device=gs.device)
        for _ in range(self.decimation):
            self.scene.step()
            # Genesis checks its error flags every few substeps and raises for the whole batch: clear
            # failed envs right away and truncate them below instead.
            step_failed = self._rigid_solver.get_error_envs_mask()
            if step_failed.any():  # a new episode at once (clearing Genesis's per-env error flag)
                self._reset_envs(step_failed.nonzero().squeeze(-1))
                failed |= step_failed

        action_rate = (action - self.prev_action).square().sum(-1)
        self.prev_action = action  # observed below as the previous action
        obs, qd, distance = self._observe()
        failed |= ~(obs.abs() <= self.max_abs_value).all(dim=-1)  # NaN, inf or absurd: a blow-up
        reached = distance < self.success_threshold
        w = self.weights
        terms = {
            "distance": -w["distance"] * distance,
            "success_bonus": w["success_bonus"] * reached.float(),
            "action_rate": -w["action_rate"] * action_rate,
            "joint_velocity": -w["joint_velocity"] * qd.square().sum(-1).clamp(max=JOINT_VELOCITY_SQ_CAP),
        }
        terms = {name: torch.where(failed, 0.0, term) for name, term in terms.items()}
        reward = sum(terms.values())

        self.episode_step += 1
        truncated = (self.episode_step >= self.max_episode_steps) | failed
        terminated = torch.zeros_like(truncated)  # reaching has no terminal state: the arm must also hold still
        success = truncated & reached & ~failed
        # A failed env's last state is not finite: bootstrap from the observation it acted on instead.
        final_obs = torch.where(failed[:, None], self._last_obs, obs)
        if truncated.any():
            self._reset_envs(truncated.nonzero().squeeze(-1))
            obs = self._observe()[0]
        self._last_obs = obs

        out = self.device
        truncated = truncated.to(out)
        reward = reward.to(out)
        info = {
            "final_obs": final_obs.to(out),
            "episode": self.episodes.update(reward, truncated),
            "success": success.to(out),
            "reward_terms": {name: term.to(out) for name, term in terms.items()},
            "sim_errors": failed.to(out),
        }
        return obs.to(out), reward, terminated.to(out), truncated, info

    def state_dict(self) -> dict:
        """Arm state, commands, targets, counters and the RNG, as tensors (for resuming a run)."""
        return {
            "qpos": self.robot.get_qpos().cpu(),
            "dofs_velocity": self.robot.get_dofs_velocity().cpu(),
            "arm_target": self.arm_target.cpu(),
            "prev_action": self.prev_action.cpu(),
            "target_pos": self.target_pos.cpu(),
            "episode_step": self.episode_step.cpu(),
            "generator": self.generator.get_state(),
            "last_obs": self._last_obs.cpu(),
            "episodes": self.episodes.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restores `state_dict()`. Genesis's solver warm start is not part of it, so a resumed run matches
        an uninterrupted one closely but not bit for bit."""
        import genesis as gs

        self.robot.set_qpos(state["qpos"].to(gs.device), zero_velocity=False)
        self.robot.set_dofs_velocity(state["dofs_velocity"].to(gs.device))
        for name in ("arm_target", "prev_action", "target_pos", "episode_step"):
            getattr(self, name).copy_(state[name])
        self._send_command()
        self.generator.set_state(state["generator"])
        self._last_obs = state["last_obs"].to(gs.device)
        self.episodes.load_state_dict(state["episodes"])
        self.seeded = True

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

