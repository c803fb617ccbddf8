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
# How far the arm's joint-velocity penalty can grow, in (rad/s)^2: keeps the term bounded.
JOINT_VELOCITY_SQ_CAP = 100.0

class FrankaReachVecEnv(GenesisVecEnv):
    """`num_envs` Panda arms reaching random targets; torch tensors in, torch tensors out."""

    STATE = ("arm_target", "prev_action", "target_pos")

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
        for name, value in (("sim_dt", sim_dt), ("action_scale", action_scale), ("success_threshold", success_threshold)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        # FrankaReachNoVel-v0 drops the joint and end-effector velocities: a policy must infer them from memory.
        self.observe_velocities = observe_velocities
        obs_dim = 3 * NUM_ARM_JOINTS + 12  # q, q̇, previous action; ee pos, ee vel, target, ee→target
        if not observe_velocities:
            obs_dim -= NUM_ARM_JOINTS + 3
        super().__init__(num_envs, seed, device, sim_device, max_episode_steps, decimation, obs_dim, 1.0,
                         NUM_ARM_JOINTS, stagger_episodes, max_abs_value, render_mode)
        self.action_scale = action_scale
        self.success_threshold = success_threshold
        self.init_noise = init_noise
        self.weights = {
            "distance": distance_weight,
            "success_bonus": success_bonus,
            "action_rate": action_rate_weight,
            "joint_velocity": joint_velocity_weight,
        }

        import genesis as gs
        from genesis.utils.geom import transform_by_quat

        self._transform_by_quat = transform_by_quat
        scene = gs.Scene(
            sim_options=gs.options.SimOptions(dt=sim_dt),
            rigid_options=gs.options.RigidOptions(constraint_timeconst=max(0.02, 2 * sim_dt)),
            vis_options=gs.options.VisOptions(rendered_envs_idx=[0]),
            show_viewer=False,
        )
        scene.add_entity(gs.morphs.Plane())
        self.robot = scene.add_entity(gs.morphs.MJCF(file="xml/franka_emika_panda/panda.xml"))
        self._build(scene, dict(res=(480, 360), pos=(1.4, -1.1, 1.0), lookat=(0.35, 0.0, 0.3), fov=40))
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
        self.target_low = torch.tensor(target_low, device=sim)
        self.target_high = torch.tensor(target_high, device=sim)

        self.arm_target = torch.zeros(num_envs, NUM_ARM_JOINTS, device=sim)  # integrated joint-position command
        self.prev_action = torch.zeros(num_envs, NUM_ARM_JOINTS, device=sim)
        self.target_pos = torch.zeros(num_envs, 3, device=sim)

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

    def _apply_action(self, action: torch.Tensor) -> None:
        """Each action moves the joint-position command by up to `action_scale` rad per joint."""
        self.action_rate = (action - self.prev_action).square().sum(-1)
        self.prev_action = action  # observed as the previous action
        self.arm_target = (self.arm_target + self.action_scale * action).clamp(self.arm_lower, self.arm_upper)
        self._send_commands()

    def _send_commands(self) -> None:
        """Arm joints track `arm_target`; the fingers are held open."""
        fingers = self.home_qpos[NUM_ARM_JOINTS:].expand(self.num_envs, 2)
        self.robot.control_dofs_position(torch.cat([self.arm_target, fingers], dim=-1))

    def _read_state(self) -> None:
        self.q = self.robot.get_dofs_position()[:, :NUM_ARM_JOINTS]
        self.qd = self.robot.get_dofs_velocity()[:, :NUM_ARM_JOINTS]
        hand_quat = self.hand.get_quat()
        offset = self._transform_by_quat(self.tcp_offset, hand_quat)
        self.ee_pos = self.hand.get_pos() + offset
        self.ee_vel = self.hand.get_vel() + torch.cross(self.hand.get_ang(), offset, dim=-1)
        self.to_target = self.target_pos - self.ee_pos

    def _observe(self) -> torch.Tensor:
        parts = [self.q - self.home_qpos[:NUM_ARM_JOINTS], self.qd, self.ee_pos, self.ee_vel, self.target_pos,
                 self.to_target, self.prev_action]
        if not self.observe_velocities:
            del parts[3], parts[1]
        return torch.cat(parts, dim=-1)

    def _evaluate(self, action: torch.Tensor):
        distance = self.to_target.norm(dim=-1)
        self.reached = distance < self.success_threshold
        w = self.weights
        terms = {
            "distance": -w["distance"] * distance,
            "success_bonus": w["success_bonus"] * self.reached.float(),
            "action_rate": -w["action_rate"] * self.action_rate,
            "joint_velocity": -w["joint_velocity"] * self.qd.square().sum(-1).clamp(max=JOINT_VELOCITY_SQ_CAP),
        }
        return terms, torch.zeros_like(self.reached)  # reaching has no terminal state: the arm must also hold still

    def _episode_info(self, ended: torch.Tensor) -> dict:
        """Success: the fingertip point within `success_threshold` of the target when the episode ends."""
        return {"success": ended & self.reached}
