"""The Panda and a 4-cm cube on its table, simulated in Genesis: push it to a goal, or pick it up and hold it.

Natively batched like FrankaReach-v0 (the arm, its gains, joint-delta actions and the TCP come from
`envs.franka.FrankaArmVecEnv`). The table is the plane z = 0 the arm stands on (as ManiSkill3's table scene,
whose robot base sits on the table top) and a collision body: arm links other than the fingers touching it
are penalised by a bounded term of their own. The tables of observations, actions and rewards are in docs/tasks.md.

- `FrankaPushCube-v0` (as ManiSkill3's PushCube-v1): fingers closed, push the cube into a goal region of
  radius 0.1 m, 0.2 m further from the base. Staged dense reward: reach the point behind the cube (on the
  line from the cube to the goal), then, while there, the cube's distance to the goal, then a bonus while the
  cube is inside the region.
- `FrankaPushCubeRandom-v0`: the same with the cube's mass and the cube's and table's friction drawn per
  episode from wide ranges and not observed: how far the cube slides for a push must be inferred from how it
  moved in the recent past, which a policy with memory can do and a memoryless one cannot.
- `FrankaPickCube-v0` (as ManiSkill3's PickCube-v1 and Isaac Lab's lift): an 8th action drives the gripper
  (-1 closed, +1 open); grasp the cube, lift it to a goal point in the air and hold it there with the arm
  nearly still.
- `FrankaStackCube-v0` (as ManiSkill3's StackCube-v1): two cubes; grasp A, place it on B and let go, A resting
  there still. ManiSkill3's staged reward (reach A; grasped: carry A above B; A on B: open and keep A still;
  solved), normalised by the top stage's value, and the highest stage each episode reached as a metric.
- `FrankaStackCubeRandom-v0`: the same with both cubes' masses and the cubes' and table's frictions drawn per
  episode, unobserved by the policy and offered to the critic.

Every reward term is bounded and monotone in what it measures and is reported in `info["reward_terms"]`.
At an episode's end `info["success"]` says whether the task is solved on its last step, and
`info["episode_metrics"]["success_once"]` whether it was solved on any step.
"""

from __future__ import annotations

import torch

from envs.core import MAX_ABS_VALUE, check_ranges
from envs.franka import FINGERS_CLOSED, FINGERS_OPEN, NUM_ARM_JOINTS, FrankaArmVecEnv

CUBE_HALF_SIZE = 0.02  # m (ManiSkill3's cubes are 4 cm)
# Net contact force (N) on arm links at which the table-contact penalty saturates: bounded, 0 without contact.
TABLE_FORCE_SCALE = 10.0


def closeness(distance: torch.Tensor) -> torch.Tensor:
    """1 at distance 0, falling to 0 with distance (ManiSkill3's 1 - tanh(5 d)): bounded and monotone."""
    return 1.0 - torch.tanh(5.0 * distance)


class FrankaCubeVecEnv(FrankaArmVecEnv):
    """What the cube tasks share: the cube, where it starts, the table-contact penalty and success reporting."""

    STATE = ("arm_target", "prev_action", "goal_pos", "solved_once")
    CAMERA = dict(res=(480, 360), pos=(1.6, -1.2, 1.1), lookat=(0.5, 0.0, 0.2), fov=40)  # arm, cube and goal

    def __init__(self, num_envs, seed, device, sim_device, max_episode_steps, decimation, sim_dt, action_scale,
                 init_noise, obs_dim, action_dim, stagger_episodes, max_abs_value, render_mode,
                 cube_x_range, cube_y_range, table_contact_weight, action_rate_weight, **rigid_options):
        check_ranges(cube_x_range=cube_x_range, cube_y_range=cube_y_range)
        super().__init__(num_envs, seed, device, sim_device, max_episode_steps, decimation, sim_dt, action_scale,
                         init_noise, obs_dim, action_dim, stagger_episodes, max_abs_value, render_mode,
                         **rigid_options)
        import genesis as gs

        sim = gs.device
        self.cube_low = torch.tensor((cube_x_range[0], cube_y_range[0], CUBE_HALF_SIZE), device=sim)
        self.cube_high = torch.tensor((cube_x_range[1], cube_y_range[1], CUBE_HALF_SIZE), device=sim)
        self.goal_pos = torch.zeros(num_envs, 3, device=sim)
        self.solved_once = torch.zeros(num_envs, dtype=torch.bool, device=sim)
        self.upright = torch.tensor((1.0, 0.0, 0.0, 0.0), device=sim)  # made once: no host-to-device copy per reset
        self.table_contact_weight = table_contact_weight
        self.action_rate_weight = action_rate_weight
        # The links whose touching the table is penalised (global indices): all but the fingers and the base,
        # which is bolted to it.
        self._penalised_links = torch.tensor(
            [link.idx for link in self.robot.links[1:] if "finger" not in link.name], device=sim, dtype=torch.int32)

    def _add_objects(self, scene) -> None:
        import genesis as gs

        self.cube = scene.add_entity(
            gs.morphs.Box(size=(2 * CUBE_HALF_SIZE,) * 3, pos=(0.5, 0.0, CUBE_HALF_SIZE)),
            surface=gs.surfaces.Default(color=(0.85, 0.15, 0.1)),
        )

    def _reset_cube(self, envs_idx: torch.Tensor) -> torch.Tensor:
        """The cube at rest on the table, upright, at a uniform position in the cube ranges; returns it."""
        pos = self._uniform(len(envs_idx), self.cube_low, self.cube_high)
        self._place(self.cube, pos, envs_idx)
        self.solved_once.index_fill_(0, envs_idx, False)
        return pos

    def _place(self, body, pos: torch.Tensor, envs_idx: torch.Tensor) -> None:
        """`body` upright and at rest at `pos` (one row per env of `envs_idx`)."""
        body.set_pos(pos, envs_idx=envs_idx, skip_forward=True)
        body.set_quat(self.upright.expand(len(envs_idx), 4), envs_idx=envs_idx, zero_velocity=True)

    # ---------------------------------------------------------- dynamics drawn per episode, hidden from the policy
    def _randomise_dynamics(self, ranges: dict[str, tuple[float, float]]) -> None:
        """Draw each named quantity per episode, uniform in its range (`<body>_mass` in kg, `<body>_friction` a
        friction multiplier, `<body>` an attribute: cube, cube_b, table); the policy does not see them, the critic
        sees them after the policy's observation. Call at the end of __init__, with `batch_links_info` passed to
        the scene (per-env masses need Genesis's per-env link data)."""
        sim = self.goal_pos.device
        self.dynamics_names = tuple(ranges)
        self.dynamics_low = torch.tensor([low for low, _ in ranges.values()], device=sim)
        self.dynamics_high = torch.tensor([high for _, high in ranges.values()], device=sim)
        self.dynamics = torch.zeros(self.num_envs, len(ranges), device=sim)
        self.STATE = (*self.STATE, "dynamics")
        self._offer_critic_observation(self.single_observation_space.shape[0] + len(ranges))

    def _draw_dynamics(self, envs_idx: torch.Tensor) -> None:
        if getattr(self, "dynamics_names", None):
            self.dynamics[envs_idx] = self._uniform(len(envs_idx), self.dynamics_low, self.dynamics_high)
            self._send_dynamics(envs_idx)

    def _send_dynamics(self, envs_idx: torch.Tensor) -> None:
        """The drawn masses and frictions of these envs, to the simulator. Genesis takes the larger of two bodies'
        frictions for their contact, so a cube slides on the table with the larger of the two draws."""
        drawn = self.dynamics[envs_idx]
        for column, name in enumerate(self.dynamics_names):
            body, quantity = name.rsplit("_", 1)
            value = drawn[:, column:column + 1]
            if quantity == "mass":
                getattr(self, body).set_links_mass(value, envs_idx=envs_idx)
            else:
                getattr(self, body).set_friction_ratio(value, links_idx_local=[0], envs_idx=envs_idx)

    def _observe_critic(self) -> torch.Tensor:
        return torch.cat([self._observe(), self.dynamics], dim=-1)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "cube_qpos": self.cube.get_qpos().cpu(),
                "cube_dofs_velocity": self.cube.get_dofs_velocity().cpu()}

    def _load_bodies(self, state: dict) -> None:
        import genesis as gs

        super()._load_bodies(state)
        self.cube.set_qpos(state["cube_qpos"].to(gs.device), zero_velocity=False)
        self.cube.set_dofs_velocity(state["cube_dofs_velocity"].to(gs.device))
        if getattr(self, "dynamics_names", None):  # the restored draws
            self._send_dynamics(torch.arange(self.num_envs, device=self.dynamics.device))

    def _read_cube_state(self) -> None:
        self._read_arm_state()
        self.cube_pos = self.cube.get_pos()
        self.cube_quat = self.cube.get_quat()
        self.cube_vel = self.cube.get_vel()

    def _table_contact(self) -> torch.Tensor:
        """In [0, 1]: the contact force between the table and the arm's links (fingers excepted), over
        TABLE_FORCE_SCALE, saturated."""
        contacts = self.robot.get_contacts(with_entity=self.table)  # (num_envs, contacts) per key
        robot_link = torch.where(contacts["link_a"] == self.table.base_link.idx, contacts["link_b"], contacts["link_a"])
        penalised = contacts["valid_mask"] & torch.isin(robot_link, self._penalised_links)
        force = (contacts["force_a"].norm(dim=-1) * penalised).sum(-1)
        return (force / TABLE_FORCE_SCALE).clamp(max=1.0)

    def _common_terms(self) -> dict[str, torch.Tensor]:
        return {
            "table_contact": -self.table_contact_weight * self._table_contact(),
            "action_rate": -self.action_rate_weight * self.action_rate,
        }

    def _episode_info(self, ended: torch.Tensor) -> dict:
        """Success on the episode's last step, and on any step of it (`success_once`)."""
        self.solved_once |= self.solved
        return {"success": ended & self.solved,
                "episode_metrics": {"success_once": (ended & self.solved_once).float()}}


class FrankaPushCubeVecEnv(FrankaCubeVecEnv):
    """`num_envs` Pandas pushing a cube into a goal region on the table; torch tensors in, torch tensors out."""

    STATE = (*FrankaCubeVecEnv.STATE, "push_dir")

    def __init__(
        self,
        num_envs: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
        sim_device: str = "auto",
        max_episode_steps: int = 50,
        decimation: int = 5,
        sim_dt: float = 0.01,
        action_scale: float = 0.1,
        init_noise: float = 0.05,
        cube_x_range: tuple[float, float] = (0.4, 0.6),
        cube_y_range: tuple[float, float] = (-0.1, 0.1),
        goal_offset_x: float = 0.2,
        goal_y_range: tuple[float, float] = (-0.1, 0.1),
        goal_radius: float = 0.1,
        reach_gate: float = 0.02,
        reach_weight: float = 1.0,
        push_weight: float = 1.0,
        success_weight: float = 1.0,
        table_contact_weight: float = 0.5,
        action_rate_weight: float = 0.01,
        randomise_dynamics: bool = False,
        cube_mass_range: tuple[float, float] = (0.05, 1.0),
        cube_friction_range: tuple[float, float] = (0.05, 1.0),
        table_friction_range: tuple[float, float] = (0.05, 1.0),
        stagger_episodes: bool = True,
        max_abs_value: float | None = MAX_ABS_VALUE,
        render_mode: str | None = None,
    ):
        if not goal_radius > 0:
            raise ValueError(f"goal_radius must be positive, got {goal_radius!r}")
        check_ranges(goal_y_range=goal_y_range)
        check_ranges(positive=True, cube_mass_range=cube_mass_range, cube_friction_range=cube_friction_range,
                     table_friction_range=table_friction_range)
        self.goal_offset_x, self.goal_radius, self.reach_gate = goal_offset_x, goal_radius, reach_gate
        self.weights = {"reach": reach_weight, "push": push_weight, "success": success_weight}
        obs_dim = 3 * NUM_ARM_JOINTS + 6 + 10 + 2 + 3 + 2
        # Per-env masses need Genesis's per-env link data (a little slower, so only for the randomised task).
        super().__init__(num_envs, seed, device, sim_device, max_episode_steps, decimation, sim_dt, action_scale,
                         init_noise, obs_dim, NUM_ARM_JOINTS, stagger_episodes, max_abs_value, render_mode,
                         cube_x_range, cube_y_range, table_contact_weight, action_rate_weight,
                         **({"batch_links_info": True} if randomise_dynamics else {}))
        import genesis as gs

        sim = gs.device
        self.goal_y_range = torch.tensor(goal_y_range, device=sim)
        self.push_dir = torch.zeros(num_envs, 2, device=sim)  # unit vector from the cube's start to the goal
        if randomise_dynamics:
            self._randomise_dynamics({"cube_mass": cube_mass_range, "cube_friction": cube_friction_range,
                                      "table_friction": table_friction_range})

    def _add_objects(self, scene) -> None:
        super()._add_objects(scene)
        import genesis as gs

        if self.render_mode == "rgb_array":  # the goal region, drawn only (no collision, no mass)
            self.goal_marker = scene.add_entity(
                gs.morphs.Cylinder(radius=self.goal_radius, height=0.002, pos=(0.7, 0.0, 0.001), fixed=True,
                                   collision=False),
                surface=gs.surfaces.Default(color=(0.1, 0.7, 0.2)),
            )

    def _finger_command(self) -> torch.Tensor:
        """Fingers held closed: the gripper is a pusher."""
        return torch.full((self.num_envs, 2), FINGERS_CLOSED, device=self.goal_pos.device)

    def _reset_envs(self, envs_idx: torch.Tensor) -> None:
        """Arm home plus noise, cube at rest at a random spot, goal `goal_offset_x` further out, y random."""
        self._reset_arm(envs_idx)
        cube = self._reset_cube(envs_idx)
        n = len(envs_idx)
        goal = cube.clone()
        goal[:, 0] += self.goal_offset_x
        goal[:, 1] = self._uniform(n, self.goal_y_range[:1], self.goal_y_range[1:]).squeeze(-1)
        goal[:, 2].zero_()
        self.goal_pos[envs_idx] = goal
        to_goal = goal[:, :2] - cube[:, :2]
        self.push_dir[envs_idx] = to_goal / to_goal.norm(dim=-1, keepdim=True)
        self._draw_dynamics(envs_idx)
        if getattr(self, "goal_marker", None) is not None:
            self.goal_marker.set_pos(goal + torch.tensor((0.0, 0.0, 0.001), device=goal.device), envs_idx=envs_idx)

    def _read_state(self) -> None:
        self._read_cube_state()
        behind = self.cube_pos.clone()
        behind[:, :2] -= (CUBE_HALF_SIZE + 0.005) * self.push_dir  # just behind the cube's face, on the push line
        self.to_push_point = behind - self.ee_pos
        self.cube_to_goal = self.goal_pos[:, :2] - self.cube_pos[:, :2]

    def _observe(self) -> torch.Tensor:
        return torch.cat([self.q - self.home_qpos[:NUM_ARM_JOINTS], self.qd, self.prev_action, self.ee_pos,
                          self.ee_vel, self.cube_pos, self.cube_quat, self.cube_vel, self.goal_pos[:, :2],
                          self.to_push_point, self.cube_to_goal], dim=-1)

    def _evaluate(self, action: torch.Tensor):
        reach_distance = self.to_push_point.norm(dim=-1)
        goal_distance = self.cube_to_goal.norm(dim=-1)
        on_table = self.cube_pos[:, 2] < CUBE_HALF_SIZE + 0.005
        self.solved = (goal_distance < self.goal_radius) & on_table
        w = self.weights
        terms = {
            "reach": w["reach"] * closeness(reach_distance),
            "push": w["push"] * closeness(goal_distance) * (reach_distance < self.reach_gate),
            "success": w["success"] * self.solved.float(),
            **self._common_terms(),
        }
        return terms, torch.zeros_like(self.solved)  # the cube must stay in the region until the time limit


class FrankaGraspVecEnv(FrankaCubeVecEnv):
    """What the gripping tasks share: an 8th action drives the gripper (-1 closed, +1 open), episodes start with it
    open, and the cube counts as grasped when it is between the fingertips with the gripper closing on it."""

    def _finger_command(self) -> torch.Tensor:
        """The gripper action (the 8th) maps -1..1 to each finger's closed..open position."""
        opening = (self.prev_action[:, NUM_ARM_JOINTS] + 1.0) / 2.0
        finger = FINGERS_CLOSED + (FINGERS_OPEN - FINGERS_CLOSED) * opening
        return finger[:, None].expand(self.num_envs, 2)

    def _reset_arm_open(self, envs_idx: torch.Tensor) -> None:
        """The arm home plus noise with the gripper open. Its action is set before the arm is placed (the fingers
        are placed where _finger_command() reads it to be) and again after (_reset_arm zeroes the previous action)."""
        gripper_action = self.prev_action[:, NUM_ARM_JOINTS]
        gripper_action.index_fill_(0, envs_idx, 1.0)
        self._reset_arm(envs_idx)
        gripper_action.index_fill_(0, envs_idx, 1.0)

    def _read_grasp(self) -> None:
        """The fingers, the cube relative to the TCP, and whether it is grasped: the cube between the fingertips, the
        fingers closing and stopped by it (not shut)."""
        self.fingers = self.robot.get_dofs_position()[:, NUM_ARM_JOINTS:]
        self.to_cube = self.cube_pos - self.ee_pos
        width = self.fingers.sum(-1)
        self.closing = self.prev_action[:, NUM_ARM_JOINTS] < 0.0  # the gripper action squeezing, not opening
        self.grasped = (self.to_cube.norm(dim=-1) < 0.02) & self.closing & (width > 2 * CUBE_HALF_SIZE - 0.01)


class FrankaPickCubeVecEnv(FrankaGraspVecEnv):
    """`num_envs` Pandas picking up a cube and holding it at a goal point in the air."""

    def __init__(
        self,
        num_envs: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
        sim_device: str = "auto",
        max_episode_steps: int = 50,
        decimation: int = 5,
        sim_dt: float = 0.01,
        action_scale: float = 0.1,
        init_noise: float = 0.05,
        cube_x_range: tuple[float, float] = (0.4, 0.6),
        cube_y_range: tuple[float, float] = (-0.1, 0.1),
        goal_height_range: tuple[float, float] = (0.05, 0.3),
        goal_threshold: float = 0.025,
        still_threshold: float = 0.2,
        still_speed_scale: float = 1.0,
        reach_weight: float = 1.0,
        grasp_weight: float = 1.0,
        place_weight: float = 1.0,
        place_fine_weight: float = 0.0,
        still_weight: float = 1.0,
        success_weight: float = 1.0,
        table_contact_weight: float = 0.5,
        action_rate_weight: float = 0.01,
        stagger_episodes: bool = True,
        max_abs_value: float | None = MAX_ABS_VALUE,
        render_mode: str | None = None,
    ):
        check_ranges(goal_height_range=goal_height_range)
        if not still_speed_scale > 0:  # 0 pays a flat bonus at the goal, a negative scale pays for speed
            raise ValueError(f"still_speed_scale must be positive, got {still_speed_scale!r}")
        self.goal_threshold, self.still_threshold = goal_threshold, still_threshold
        self.still_speed_scale = still_speed_scale
        self.weights = {"reach": reach_weight, "grasp": grasp_weight, "place": place_weight,
                        "place_fine": place_fine_weight, "still": still_weight,
                        "success": success_weight}
        obs_dim = 3 * NUM_ARM_JOINTS + 1 + 2 + 6 + 10 + 3 + 3 + 3
        super().__init__(num_envs, seed, device, sim_device, max_episode_steps, decimation, sim_dt, action_scale,
                         init_noise, obs_dim, NUM_ARM_JOINTS + 1, stagger_episodes, max_abs_value, render_mode,
                         cube_x_range, cube_y_range, table_contact_weight, action_rate_weight)
        import genesis as gs

        self.goal_low = torch.tensor((cube_x_range[0], cube_y_range[0], goal_height_range[0]), device=gs.device)
        self.goal_high = torch.tensor((cube_x_range[1], cube_y_range[1], goal_height_range[1]), device=gs.device)

    def _add_objects(self, scene) -> None:
        super()._add_objects(scene)
        import genesis as gs

        if self.render_mode == "rgb_array":  # the goal point's success zone, drawn only
            self.goal_marker = scene.add_entity(
                gs.morphs.Sphere(radius=self.goal_threshold, pos=(0.5, 0.0, 0.2), fixed=True, collision=False),
                surface=gs.surfaces.Default(color=(0.1, 0.7, 0.2)),
            )

    def _reset_envs(self, envs_idx: torch.Tensor) -> None:
        """Arm home plus noise with the gripper open, cube at rest at a random spot, goal above the cube area."""
        self._reset_arm_open(envs_idx)
        self._reset_cube(envs_idx)
        self.goal_pos[envs_idx] = self._uniform(len(envs_idx), self.goal_low, self.goal_high)
        if getattr(self, "goal_marker", None) is not None:
            self.goal_marker.set_pos(self.goal_pos[envs_idx], envs_idx=envs_idx)

    def _read_state(self) -> None:
        self._read_cube_state()
        self._read_grasp()
        self.cube_to_goal = self.goal_pos - self.cube_pos

    def _observe(self) -> torch.Tensor:
        return torch.cat([self.q - self.home_qpos[:NUM_ARM_JOINTS], self.qd, self.prev_action, self.fingers,
                          self.ee_pos, self.ee_vel, self.cube_pos, self.cube_quat, self.cube_vel, self.goal_pos,
                          self.to_cube, self.cube_to_goal], dim=-1)

    def _evaluate(self, action: torch.Tensor):
        placed = self.cube_to_goal.norm(dim=-1) < self.goal_threshold
        joint_speed = self.qd.norm(dim=-1)
        self.solved = placed & (joint_speed < self.still_threshold)
        grasped = self.grasped.float()
        w = self.weights
        terms = {
            "reach": w["reach"] * closeness(self.to_cube.norm(dim=-1)),
            "grasp": w["grasp"] * grasped,
            "place": w["place"] * closeness(self.cube_to_goal.norm(dim=-1)) * grasped,
            # Isaac Lab's lift task's fine-grained goal tracking (1 - tanh(d / 0.05)): steep in the last centimetres,
            # where `place` is nearly flat. Reported only when weighted.
            **({"place_fine": w["place_fine"] * closeness(4.0 * self.cube_to_goal.norm(dim=-1)) * grasped}
               if w["place_fine"] else {}),
            # 1 - tanh(|q'|): ManiSkill3's 1 - tanh(5 |q'|) is flat above about 0.5 rad/s, where the policies sat at
            # the goal moving at 1-2 rad/s, unpaid for slowing (pick_diagnostics.md: 64% success at 5M steps at 5,
            # 95% at 1).
            "still": w["still"] * (1.0 - torch.tanh(self.still_speed_scale * joint_speed)) * placed,
            "success": w["success"] * self.solved.float(),
            **self._common_terms(),
        }
        return terms, torch.zeros_like(self.solved)


# Two cubes' centres stay this far apart at reset (ManiSkill3's placement: each cube's bounding circle plus 1 mm).
CUBE_SEPARATION = 2 * (2 ** 0.5 * CUBE_HALF_SIZE + 0.001)
STACK_STAGES = ("reach", "grasped", "stacked", "solved")  # the stage a step is in: 0, 1, 2, 3


class FrankaStackCubeVecEnv(FrankaGraspVecEnv):
    """`num_envs` Pandas stacking cube A (red) on cube B (green), as ManiSkill3's StackCube-v1.

    Solved when A rests on B (centres within the cubes' half-diagonal + 5 mm in the plane, A's bottom within 5 mm of
    B's top), A is still (under 1 cm/s and 0.5 rad/s) and released: not held, the gripper opening or neither finger
    touching A (`held`: the gripper closing with A grasped or touching a finger). ManiSkill3's staged dense reward,
    split into terms that add up to it and normalised by the top stage's value (8): reach A (2 · closeness);
    grasped: 4 + closeness of A to the point on top of B; A on B: 6 + (gripper opening + A's stillness) / 2, the
    opening while held being the commanded one (ManiSkill3's is the fingers' reached width, which A blocks);
    solved: 8. `info["episode_metrics"]`: `stage`, the highest stage an episode reached (STACK_STAGES: 0-3), and
    `reached_grasped`, `reached_stacked` (that stage or a higher one), `closest_to_b` (the nearest A came to the spot
    on top of B, m), `lift` (the highest A rose above where it rests on the table, m: 0.04 to go over B),
    `released_on_b` (whether the gripper was commanded open at a step with A on B: 0 where a policy holds A on B to
    the end and never tries to let go), beside `success_once`."""

    STATE = (*FrankaCubeVecEnv.STATE, "best_stage", "closest_to_b", "lift", "released_on_b")

    def __init__(
        self,
        num_envs: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
        sim_device: str = "auto",
        max_episode_steps: int = 50,
        decimation: int = 5,
        sim_dt: float = 0.01,
        action_scale: float = 0.1,
        init_noise: float = 0.05,
        cube_area_centre: tuple[float, float] = (0.5, 0.0),
        cube_area_shift: tuple[float, float] = (0.1, 0.1),
        cube_area_half_size: tuple[float, float] = (0.1, 0.2),
        stack_tolerance: float = 0.005,
        static_speed: float = 0.01,
        static_angular_speed: float = 0.5,
        reach_weight: float = 2 / 8,
        grasp_weight: float = 2 / 8,
        place_weight: float = 1 / 8,
        stack_weight: float = 1 / 8,
        release_weight: float = 0.5 / 8,
        still_weight: float = 0.5 / 8,
        success_weight: float = 1 / 8,
        table_contact_weight: float = 0.5 / 8,
        action_rate_weight: float = 0.01 / 8,
        randomise_dynamics: bool = False,
        cube_mass_range: tuple[float, float] = (0.02, 0.15),
        cube_friction_range: tuple[float, float] = (0.3, 1.0),
        table_friction_range: tuple[float, float] = (0.3, 1.0),
        stagger_episodes: bool = True,
        max_abs_value: float | None = MAX_ABS_VALUE,
        render_mode: str | None = None,
    ):
        check_ranges(positive=True, cube_mass_range=cube_mass_range, cube_friction_range=cube_friction_range,
                     table_friction_range=table_friction_range)
        centre, shift, half = (torch.tensor(v, dtype=torch.float32) for v in
                               (cube_area_centre, cube_area_shift, cube_area_half_size))
        if not ((shift >= 0).all() and (half > 0).all()):
            raise ValueError(f"cube_area_shift must be >= 0 and cube_area_half_size > 0, got {cube_area_shift!r} "
                             f"and {cube_area_half_size!r}")
        if not (half > CUBE_SEPARATION).all():
            raise ValueError(f"cube_area_half_size must exceed {CUBE_SEPARATION:.4f} m each way so that two cubes fit "
                             f"apart, got {cube_area_half_size!r}")
        self.stack_tolerance, self.static_speed, self.static_angular_speed = (stack_tolerance, static_speed,
                                                                             static_angular_speed)
        self.weights = {"reach": reach_weight, "grasp": grasp_weight, "place": place_weight, "stack": stack_weight,
                        "release": release_weight, "still": still_weight, "success": success_weight}
        reach = shift + half  # where a cube's centre can be, around cube_area_centre
        obs_dim = 3 * NUM_ARM_JOINTS + 1 + 2 + 6 + 2 * 10 + 3 * 3
        super().__init__(num_envs, seed, device, sim_device, max_episode_steps, decimation, sim_dt, action_scale,
                         init_noise, obs_dim, NUM_ARM_JOINTS + 1, stagger_episodes, max_abs_value, render_mode,
                         (float(centre[0] - reach[0]), float(centre[0] + reach[0])),
                         (float(centre[1] - reach[1]), float(centre[1] + reach[1])),
                         table_contact_weight, action_rate_weight,
                         **({"batch_links_info": True} if randomise_dynamics else {}))
        import genesis as gs

        sim = gs.device
        self.area_centre, self.area_shift, self.area_half = centre.to(sim), shift.to(sim), half.to(sim)
        self.on_top = torch.tensor((0.0, 0.0, 2 * CUBE_HALF_SIZE), device=sim)  # B's centre to where A's goes
        self.sideways = torch.tensor((0.0, 1.0), device=sim)  # B's direction from A when both are drawn on one spot
        self.best_stage = torch.zeros(num_envs, dtype=torch.int64, device=sim)
        self.closest_to_b = torch.zeros(num_envs, device=sim)  # A's nearest approach to the spot on top of B (m)
        self.lift = torch.zeros(num_envs, device=sim)  # the highest A's centre rose above its resting height (m)
        self.released_on_b = torch.zeros(num_envs, dtype=torch.bool, device=sim)  # opened the gripper with A on B
        self._finger_links = torch.tensor([self.robot.get_link(name).idx for name in ("left_finger", "right_finger")],
                                          device=sim, dtype=torch.int32)
        if randomise_dynamics:
            self._randomise_dynamics({"cube_mass": cube_mass_range, "cube_b_mass": cube_mass_range,
                                      "cube_friction": cube_friction_range, "cube_b_friction": cube_friction_range,
                                      "table_friction": table_friction_range})

    def _add_objects(self, scene) -> None:
        super()._add_objects(scene)  # cube A, red
        import genesis as gs

        self.cube_b = scene.add_entity(
            gs.morphs.Box(size=(2 * CUBE_HALF_SIZE,) * 3, pos=(0.5, 0.2, CUBE_HALF_SIZE)),
            surface=gs.surfaces.Default(color=(0.1, 0.7, 0.2)),
        )

    def _draw_cube_positions(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """ManiSkill3's placement: the area shifted by a uniform offset, each cube uniform in it, B redrawn while it
        is nearer A than CUBE_SEPARATION (a fixed number of rounds, no host sync; what is still too near after them,
        about 1e-17 of draws, is moved out to CUBE_SEPARATION along the line between the two)."""
        centre = self.area_centre + self._uniform(n, -self.area_shift, self.area_shift)
        a = centre + self._uniform(n, -self.area_half, self.area_half)
        b = centre + self._uniform(n, -self.area_half, self.area_half)
        for _ in range(20):
            too_near = ((b - a).norm(dim=-1) < CUBE_SEPARATION)[:, None]
            b = torch.where(too_near, centre + self._uniform(n, -self.area_half, self.area_half), b)
        apart = b - a
        distance = apart.norm(dim=-1, keepdim=True)
        direction = torch.where(distance > 1e-6, apart / distance.clamp(min=1e-6), self.sideways)
        b = torch.where(distance < CUBE_SEPARATION, a + CUBE_SEPARATION * direction, b)
        on_table = torch.full((n, 1), CUBE_HALF_SIZE, device=a.device)
        return torch.cat([a, on_table], -1), torch.cat([b, on_table], -1)

    def _reset_envs(self, envs_idx: torch.Tensor) -> None:
        """Arm home plus noise with the gripper open, both cubes upright at rest on the table, apart."""
        self._reset_arm_open(envs_idx)
        a, b = self._draw_cube_positions(len(envs_idx))
        self._place(self.cube, a, envs_idx)
        self._place(self.cube_b, b, envs_idx)
        self.solved_once.index_fill_(0, envs_idx, False)
        self.best_stage.index_fill_(0, envs_idx, 0)
        self.closest_to_b.index_fill_(0, envs_idx, float("inf"))
        self.lift.index_fill_(0, envs_idx, 0.0)
        self.released_on_b.index_fill_(0, envs_idx, False)
        self._draw_dynamics(envs_idx)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "cube_b_qpos": self.cube_b.get_qpos().cpu(),
                "cube_b_dofs_velocity": self.cube_b.get_dofs_velocity().cpu()}

    def _load_bodies(self, state: dict) -> None:
        import genesis as gs

        super()._load_bodies(state)
        self.cube_b.set_qpos(state["cube_b_qpos"].to(gs.device), zero_velocity=False)
        self.cube_b.set_dofs_velocity(state["cube_b_dofs_velocity"].to(gs.device))

    def _read_state(self) -> None:
        self._read_cube_state()
        self._read_grasp()
        self.cube_ang = self.cube.get_ang()
        self.cube_b_pos, self.cube_b_quat = self.cube_b.get_pos(), self.cube_b.get_quat()
        self.cube_b_vel = self.cube_b.get_vel()
        self.goal_pos = self.cube_b_pos + self.on_top
        self.to_cube_b = self.cube_b_pos - self.ee_pos
        self.cube_to_goal = self.goal_pos - self.cube_pos

    def _read_grasp(self) -> None:
        """`grasped` as the picking task's (the nearness test: stages 1 and 2), and `held`, what letting go must end:
        the gripper closing with A grasped or touching either finger. The nearness test alone let a policy squeeze A
        off-centre, its centre 2.0-2.4 cm from the fingertip point, and be paid for letting go and for success without
        opening the gripper; and the fingers' squeeze is weak (about 1-2 N at Genesis's finger gain), so whether both
        press on A with ManiSkill3's 0.5 N flickers while the policy holds A on B."""
        super()._read_grasp()
        contacts = self.robot.get_contacts(with_entity=self.cube)  # (num_envs, contacts) per key
        finger = torch.where(contacts["link_a"] == self.cube.base_link.idx, contacts["link_b"], contacts["link_a"])
        touching = (contacts["valid_mask"] & torch.isin(finger, self._finger_links)).any(-1)
        self.held = self.closing & (self.grasped | touching)

    def _observe(self) -> torch.Tensor:
        return torch.cat([self.q - self.home_qpos[:NUM_ARM_JOINTS], self.qd, self.prev_action, self.fingers,
                          self.ee_pos, self.ee_vel, self.cube_pos, self.cube_quat, self.cube_vel, self.cube_b_pos,
                          self.cube_b_quat, self.cube_b_vel, self.to_cube, self.to_cube_b, self.cube_to_goal], dim=-1)

    def _stage(self) -> torch.Tensor:
        """Each env's stage now (STACK_STAGES): solved, else A on B, else A grasped, else reaching."""
        offset = self.cube_pos - self.cube_b_pos
        on_b = ((offset[:, :2].norm(dim=-1) <= 2 ** 0.5 * CUBE_HALF_SIZE + self.stack_tolerance)
                & ((offset[:, 2] - 2 * CUBE_HALF_SIZE).abs() <= self.stack_tolerance))
        static = ((self.cube_vel.norm(dim=-1) <= self.static_speed)
                  & (self.cube_ang.norm(dim=-1) <= self.static_angular_speed))
        self.solved = on_b & static & ~self.held
        return torch.where(self.solved, 3, torch.where(on_b, 2, self.grasped.long()))

    def _evaluate(self, action: torch.Tensor):
        stage = self.stage = self._stage()
        self.best_stage = torch.maximum(self.best_stage, stage)
        self.closest_to_b = torch.minimum(self.closest_to_b, self.cube_to_goal.norm(dim=-1))
        self.lift = torch.maximum(self.lift, self.cube_pos[:, 2] - CUBE_HALF_SIZE)
        self.released_on_b |= (stage >= 2) & ~self.closing  # the gripper commanded open with A on B
        # Each stage's reward is the one below at its top plus what the stage itself pays (ManiSkill3's values).
        # While held, the gripper's commanded opening (0 shut, 0.5 at A's width), not ManiSkill3's reached one: A
        # stops the fingers at its width whatever the command below it, so the reached width paid the same for every
        # squeeze and the policy, holding at -0.85 with a std of 0.16, never sampled an opening (franka_cube results).
        opening = torch.where(self.held, self._finger_command().sum(-1) / (2 * FINGERS_OPEN), 1.0)
        stillness = 1.0 - torch.tanh(10.0 * self.cube_vel.norm(dim=-1) + self.cube_ang.norm(dim=-1))
        w, above = self.weights, lambda k: (stage > k).float()
        terms = {
            "reach": w["reach"] * torch.where(stage > 0, 1.0, closeness(self.to_cube.norm(dim=-1))),
            "grasp": w["grasp"] * above(0),
            "place": w["place"] * torch.where(stage > 1, 1.0, closeness(self.cube_to_goal.norm(dim=-1)) * above(0)),
            "stack": w["stack"] * above(1),
            "release": w["release"] * torch.where(stage > 2, 1.0, opening * above(1)),
            "still": w["still"] * torch.where(stage > 2, 1.0, stillness * above(1)),
            "success": w["success"] * above(2),
            **self._common_terms(),
        }
        return terms, torch.zeros_like(self.solved)  # A must stay stacked until the time limit

    def _episode_info(self, ended: torch.Tensor) -> dict:
        """Success at the end and at any step (FrankaCubeVecEnv), and the highest stage the episode reached."""
        info = super()._episode_info(ended)
        ended_f = ended.float()
        info["episode_metrics"].update(stage=self.best_stage * ended_f,  # 0-3, and whether it got that far:
                                       reached_grasped=(self.best_stage >= 1) * ended_f,
                                       reached_stacked=(self.best_stage >= 2) * ended_f,
                                       closest_to_b=self.closest_to_b * ended_f, lift=self.lift * ended_f,
                                       released_on_b=self.released_on_b * ended_f)
        return info
