"""Go2Walk-v0: a Unitree Go2 quadruped walks at a commanded velocity on flat ground, simulated in Genesis.

Natively batched like FrankaReach-v0 (one scene, `num_envs` robots; `envs.genesis.GenesisVecEnv` keeps the
contract). What makes it learnable comes from Genesis's own locomotion example (`examples/locomotion/
go2_env.py` and `go2_train.py`): the default pose, PD gains (kp 20, kd 0.5), actions as joint-position offsets
of 0.25 rad per unit around the default pose, 50 Hz control (dt 0.02 s in two substeps), a simulated one-step
action latency (the action sent at step t acts at step t+1, as on the real robot), the observation scales, the
reward terms and weights (each multiplied by dt), termination on roll or pitch beyond 10 degrees, 20-s
episodes (truncated), new commands every 4 s. The tables are in docs/tasks.md ("Go2Walk-v0"); the differences
from the example, and why:

- The observation leads with the base's linear velocity in the body frame (x2, the example's own scale for
  it): the 48 observations of legged_gym and rsl_rl's locomotion tasks, where the example keeps 45. The
  memory variant `Go2WalkNoVel-v0` then hides what a robot without a velocity estimator lacks: the base's
  linear and angular velocity (42 observations), which a policy with memory can infer from its joints.
  `Go2WalkNoVelAll-v0` hides the joint velocities too (30 observations: gravity, commands, joint positions, last
  action): a speed must then come from how the joint positions change over steps, which only memory can see.
- Commands span 0 to 1 m/s forward and -0.5 to 0.5 rad/s of yaw (the example fixes 0.5 m/s forward): with one
  command the "commands" in the observation are a constant and tracking a speed means walking one gait.
- Falling (roll or pitch beyond the limit) terminates; the time limit truncates (the example reports both as
  one `reset`). At an episode's end `info["episode_metrics"]` holds its mean linear-velocity tracking error
  (m/s, in the ground plane), mean yaw-rate error (rad/s) and whether it fell.
"""

from __future__ import annotations

import math

import torch

from envs.core import MAX_ABS_VALUE, check_ranges
from envs.genesis import GenesisVecEnv

# The example's joint order for actions and joint observations (front right leg first), and its default pose.
JOINT_NAMES = ("FR_hip_joint", "FR_thigh_joint", "FR_calf_joint", "FL_hip_joint", "FL_thigh_joint", "FL_calf_joint",
               "RR_hip_joint", "RR_thigh_joint", "RR_calf_joint", "RL_hip_joint", "RL_thigh_joint", "RL_calf_joint")
DEFAULT_JOINT_ANGLES = {"hip": 0.0, "F_thigh": 0.8, "R_thigh": 1.0, "calf": -1.5}
BASE_INIT_POS = (0.0, 0.0, 0.42)
OBS_SCALES = {"lin_vel": 2.0, "ang_vel": 0.25, "dof_pos": 1.0, "dof_vel": 0.05}
NUM_JOINTS = len(JOINT_NAMES)
# The observation's blocks in order, with their widths; the variants leave some out.
OBS_LAYOUT = (("base_lin_vel", 3), ("base_ang_vel", 3), ("projected_gravity", 3), ("commands", 3),
              ("dof_pos", NUM_JOINTS), ("dof_vel", NUM_JOINTS), ("last_action", NUM_JOINTS))
# The lower legs, which carry the feet (Genesis merges the URDF's fixed foot links into them).
FEET = ("FR_calf", "FL_calf", "RR_calf", "RL_calf")
CONTACT_FORCE_N = 1.0  # a foot whose net contact force exceeds this touches the ground


def default_angle(joint: str) -> float:
    leg, part = joint.split("_")[0], joint.split("_")[1]
    return DEFAULT_JOINT_ANGLES[part if part != "thigh" else f"{leg[0]}_thigh"]


class Go2WalkVecEnv(GenesisVecEnv):
    """`num_envs` Go2 robots tracking commanded base velocities; torch tensors in, torch tensors out."""

    STATE = ("commands", "last_action", "lin_vel_error_sum", "ang_vel_error_sum")

    def __init__(
        self,
        num_envs: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
        sim_device: str = "auto",
        max_episode_steps: int = 1000,
        dt: float = 0.02,
        substeps: int = 2,
        kp: float = 20.0,
        kd: float = 0.5,
        action_scale: float = 0.25,
        clip_actions: float = 100.0,
        simulate_action_latency: bool = True,
        lin_vel_x_range: tuple[float, float] = (0.0, 1.0),
        lin_vel_y_range: tuple[float, float] = (0.0, 0.0),
        ang_vel_range: tuple[float, float] = (-0.5, 0.5),
        resampling_time_s: float = 4.0,
        termination_angle_deg: float = 10.0,
        base_height_target: float = 0.3,
        tracking_sigma: float = 0.25,
        tracking_lin_vel_weight: float = 1.0,
        tracking_ang_vel_weight: float = 0.2,
        lin_vel_z_weight: float = 1.0,
        base_height_weight: float = 50.0,
        action_rate_weight: float = 0.005,
        similar_to_default_weight: float = 0.1,
        observe_base_velocity: bool = True,
        observe_joint_velocity: bool = True,
        friction_range: tuple[float, float] = (1.0, 1.0),
        added_mass_range: tuple[float, float] = (0.0, 0.0),
        push_interval_s: float = 0.0,
        max_push_velocity: float = 1.0,
        observation_noise: float = 0.0,
        stagger_episodes: bool = True,
        max_abs_value: float | None = MAX_ABS_VALUE,
        render_mode: str | None = None,
    ):
        for name, value in (("dt", dt), ("action_scale", action_scale), ("clip_actions", clip_actions),
                            ("resampling_time_s", resampling_time_s), ("tracking_sigma", tracking_sigma),
                            ("termination_angle_deg", termination_angle_deg), ("substeps", substeps)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        check_ranges(lin_vel_x_range=lin_vel_x_range, lin_vel_y_range=lin_vel_y_range, ang_vel_range=ang_vel_range,
                     added_mass_range=added_mass_range)
        check_ranges(positive=True, friction_range=friction_range)
        friction_range, added_mass_range = tuple(friction_range), tuple(added_mass_range)  # a list != these tuples
        for name, value in (("push_interval_s", push_interval_s), ("max_push_velocity", max_push_velocity),
                            ("observation_noise", observation_noise)):
            if not value >= 0:
                raise ValueError(f"{name} must be 0 (off) or positive, got {value!r}")
        # Go2WalkNoVel-v0 drops the base's linear and angular velocity (the first 6 entries), Go2WalkNoVelAll-v0
        # the joint velocities as well.
        hidden = ({"base_lin_vel", "base_ang_vel"} if not observe_base_velocity else set()) | (
            {"dof_vel"} if not observe_joint_velocity else set())
        self.observed = tuple(name for name, _ in OBS_LAYOUT if name not in hidden)
        obs_dim = sum(dict(OBS_LAYOUT)[name] for name in self.observed) + self.scan_size
        super().__init__(num_envs, seed, device, sim_device, max_episode_steps, 1, obs_dim, clip_actions,
                         NUM_JOINTS, stagger_episodes, max_abs_value, render_mode)
        self.dt = self.control_dt = dt  # seconds between two actions
        self.observation_names = [f"{name}[{i}]" for name in self.observed for i in range(dict(OBS_LAYOUT)[name])] + [
            f"height_scan[{i}]" for i in range(self.scan_size)]
        self.action_scale = action_scale
        self.simulate_action_latency = simulate_action_latency
        self.resample_steps = max(1, round(resampling_time_s / dt))
        self.max_tilt = math.radians(termination_angle_deg)
        self.base_height_target = base_height_target
        self.tracking_sigma = tracking_sigma
        # The example's reward scales, each multiplied by dt (its `reward_scales[name] *= self.dt`).
        self.weights = {name: weight * dt for name, weight in (
            ("tracking_lin_vel", tracking_lin_vel_weight), ("tracking_ang_vel", tracking_ang_vel_weight),
            ("lin_vel_z", lin_vel_z_weight), ("base_height", base_height_weight),
            ("action_rate", action_rate_weight), ("similar_to_default", similar_to_default_weight))}
        # Domain randomisation (legged_gym's): friction and added base mass drawn per episode, pushes that set
        # every base's horizontal velocity at once every `push_interval_s`, uniform observation noise.
        self.randomise_dynamics = friction_range != (1.0, 1.0) or added_mass_range != (0.0, 0.0)
        self.push_steps = round(push_interval_s / dt) if push_interval_s > 0 else 0
        self.max_push_velocity = max_push_velocity
        self.observation_noise = observation_noise

        import genesis as gs
        from genesis.utils.geom import inv_quat, transform_by_quat

        self._inv_quat, self._transform_by_quat = inv_quat, transform_by_quat
        scene = gs.Scene(
            sim_options=gs.options.SimOptions(dt=dt, substeps=substeps),
            # The example's settings: no self-collision, and few contact pairs (the feet and the ground).
            # Per-env masses need Genesis's per-env link data (a little slower, so only when the mass is drawn).
            rigid_options=gs.options.RigidOptions(enable_self_collision=False, tolerance=1e-5, max_collision_pairs=20,
                                                  batch_links_info=added_mass_range != (0.0, 0.0)),
            vis_options=gs.options.VisOptions(rendered_envs_idx=[0]),
            show_viewer=False,
        )
        self.ground = self._add_ground(scene)
        self.robot = scene.add_entity(gs.morphs.URDF(file="urdf/go2/urdf/go2.urdf", pos=BASE_INIT_POS))
        self._build(scene, dict(res=(480, 360), pos=(1.6, -1.6, 1.0), lookat=(0.0, 0.0, 0.3), fov=40))
        if self.camera is not None:
            self.camera.follow_entity(self.robot, fix_orientation=True)  # the robot walks out of a fixed view

        sim = gs.device
        self.motor_dofs = torch.tensor([self.robot.get_joint(name).dof_start for name in JOINT_NAMES], device=sim)
        self.motor_qs = torch.tensor([self.robot.get_joint(name).q_idx_local for name in JOINT_NAMES], device=sim)
        # The twelve joints are one block of dofs in the URDF's order: targets sent to that block as a range, reordered
        # from the actions' order, reach Genesis as slice writes (a list of dofs makes it write by index, each write
        # of a constant a host-to-device copy on a GPU: two waits per step).
        first_dof = int(self.motor_dofs.min())
        assert sorted(self.motor_dofs.tolist()) == list(range(first_dof, first_dof + NUM_JOINTS)), \
            "the Go2's joints are not one block of dofs in this URDF: send the targets by index (self.motor_dofs)"
        self.joint_dofs = range(first_dof, first_dof + NUM_JOINTS)
        self.to_dof_order = torch.argsort(self.motor_dofs)
        self.feet = torch.tensor([self.robot.get_link(name).idx_local for name in FEET], device=sim)
        self.base_link = self.robot.get_link("base").idx_local
        # The critic's observation: every block, velocities included whatever the policy's hides, which feet
        # touch the ground (legged_gym's and rsl_rl's privileged state), the friction and added mass drawn (where
        # they are), and the height scan (where the task has one, whether or not the policy sees it).
        self._offer_critic_observation(sum(width for _, width in OBS_LAYOUT) + len(FEET)
                                       + 2 * self.randomise_dynamics + self.critic_scan_size)
        self.robot.set_dofs_kp([kp] * NUM_JOINTS, self.motor_dofs)
        self.robot.set_dofs_kv([kd] * NUM_JOINTS, self.motor_dofs)
        self.default_dof_pos = torch.tensor([default_angle(name) for name in JOINT_NAMES], device=sim)
        # The free base joint's position and quaternion, then the joints in the URDF's order.
        urdf_joint_angles = [default_angle(joint.name) for joint in self.robot.joints[1:]]
        self.init_qpos = torch.tensor([*BASE_INIT_POS, 1.0, 0.0, 0.0, 0.0, *urdf_joint_angles], device=sim)
        self.gravity = torch.tensor([0.0, 0.0, -1.0], device=sim).expand(num_envs, 3)
        self.command_low = torch.tensor([lin_vel_x_range[0], lin_vel_y_range[0], ang_vel_range[0]], device=sim)
        self.command_high = torch.tensor([lin_vel_x_range[1], lin_vel_y_range[1], ang_vel_range[1]], device=sim)
        self.command_scale = torch.tensor([OBS_SCALES["lin_vel"]] * 2 + [OBS_SCALES["ang_vel"]], device=sim)

        self.commands = torch.zeros(num_envs, 3, device=sim)  # vx, vy (m/s, body frame), yaw rate (rad/s)
        self.last_action = torch.zeros(num_envs, NUM_JOINTS, device=sim)
        self.lin_vel_error_sum = torch.zeros(num_envs, device=sim)
        self.ang_vel_error_sum = torch.zeros(num_envs, device=sim)
        if self.randomise_dynamics:
            self.dynamics_low = torch.tensor((friction_range[0], added_mass_range[0]), device=sim)
            self.dynamics_high = torch.tensor((friction_range[1], added_mass_range[1]), device=sim)
            self.dynamics = torch.zeros(num_envs, 2, device=sim)  # friction ratio, added base mass (kg)
            self.base_mass = self.robot.get_links_mass([self.base_link])[0].item() if added_mass_range != (
                0.0, 0.0) else None
            self.STATE = (*self.STATE, "dynamics")
        if self.push_steps:
            self.steps_taken = torch.zeros((), dtype=torch.int64)  # on the host: pushes need no device sync
            self.STATE = (*self.STATE, "steps_taken")
        if observation_noise:
            self.noise_scale = observation_noise * self._noise_scales().to(sim)

    # ------------------------------------------------------------------ what the rough-terrain task changes
    scan_size = 0  # height-scan entries at the end of the policy's observation
    critic_scan_size = 0  # and of the critic's

    def _add_ground(self, scene):
        import genesis as gs

        return scene.add_entity(gs.morphs.URDF(file="urdf/plane/plane.urdf", fixed=True))

    def _initial_qpos(self, envs_idx: torch.Tensor) -> torch.Tensor:
        """The pose new episodes start from: the default stance at the start position."""
        return self.init_qpos.expand(len(envs_idx), -1)

    def _read_ground(self) -> None:
        """What the task reads of the ground under the base's pose (`base_pos`, `base_quat`): the base's height
        over it, flat ground at 0 here."""
        self.base_height = self.base_pos[:, 2]

    def _noise_scales(self) -> torch.Tensor:
        """legged_gym's noise per observation entry at observation_noise=1 (times each block's scale)."""
        per_block = {"base_lin_vel": 0.1 * OBS_SCALES["lin_vel"], "base_ang_vel": 0.2 * OBS_SCALES["ang_vel"],
                     "projected_gravity": 0.05, "commands": 0.0, "dof_pos": 0.01 * OBS_SCALES["dof_pos"],
                     "dof_vel": 1.5 * OBS_SCALES["dof_vel"], "last_action": 0.0}
        widths = dict(OBS_LAYOUT)
        return torch.tensor([per_block[name] for name in self.observed for _ in range(widths[name])])

    # ------------------------------------------------------------------ the task's hooks
    def _reset_envs(self, envs_idx: torch.Tensor) -> None:
        """New episode: standing in the default pose at the start position, at rest, with a fresh command."""
        self.start_qpos = self._initial_qpos(envs_idx)  # kept for _read_started_state
        self.robot.set_qpos(self.start_qpos, envs_idx=envs_idx, zero_velocity=True)
        self.commands[envs_idx] = self._uniform(len(envs_idx), self.command_low, self.command_high)
        for zeroed in (self.last_action, self.lin_vel_error_sum, self.ang_vel_error_sum):
            zeroed.index_fill_(0, envs_idx, 0.0)  # not `x[envs_idx] = 0.0`: a host-to-device copy on a GPU
        if self.randomise_dynamics:
            self.dynamics[envs_idx] = self._uniform(len(envs_idx), self.dynamics_low, self.dynamics_high)
            self._send_dynamics(envs_idx)

    def _send_dynamics(self, envs_idx: torch.Tensor) -> None:
        """These envs' friction and added base mass, as drawn. Genesis takes the larger of two bodies' frictions
        for their contact, so the robot's and the ground's are both scaled by the ratio drawn."""
        friction, added_mass = self.dynamics[envs_idx].unbind(-1)
        links = self.robot.n_links
        self.robot.set_friction_ratio(friction[:, None].expand(-1, links), links_idx_local=list(range(links)),
                                      envs_idx=envs_idx)
        self.ground.set_friction_ratio(friction[:, None], links_idx_local=[0], envs_idx=envs_idx)
        if self.base_mass is not None:
            self.robot.set_links_mass((self.base_mass + added_mass)[:, None], links_idx_local=[self.base_link],
                                      envs_idx=envs_idx)

    def _send_commands(self) -> None:
        if self.randomise_dynamics:  # a restored run's draws
            self._send_dynamics(torch.arange(self.num_envs, device=self.dynamics.device))

    def _apply_action(self, action: torch.Tensor) -> None:
        """Joint-position targets `action_scale` rad per unit around the default pose, one step late by default."""
        executed = self.last_action if self.simulate_action_latency else action
        self.action_rate = (action - self.last_action).square().sum(-1)
        self.last_action = action  # observed as the last action
        targets = self.default_dof_pos + self.action_scale * executed
        self.robot.control_dofs_position(targets[:, self.to_dof_order], self.joint_dofs)
        if self.push_steps:
            self.steps_taken += 1
            if int(self.steps_taken) % self.push_steps == 0:  # legged_gym pushes every robot on the same step
                push = torch.rand(self.num_envs, 2, generator=self.generator, device=self.last_action.device) * 2 - 1
                # the free joint's first two dofs: the base's world-frame x and y velocity
                self.robot.set_dofs_velocity(push * self.max_push_velocity, dofs_idx_local=[0, 1])

    def _read_state(self) -> None:
        # Two whole-robot reads and slices of them instead of a getter per quantity (each a handful of small ops,
        # kernels on a GPU): the free joint's position and quaternion lead the joint positions, its linear velocity
        # (world frame) and angular velocity (body frame) lead the joint velocities.
        qpos, dofs_vel = self.robot.get_qpos(), self.robot.get_dofs_velocity()
        self.base_pos = qpos[:, :3]
        self.base_quat = self.robot.get_quat()  # the base link's, as forward kinematics normalised it
        self._read_ground()
        world = torch.stack((dofs_vel[:, :3], self.gravity), dim=1)  # rotated into the body frame in one go
        self.base_lin_vel, self.projected_gravity = self._transform_by_quat(
            world, self._inv_quat(self.base_quat)[:, None]).unbind(1)
        self.base_ang_vel = dofs_vel[:, 3:6]
        self.dof_pos = qpos[:, self.motor_qs]
        self.dof_vel = dofs_vel[:, self.motor_dofs]
        self.link_forces = self.robot.get_links_net_contact_force().norm(dim=-1)  # (envs, links), N

    def _read_started_state(self, envs_idx: torch.Tensor) -> None:
        """New episodes start in the pose `_reset_envs` set, at rest and without contacts (Genesis clears them with
        the pose): written into the state read after the physics, the same values a second read would give."""
        qpos = self.start_qpos
        self.base_pos = self.base_pos.index_copy(0, envs_idx, qpos[:, :3])
        self.base_quat = self.base_quat.index_copy(0, envs_idx, qpos[:, 3:7])
        self._read_ground()
        gravity = self._transform_by_quat(self.gravity[: len(envs_idx)], self._inv_quat(qpos[:, 3:7]))
        self.projected_gravity = self.projected_gravity.index_copy(0, envs_idx, gravity)
        self.dof_pos = self.dof_pos.index_copy(0, envs_idx, qpos[:, self.motor_qs])
        for name in ("base_lin_vel", "base_ang_vel", "dof_vel", "link_forces"):
            setattr(self, name, getattr(self, name).index_fill(0, envs_idx, 0.0))

    def _observe(self) -> torch.Tensor:
        blocks = self._observation_blocks()
        obs = torch.cat([blocks[name] for name in self.observed] + self._scan_blocks(), dim=-1)
        if self.observation_noise:  # the policy's observation only: the critic's stays clean
            obs = obs + self.noise_scale * (2 * torch.rand(obs.shape, generator=self.generator, device=obs.device) - 1)
        return obs

    def _scan_blocks(self) -> list[torch.Tensor]:
        return []

    def _observe_critic(self) -> torch.Tensor:
        blocks = self._observation_blocks()
        contact_force = self.link_forces[:, self.feet]
        extras = [self.dynamics] if self.randomise_dynamics else []
        return torch.cat([*(blocks[name] for name, _ in OBS_LAYOUT), (contact_force > CONTACT_FORCE_N).float(),
                          *extras, *self._critic_scan_blocks()], dim=-1)

    def _critic_scan_blocks(self) -> list[torch.Tensor]:
        return []

    def _observation_blocks(self) -> dict[str, torch.Tensor]:
        return {
            "base_lin_vel": self.base_lin_vel * OBS_SCALES["lin_vel"],
            "base_ang_vel": self.base_ang_vel * OBS_SCALES["ang_vel"],
            "projected_gravity": self.projected_gravity,
            "commands": self.commands * self.command_scale,
            "dof_pos": (self.dof_pos - self.default_dof_pos) * OBS_SCALES["dof_pos"],
            "dof_vel": self.dof_vel * OBS_SCALES["dof_vel"],
            "last_action": self.last_action,
        }

    def _evaluate(self, action: torch.Tensor):
        lin_vel_error_sq = (self.commands[:, :2] - self.base_lin_vel[:, :2]).square().sum(-1)
        ang_vel_error = self.commands[:, 2] - self.base_ang_vel[:, 2]
        w = self.weights
        terms = {
            "tracking_lin_vel": w["tracking_lin_vel"] * torch.exp(-lin_vel_error_sq / self.tracking_sigma),
            "tracking_ang_vel": w["tracking_ang_vel"] * torch.exp(-ang_vel_error.square() / self.tracking_sigma),
            "lin_vel_z": -w["lin_vel_z"] * self.base_lin_vel[:, 2].square(),
            "base_height": -w["base_height"] * (self.base_height - self.base_height_target).square(),
            "action_rate": -w["action_rate"] * self.action_rate,
            "similar_to_default": -w["similar_to_default"] * (self.dof_pos - self.default_dof_pos).abs().sum(-1),
        }
        self.lin_vel_error_sum += lin_vel_error_sq.sqrt()
        self.ang_vel_error_sum += ang_vel_error.abs()
        # The example's roll and pitch (ZYX Euler angles of the base), from the gravity seen in the body frame:
        # g = (sin pitch, -sin roll cos pitch, -cos roll cos pitch).
        g = self.projected_gravity
        roll, pitch = torch.atan2(-g[:, 1], -g[:, 2]), torch.asin((g[:, 0]).clamp(-1.0, 1.0))
        self.fell = (roll.abs() > self.max_tilt) | (pitch.abs() > self.max_tilt)
        # New commands where a resampling period ends, without a host sync (drawn for every env, kept where due).
        due = (self.episode_step % self.resample_steps == 0)[:, None]
        fresh = self._uniform(self.num_envs, self.command_low, self.command_high)
        self.commands = torch.where(due, fresh, self.commands)
        return terms, self.fell

    def _episode_info(self, ended: torch.Tensor) -> dict:
        steps = self.episode_step.clamp(min=1).float()
        return {"episode_metrics": {
            "lin_vel_error": torch.where(ended, self.lin_vel_error_sum / steps, 0.0),
            "ang_vel_error": torch.where(ended, self.ang_vel_error_sum / steps, 0.0),
            "fell": (ended & self.fell).float(),
        }}
