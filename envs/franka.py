"""The Franka Panda tasks' shared arm, and the reaching tasks: the fingertip point moves to a random target.

`FrankaArmVecEnv` is what every Panda task shares: the arm mounted on the table (the plane z = 0, a collision
body), Genesis's gains for it, actions that move the joint-position command, the fingertip point (TCP) and the
camera. `FrankaReach-v0` and its memory variants live here; the cube tasks in `envs.franka_cube`.

Natively batched: one Genesis scene holds all `num_envs` arms (`scene.build(n_envs=N)`), stepped as one.
Registered with `vector_entry_point`, so `gym.make_vec("FrankaReach-v0", num_envs=N)` and
`envs.make("FrankaReach-v0", num_envs=N)` both return this class. The observation, action and reward
tables are in docs/tasks.md ("FrankaReach-v0").

Time: the physics runs at `sim_dt` (0.01 s); each agent step repeats the action for `decimation`
physics steps, so the agent acts every `sim_dt * decimation` seconds (0.02 s by default, 50 Hz) and an
episode of `max_episode_steps` agent steps lasts `max_episode_steps * sim_dt * decimation` seconds.
Raising the decimation makes each decision cover more time (fewer, cheaper decisions per second of
motion, so a larger `gamma` horizon in seconds) and makes `action_scale` a larger change per second.
"""

from __future__ import annotations

import math
import numbers

import torch

from envs.core import MAX_ABS_VALUE
from envs.genesis import GenesisVecEnv

# From Genesis's own Franka examples (examples/tutorials/control_your_robot.py, manipulation examples).
HOME_QPOS = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785, 0.04, 0.04)  # 7 arm joints, 2 fingers (open)
KP = (4500.0, 4500.0, 3500.0, 3500.0, 2000.0, 2000.0, 2000.0, 100.0, 100.0)
KV = (450.0, 450.0, 350.0, 350.0, 200.0, 200.0, 200.0, 10.0, 10.0)
FORCE_LIMIT = (87.0, 87.0, 87.0, 87.0, 12.0, 12.0, 12.0, 100.0, 100.0)
TCP_OFFSET = (0.0, 0.0, 0.1034)  # from the hand link origin to the point between the fingertips (Panda TCP)
NUM_ARM_JOINTS = 7
# FrankaReach-v0's observation: q, q̇, previous action; ee pos, ee vel, target, ee→target
FULL_REACH_OBS = 3 * NUM_ARM_JOINTS + 12
# How far the arm's joint-velocity penalty can grow, in (rad/s)^2: keeps the term bounded.
JOINT_VELOCITY_SQ_CAP = 100.0
FINGERS_OPEN, FINGERS_CLOSED = 0.04, 0.0  # each finger joint's position (m): fully open, fully closed


class FrankaArmVecEnv(GenesisVecEnv):
    """The Panda on its table: scene, gains, joint-delta actions for the 7 arm joints, the TCP state.

    A task adds its objects in `_add_objects`, says where the fingers go in `_finger_command`, and reads the
    arm's state with `_read_arm_state` (q, qd, ee_pos, ee_vel) from its `_read_state`.
    """

    STATE = ("arm_target", "prev_action")
    CAMERA = dict(res=(480, 360), pos=(1.4, -1.1, 1.0), lookat=(0.35, 0.0, 0.3), fov=40)

    def __init__(self, num_envs: int, seed: int, device, sim_device: str, max_episode_steps: int, decimation: int,
                 sim_dt: float, action_scale: float, init_noise: float, obs_dim: int, action_dim: int,
                 stagger_episodes: bool, max_abs_value: float | None, render_mode: str | None, **rigid_options):
        for name, value in (("sim_dt", sim_dt), ("action_scale", action_scale)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        super().__init__(num_envs, seed, device, sim_device, max_episode_steps, decimation, obs_dim, 1.0,
                         action_dim, stagger_episodes, max_abs_value, render_mode)
        self.action_scale = action_scale
        self.init_noise = init_noise
        self.control_dt = sim_dt * decimation  # seconds between two actions

        import genesis as gs
        from genesis.utils.geom import transform_by_quat

        self._transform_by_quat = transform_by_quat
        scene = gs.Scene(
            sim_options=gs.options.SimOptions(dt=sim_dt),
            rigid_options=gs.options.RigidOptions(constraint_timeconst=max(0.02, 2 * sim_dt), **rigid_options),
            vis_options=gs.options.VisOptions(rendered_envs_idx=[0]),
            show_viewer=False,
        )
        self.table = scene.add_entity(gs.morphs.Plane())
        self.robot = scene.add_entity(gs.morphs.MJCF(file="xml/franka_emika_panda/panda.xml"))
        self._add_objects(scene)
        self._build(scene, self.CAMERA)
        self.hand = self.robot.get_link("hand")

        sim = gs.device
        self.robot.set_dofs_kp(torch.tensor(KP, device=sim))
        self.robot.set_dofs_kv(torch.tensor(KV, device=sim))
        force = torch.tensor(FORCE_LIMIT, device=sim)
        self.robot.set_dofs_force_range(-force, force)
        self.home_qpos = torch.tensor(HOME_QPOS, device=sim)
        lower, upper = self.robot.get_dofs_limit()
        self.arm_lower, self.arm_upper = lower[:NUM_ARM_JOINTS].to(sim), upper[:NUM_ARM_JOINTS].to(sim)
        self.tcp_offset = torch.tensor(TCP_OFFSET, device=sim).expand(num_envs, 3)
        self.arm_target = torch.zeros(num_envs, NUM_ARM_JOINTS, device=sim)  # integrated joint-position command
        self.prev_action = torch.zeros(num_envs, action_dim, device=sim)

    def _add_objects(self, scene) -> None:
        """Adds the task's objects to `scene` before it is built."""

    def _finger_command(self) -> torch.Tensor:
        """Each finger joint's position command, (num_envs, 2); held open unless the task says otherwise."""
        return self.home_qpos[NUM_ARM_JOINTS:].expand(self.num_envs, 2)

    def _reset_arm(self, envs_idx: torch.Tensor) -> None:
        """The arm at home plus uniform joint noise of `init_noise` rad, at rest, commanded to stay there."""
        n = len(envs_idx)
        qpos = self.home_qpos.repeat(n, 1)
        noise = self.init_noise * torch.ones(NUM_ARM_JOINTS, device=qpos.device)
        qpos[:, :NUM_ARM_JOINTS] += self._uniform(n, -noise, noise)
        qpos[:, :NUM_ARM_JOINTS] = qpos[:, :NUM_ARM_JOINTS].clamp(self.arm_lower, self.arm_upper)
        qpos[:, NUM_ARM_JOINTS:] = self._finger_command()[envs_idx]
        self.robot.set_qpos(qpos, envs_idx=envs_idx, zero_velocity=True)
        self.robot.control_dofs_position(qpos, envs_idx=envs_idx)
        self.arm_target[envs_idx] = qpos[:, :NUM_ARM_JOINTS]
        self.prev_action.index_fill_(0, envs_idx, 0.0)

    def _apply_action(self, action: torch.Tensor) -> None:
        """The first 7 actions move the joint-position command by up to `action_scale` rad per joint."""
        self.action_rate = (action - self.prev_action).square().sum(-1)
        self.prev_action = action  # observed as the previous action
        self._move_arm(action[:, :NUM_ARM_JOINTS])

    def _move_arm(self, arm_action: torch.Tensor) -> None:
        """Moves the joint-position command by `action_scale` * `arm_action` rad and sends the commands."""
        self.arm_target = (self.arm_target + self.action_scale * arm_action).clamp(self.arm_lower, self.arm_upper)
        self._send_commands()

    def _send_commands(self) -> None:
        """Arm joints track `arm_target`, the fingers `_finger_command()`."""
        self.robot.control_dofs_position(torch.cat([self.arm_target, self._finger_command()], dim=-1))

    def _read_arm_state(self) -> None:
        self.q = self.robot.get_dofs_position()[:, :NUM_ARM_JOINTS]
        self.qd = self.robot.get_dofs_velocity()[:, :NUM_ARM_JOINTS]
        hand_quat = self.hand.get_quat()
        offset = self._transform_by_quat(self.tcp_offset, hand_quat)
        self.ee_pos = self.hand.get_pos() + offset
        self.ee_vel = self.hand.get_vel() + torch.cross(self.hand.get_ang(), offset, dim=-1)

    def _joint_velocity_penalty(self) -> torch.Tensor:
        """Sum of squared arm joint velocities, capped at JOINT_VELOCITY_SQ_CAP (a bounded term)."""
        return self.qd.square().sum(-1).clamp(max=JOINT_VELOCITY_SQ_CAP)


class FrankaReachVecEnv(FrankaArmVecEnv):
    """`num_envs` Panda arms reaching random targets; torch tensors in, torch tensors out."""

    STATE = ("arm_target", "prev_action", "target_pos")
    EXTRA_OBS = 0  # observations a variant appends

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
        still_weight: float = 0.0,
        still_speed_scale: float = 1.0,
        observe_velocities: bool = True,
        max_abs_value: float | None = MAX_ABS_VALUE,
        render_mode: str | None = None,
    ):
        if not success_threshold > 0:
            raise ValueError(f"success_threshold must be positive, got {success_threshold!r}")
        if not still_speed_scale > 0:  # 0 pays a flat bonus inside the ball, a negative scale pays for speed
            raise ValueError(f"still_speed_scale must be positive, got {still_speed_scale!r}")
        for name, corner in (("target_low", target_low), ("target_high", target_high)):
            if not (isinstance(corner, (tuple, list)) and len(corner) == 3 and all(
                    isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) for x in corner)):
                raise ValueError(f"{name} must be 3 finite numbers (x, y, z in metres), got {corner!r}")
        if not all(low <= high for low, high in zip(target_low, target_high)):
            raise ValueError(f"target_low must be at most target_high in each coordinate, got {target_low!r} and "
                             f"{target_high!r}")
        # FrankaReachNoVel-v0 drops the joint and end-effector velocities: a policy must infer them from memory.
        self.observe_velocities = observe_velocities
        obs_dim = FULL_REACH_OBS + self.EXTRA_OBS
        if not observe_velocities:
            obs_dim -= NUM_ARM_JOINTS + 3
        super().__init__(num_envs, seed, device, sim_device, max_episode_steps, decimation, sim_dt, action_scale,
                         init_noise, obs_dim, NUM_ARM_JOINTS, stagger_episodes, max_abs_value, render_mode)
        if not observe_velocities:  # the critic sees FrankaReach-v0's whole observation
            self._offer_critic_observation(FULL_REACH_OBS)
        self.success_threshold = success_threshold
        self.still_speed_scale = still_speed_scale
        self.weights = {
            "distance": distance_weight,
            "success_bonus": success_bonus,
            "action_rate": action_rate_weight,
            "joint_velocity": joint_velocity_weight,
            "still": still_weight,
        }
        import genesis as gs

        self.target_low = torch.tensor(target_low, device=gs.device)
        self.target_high = torch.tensor(target_high, device=gs.device)
        self.target_pos = torch.zeros(num_envs, 3, device=gs.device)

    def _reset_envs(self, envs_idx: torch.Tensor) -> None:
        """New episode for the envs at `envs_idx`: home pose plus noise, zero velocity, a fresh target."""
        self._reset_arm(envs_idx)
        self.target_pos[envs_idx] = self._uniform(len(envs_idx), self.target_low, self.target_high)

    def _read_state(self) -> None:
        self._read_arm_state()
        self.to_target = self.target_pos - self.ee_pos

    def _observe(self) -> torch.Tensor:
        parts = self._observation_parts()
        if not self.observe_velocities:
            del parts[3], parts[1]
        return torch.cat(parts, dim=-1)

    def _observation_parts(self) -> list[torch.Tensor]:
        return [self.q - self.home_qpos[:NUM_ARM_JOINTS], self.qd, self.ee_pos, self.ee_vel, self.target_pos,
                self.to_target, self.prev_action]

    def _observe_critic(self) -> torch.Tensor:
        """FrankaReach-v0's observation, velocities and target always seen, whatever the policy's hides."""
        return torch.cat(self._observation_parts(), dim=-1)

    def _evaluate(self, action: torch.Tensor):
        distance = self.to_target.norm(dim=-1)
        self.reached = distance < self.success_threshold
        w = self.weights
        terms = {
            "distance": -w["distance"] * distance,
            "success_bonus": w["success_bonus"] * self.reached.float(),
            "action_rate": -w["action_rate"] * self.action_rate,
            "joint_velocity": -w["joint_velocity"] * self._joint_velocity_penalty(),
            # Paid only inside the ball, for coming to rest there: the joint-velocity term charges all motion alike,
            # and a policy can keep the joints turning at the target. The picking task's `still` term,
            # 1 - tanh(k |q'|) (ManiSkill3's static reward has k = 5): the smaller k, the more it pays for slowing
            # from a higher speed. Reported only when weighted.
            **({"still": w["still"] * (1.0 - torch.tanh(self.still_speed_scale * self.qd.norm(dim=-1)))
                * self.reached.float()} if w["still"] else {}),
        }
        return terms, torch.zeros_like(self.reached)  # reaching has no terminal state: the arm must also hold still

    def _episode_info(self, ended: torch.Tensor) -> dict:
        """Success: the fingertip point within `success_threshold` of the target when the episode ends."""
        return {"success": ended & self.reached}


class FrankaReachCueVecEnv(FrankaReachVecEnv):
    """FrankaReach-v0 with occluded perception: the target is seen only in an episode's first `cue_steps`
    observations (then zeros, and a "visible" flag of 0), so reaching it means remembering where it was.

    The observation is FrankaReach-v0's with the target and the fingertip-to-target vector zeroed while hidden,
    and the flag appended (34 numbers). A memoryless policy can only aim at where targets are on average.
    """

    STATE = (*FrankaReachVecEnv.STATE, "episode_age")
    EXTRA_OBS = 1

    def __init__(self, *args, cue_steps: int = 5, **kwargs):
        if not isinstance(cue_steps, int) or cue_steps < 1:
            raise ValueError(f"cue_steps must be a positive integer, got {cue_steps!r}")
        self.cue_steps = cue_steps
        super().__init__(*args, **kwargs)
        self._offer_critic_observation(FULL_REACH_OBS)  # the target, seen at every step
        # Steps since the episode began; not episode_step, which starts staggered in the first episodes.
        self.episode_age = torch.zeros(self.num_envs, dtype=torch.int64, device=self.target_pos.device)

    def _reset_envs(self, envs_idx: torch.Tensor) -> None:
        super()._reset_envs(envs_idx)
        self.episode_age.index_fill_(0, envs_idx, 0)

    def _apply_action(self, action: torch.Tensor) -> None:
        super()._apply_action(action)
        self.episode_age += 1

    def _observe(self) -> torch.Tensor:
        visible = (self.episode_age < self.cue_steps).float()[:, None]
        obs = super()._observe()
        target = obs.shape[-1] - NUM_ARM_JOINTS - 6  # target (3) and ee→target (3) come just before prev_action
        obs[:, target:target + 6] *= visible
        return torch.cat([obs, visible], dim=-1)


class FrankaReachDelayVecEnv(FrankaReachVecEnv):
    """FrankaReach-v0 with an unobserved actuation delay: each episode draws a delay of `min_action_delay` to
    `max_action_delay` agent steps (uniformly), and the arm moves by the action sent that many steps earlier.

    The observation is FrankaReach-v0's (its previous action is the one the policy sent, not the one that moved the
    arm), so a policy learns the delay, and which of its actions are still on their way, only from how the arm
    answered its earlier actions. A memoryless policy can only act for every delay at once; the critic may read the
    delay and the actions in flight (`--privileged-critic`). Real controllers lag by tens of milliseconds; the
    default, 0-3 steps of 0.02 s, is 0-60 ms.
    """

    STATE = (*FrankaReachVecEnv.STATE, "action_delay", "actions_in_flight")

    def __init__(self, *args, min_action_delay: int = 0, max_action_delay: int = 3, **kwargs):
        for name, value in (("min_action_delay", min_action_delay), ("max_action_delay", max_action_delay)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer (agent steps), got {value!r}")
        if min_action_delay > max_action_delay:
            raise ValueError(f"min_action_delay must be at most max_action_delay, got {min_action_delay} and "
                             f"{max_action_delay}")
        self.min_action_delay, self.max_action_delay = min_action_delay, max_action_delay
        super().__init__(*args, **kwargs)
        self._offer_critic_observation(FULL_REACH_OBS + 1 + max_action_delay * NUM_ARM_JOINTS)
        sim = self.target_pos.device
        self.action_delay = torch.zeros(self.num_envs, dtype=torch.int64, device=sim)
        # The arm actions sent in the last `max_action_delay` steps, the newest first; those older than an env's
        # delay have moved its arm, the rest are still on their way.
        self.actions_in_flight = torch.zeros(self.num_envs, max_action_delay, NUM_ARM_JOINTS, device=sim)
        self._rows = torch.arange(self.num_envs, device=sim)
        self._slots = torch.arange(max_action_delay, device=sim)  # each in-flight slot's age, for the critic's mask

    def _reset_envs(self, envs_idx: torch.Tensor) -> None:
        super()._reset_envs(envs_idx)
        self.action_delay[envs_idx] = torch.randint(self.min_action_delay, self.max_action_delay + 1,
                                                    (len(envs_idx),), generator=self.generator, device=envs_idx.device)
        self.actions_in_flight.index_fill_(0, envs_idx, 0.0)  # a new episode has nothing sent: the arm holds still

    def _move_arm(self, arm_action: torch.Tensor) -> None:
        """Moves the arm by the action sent `action_delay` steps ago (this one when the delay is 0)."""
        sent = torch.cat([arm_action[:, None], self.actions_in_flight], dim=1)  # newest first
        self.actions_in_flight = sent[:, :self.max_action_delay]
        super()._move_arm(sent[self._rows, self.action_delay])

    def _observe_critic(self) -> torch.Tensor:
        """FrankaReach-v0's observation, the delay in steps and the actions in flight (zeros past the delay)."""
        in_flight = self.actions_in_flight * (self._slots < self.action_delay[:, None])[..., None]
        return torch.cat([*self._observation_parts(), self.action_delay[:, None].float(), in_flight.flatten(1)],
                         dim=-1)
