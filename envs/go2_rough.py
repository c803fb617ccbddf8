"""Go2Rough-v0: the Go2 of `Go2Walk-v0` on tiled rough terrain, with a height scan and a terrain curriculum.

The legged_gym recipe (Rudin et al. 2022, `legged_gym/envs/base/legged_robot.py`) on Genesis:

- The ground is `envs.terrain`'s grid of tiles: a row per difficulty level, a column per terrain type (slopes up and
  down, rough, stairs up and down, obstacles, flat), inside a flat border. Env i walks the tiles of type column
  i mod (number of types); it is spawned at a random spot within 1 m of its tile's centre (on the tile's flat
  platform), facing +x, at the ground's height there plus the flat task's 0.42 m.
- The height scan: the ground's height at a grid of points around the base, in the base's yaw frame (x forward),
  17 x 11 points 0.1 m apart (1.6 m x 1.0 m: legged_gym's 187), observed as clip(base_z - 0.3 - h, -1, 1) x 5
  (legged_gym's with the Go2's 0.3 m standing height in place of its 0.5 m: 0 on flat ground at the target
  height). legged_gym sized the grid for ANYmal (about 0.9 m long); kept for the Go2 (0.7 m, with legs), the same
  grid sees the footholds of a whole stride ahead at the top commanded speed (1 m/s, a 0.5 s stride) and the
  studies stay comparable. Computed for all envs at once on the simulation device (`HeightField.height_at`),
  exactly on the triangles Genesis collides with.
- The curriculum (on by default): each env has a level; when its episode ends (for any reason) it moves up a level
  if the robot walked more than half a tile from where it was spawned, down one if it walked less than half the
  distance its commands asked for (the sum of |commanded velocity| x dt over the episode), and an env past the top
  level goes to a random level. Levels start at random up to `max_init_level`; without the curriculum they are
  drawn over all levels and stay. `start_level` puts every env on that level at first instead; with
  `curriculum=False` they stay there: an evaluation of one level (benchmarks/terrain_eval.py).
- Domain randomisation on by default (legged_gym's rough-terrain settings): friction ratio 0.5-1.25 and -1 to 1 kg
  on the base, drawn per episode; pushes to a random horizontal velocity up to 1 m/s every 15 s; observation noise
  at legged_gym's level 1.
- A fall is the base touching the ground (legged_gym's termination) or a tilt beyond 60 degrees (the flat task's
  10 degrees would end every walk up a slope); the base height reward measures from the ground under the base.
  A robot within `edge_margin` of the field's edge ends its episode truncated (Isaac Lab's terrain_out_of_bounds):
  there is no ground past the edge.
- `info["episode_metrics"]` adds the level each episode was played on (`terrain_level`) and, per terrain type,
  the level and whether the robot fell (`terrain_level/<type>`, `fell/<type>`; NaN for episodes on other types,
  which the scripts leave out of those means).

`Go2RoughBlind-v0` is the same without the scan in the policy's observation (the critic still reads it).
"""

from __future__ import annotations

import torch

from envs.go2 import BASE_INIT_POS, CONTACT_FORCE_N, Go2WalkVecEnv
from envs.terrain import TERRAIN_TYPES, HeightField, TileLayout, scan_grid, scan_points_world, yaw_of

SCAN_OBS_SCALE = 5.0  # legged_gym's obs_scales.height_measurements
SPAWN_OFFSET_M = 1.0  # robots start within this of their tile's centre (legged_gym's)
TERRAIN_SDF_RES = 16  # nodes an axis of the terrain's signed distance field: Genesis's smallest (it is never read)


def next_levels(levels: torch.Tensor, walked: torch.Tensor, commanded: torch.Tensor, half_tile: float,
                num_levels: int, random_levels: torch.Tensor) -> torch.Tensor:
    """legged_gym's rule: up after walking more than half a tile, down after less than half the commanded
    distance, past the top level to `random_levels`, never below 0. A NaN distance (no episode yet) moves nothing."""
    up = walked > half_tile
    down = (walked < 0.5 * commanded) & ~up
    moved = levels + up.long() - down.long()
    return torch.where(moved >= num_levels, random_levels, moved.clamp(min=0))


class Go2RoughVecEnv(Go2WalkVecEnv):
    """`num_envs` Go2 robots on a terrain curriculum; torch tensors in, torch tensors out."""

    STATE = (*Go2WalkVecEnv.STATE, "terrain_level", "spawn_xy", "commanded_distance")

    def __init__(
        self,
        num_envs: int = 1,
        seed: int = 0,
        terrain_levels: int = 10,
        terrain_types: tuple[str, ...] = TERRAIN_TYPES,
        tile_size: float = 8.0,
        terrain_border: float = 5.0,
        horizontal_scale: float = 0.1,
        vertical_scale: float = 0.005,
        terrain_seed: int = 0,
        curriculum: bool = True,
        max_init_level: int = 5,
        start_level: int = -1,
        height_scan: bool = True,
        scan_length_x: float = 1.6,
        scan_width_y: float = 1.0,
        scan_spacing: float = 0.1,
        termination_angle_deg: float = 60.0,
        friction_range: tuple[float, float] = (0.5, 1.25),
        added_mass_range: tuple[float, float] = (-1.0, 1.0),
        push_interval_s: float = 15.0,
        max_push_velocity: float = 1.0,
        observation_noise: float = 1.0,
        edge_margin: float = 3.0,
        **kwargs,
    ):
        if not 0 <= max_init_level < terrain_levels:
            raise ValueError(f"max_init_level must be in [0, terrain_levels - 1], got {max_init_level!r}")
        if not -1 <= start_level < terrain_levels:
            raise ValueError(f"start_level must be -1 (random) or in [0, terrain_levels - 1], got {start_level!r}")
        if not 0 <= edge_margin < terrain_border:
            raise ValueError(f"edge_margin must be in [0, terrain_border), got {edge_margin!r}: the robots walk off "
                             "the field (no ground past it) or are cut short on the border")
        if not (scan_spacing > 0 and scan_length_x >= 0 and scan_width_y >= 0):
            raise ValueError("scan_spacing must be positive and the scan's length and width non-negative")
        self.layout = TileLayout(terrain_levels, terrain_types, tile_size, terrain_border, horizontal_scale)
        self.vertical_scale, self.terrain_seed = vertical_scale, terrain_seed
        self.curriculum, self.max_init_level, self.height_scan = curriculum, max_init_level, height_scan
        self.start_level, self.edge_margin = start_level, edge_margin
        self.scan_local = scan_grid(scan_length_x, scan_width_y, scan_spacing)  # (points, 2), yaw frame
        self.critic_scan_size = len(self.scan_local)
        self.scan_size = self.critic_scan_size if height_scan else 0
        super().__init__(num_envs, seed, termination_angle_deg=termination_angle_deg, friction_range=friction_range,
                         added_mass_range=added_mass_range, push_interval_s=push_interval_s,
                         max_push_velocity=max_push_velocity, observation_noise=observation_noise, **kwargs)
        import genesis as gs

        sim = gs.device
        self.scan_local = self.scan_local.to(sim)
        self.tile_centres = torch.tensor(self.layout.tile_centres(), dtype=torch.float32, device=sim)
        self.type_column = torch.arange(num_envs, device=sim) % len(self.layout.types)
        self.on_type = self.type_column[:, None] == torch.arange(len(self.layout.types), device=sim)  # (envs, types)
        self.terrain_level = torch.full((num_envs,), -1, dtype=torch.int64, device=sim)  # -1: not placed yet
        self.spawn_xy = torch.full((num_envs, 2), float("nan"), device=sim)
        self.commanded_distance = torch.zeros(num_envs, device=sim)
        self.spawn_offsets = torch.tensor([-SPAWN_OFFSET_M, SPAWN_OFFSET_M], device=sim)
        # The ground under a 0.6 m square around the spawn point (5 x 5 points): spawned above its highest point.
        self.footprint = scan_grid(0.6, 0.6, 0.15).to(sim)
        self.init_height = BASE_INIT_POS[2]

    def _add_ground(self, scene):
        import genesis as gs

        field = self.layout.height_field(self.vertical_scale, self.terrain_seed)
        self.height_field = HeightField(torch.tensor(field * self.vertical_scale, device=gs.device),
                                        self.layout.horizontal_scale)
        # The field's extent in x and y (m) from its corner at the origin; its last grid point is on the edge.
        self.field_size = torch.tensor([(n - 1) * self.layout.horizontal_scale for n in field.shape],
                                       device=gs.device)
        # Genesis collides a body with the terrain through its height field (MPR against the field's prisms), never
        # through the signed distance field it precomputes for every new mesh; at its default resolution (128 nodes
        # an axis) that SDF took about 3 of the 3.6 minutes of the first build of a new field (the default field, 2
        # CPU cores), at its smallest (16) a moment, and the steps are the same (tests/test_go2_rough.py).
        return scene.add_entity(gs.morphs.Terrain(height_field=field, horizontal_scale=self.layout.horizontal_scale,
                                                  vertical_scale=self.vertical_scale),
                                material=gs.materials.Rigid(sdf_min_res=TERRAIN_SDF_RES, sdf_max_res=TERRAIN_SDF_RES))

    def _noise_scales(self) -> torch.Tensor:
        scan_noise = torch.full((self.scan_size,), 0.1 * SCAN_OBS_SCALE)  # legged_gym's height_measurements noise
        return torch.cat([super()._noise_scales(), scan_noise])

    # ------------------------------------------------------------------ curriculum and spawning
    def _reset_envs(self, envs_idx: torch.Tensor) -> None:
        n = len(envs_idx)
        levels = self.terrain_level[envs_idx]
        top = self.max_init_level if self.curriculum else self.layout.levels - 1
        first = torch.randint(0, top + 1, (n,), generator=self.generator, device=levels.device)
        if self.start_level >= 0:  # drawn all the same, so that the rest of the episode's draws do not shift
            first = torch.full_like(first, self.start_level)
        if self.curriculum:
            walked = (self.robot.get_pos(envs_idx=envs_idx)[:, :2] - self.spawn_xy[envs_idx]).norm(dim=-1)
            random_levels = torch.randint(0, self.layout.levels, (n,), generator=self.generator, device=levels.device)
            moved = next_levels(levels, walked, self.commanded_distance[envs_idx], self.layout.tile_size / 2,
                                self.layout.levels, random_levels)
            levels = torch.where(levels < 0, first, moved)
        else:
            levels = torch.where(levels < 0, first, levels)
        self.terrain_level[envs_idx] = levels
        centre = self.tile_centres[levels, self.type_column[envs_idx]]
        self.spawn_xy[envs_idx] = centre + self._uniform(n, self.spawn_offsets[:1].expand(2),
                                                         self.spawn_offsets[1:].expand(2))
        self.commanded_distance.index_fill_(0, envs_idx, 0.0)
        super()._reset_envs(envs_idx)

    def _initial_qpos(self, envs_idx: torch.Tensor) -> torch.Tensor:
        spawn_xy = self.spawn_xy[envs_idx]
        ground = self.height_field.height_at(spawn_xy[:, None, :] + self.footprint[None]).amax(dim=-1)
        qpos = self.init_qpos.expand(len(envs_idx), -1).clone()
        qpos[:, :2], qpos[:, 2] = spawn_xy, ground + self.init_height
        return qpos

    # ------------------------------------------------------------------ observation, termination, metrics
    def _read_ground(self) -> None:
        """The base's height over the ground under it, and the ground under the scan points: one lookup for both."""
        points = scan_points_world(self.base_pos[:, :2], yaw_of(self.base_quat), self.scan_local)
        ground = self.height_field.height_at(torch.cat((self.base_pos[:, None, :2], points), dim=1))
        self.base_height = self.base_pos[:, 2] - ground[:, 0]
        self.ground_under_scan = ground[:, 1:]  # (envs, points)

    def _scan(self) -> torch.Tensor:
        offset = self.base_height_target  # 0 on flat ground at the standing height
        return (self.base_pos[:, 2:3] - offset - self.ground_under_scan).clamp(-1.0, 1.0) * SCAN_OBS_SCALE

    def _scan_blocks(self) -> list[torch.Tensor]:
        return [self._scan()] if self.height_scan else []

    def _critic_scan_blocks(self) -> list[torch.Tensor]:
        return [self._scan()]

    def _evaluate(self, action: torch.Tensor):
        self.commanded_distance += self.commands[:, :2].norm(dim=-1) * self.dt  # before new commands are drawn
        terms, fell = super()._evaluate(action)
        self.fell = fell | (self.link_forces[:, self.base_link] > CONTACT_FORCE_N)
        return terms, self.fell

    def _cut_short(self) -> torch.Tensor:
        """Robots within `edge_margin` of the field's edge: past it there is no ground, and a robot falling off it
        falls forever (its height penalty growing without bound: it blew up a critic); as Isaac Lab's
        terrain_out_of_bounds, the episode ends there, truncated (walking far is no failure)."""
        xy = self.base_pos[:, :2]
        inside = (xy >= self.edge_margin) & (xy <= self.field_size - self.edge_margin)
        return ~inside.all(dim=-1)

    def _episode_info(self, ended: torch.Tensor) -> dict:
        info = super()._episode_info(ended)
        metrics = info["episode_metrics"]
        level = self.terrain_level.float()
        metrics["terrain_level"] = torch.where(ended, level, 0.0)
        # Per terrain type, all types at once (a where per type and metric would be 35 small ops every step)
        here = ended[:, None] & self.on_type  # (envs, types)
        levels = torch.where(here, level[:, None], float("nan")).unbind(1)
        falls = torch.where(here, self.fell.float()[:, None], float("nan")).unbind(1)
        for kind, level_here, fell_here in zip(self.layout.types, levels, falls):
            metrics[f"terrain_level/{kind}"], metrics[f"fell/{kind}"] = level_here, fell_here
        return info
