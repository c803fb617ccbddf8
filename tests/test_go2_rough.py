"""Go2Rough-v0 and Go2RoughBlind-v0: the height field and scan, the terrain curriculum, spawning on tiles, domain
randomisation, and the envs/ contract (CPU backend, a small terrain: 3 levels of 4 m tiles)."""

import math

import numpy as np
import pytest
import torch

import envs
from envs import go2_rough
from conftest import (GO2_STATE_READ, check_episode_statistics, check_resume, check_seeding,
                      check_started_state_is_what_a_read_gives)
from envs.go2_rough import SCAN_OBS_SCALE, Go2RoughVecEnv, next_levels
from envs.terrain import TERRAIN_TYPES, HeightField, TileLayout, scan_grid, scan_points_world, yaw_of

EPISODE = 10
SMALL = dict(sim_device="cpu", stagger_episodes=False, max_episode_steps=EPISODE, terrain_levels=3, tile_size=4.0,
             terrain_border=1.0, max_init_level=2, edge_margin=0.5)
CLEAN = dict(observation_noise=0.0)  # observations comparable entry by entry
NUM_ENVS = 8  # more than the 7 terrain types: two robots share a type column


def actions(num_envs, steps, seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(num_envs, 12, generator=g) for _ in range(steps)]


@pytest.fixture(scope="module")
def rough():
    vec = envs.make("Go2Rough-v0", num_envs=NUM_ENVS, seed=0, **SMALL, **CLEAN)
    yield vec
    vec.close()


@pytest.fixture(scope="module")
def blind():
    vec = envs.make("Go2RoughBlind-v0", num_envs=NUM_ENVS, seed=0, **SMALL, **CLEAN)
    yield vec
    vec.close()


@pytest.fixture(params=["rough", "blind"])
def either(request):
    return request.getfixturevalue(request.param)


def quat_of_yaw(yaw: float) -> list[float]:
    return [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]


# ---------------------------------------------------------------- the height field and the scan (no simulator)
def test_height_lookup_is_genesis_triangulation_of_the_grid():
    """Bugs: rows and columns swapped, the cell split along the other diagonal (a surface up to a grid step off
    the one Genesis collides with), or the field's origin ignored."""
    heights = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    field = HeightField(heights, horizontal_scale=0.5, origin=(1.0, -1.0))
    at = lambda x, y: field.height_at(torch.tensor([[x, y]]))[0].item()  # noqa: E731
    assert at(1.0 + 0.5, -1.0 + 1.0) == pytest.approx(1.0)  # grid point (1, 2)
    assert at(1.0 + 1.0, -1.0 + 0.5) == pytest.approx(2.0)  # grid point (2, 1)
    # Cell (1, 1): corners h(1,1)=0, h(2,1)=2, h(1,2)=1, h(2,2)=0, split along (2,1)-(1,2).
    # At u = v = 0.25 (lower triangle): 0 + 0.25 * 2 + 0.25 * 1; at u = v = 0.75 (upper): 0 + 0.25 * 1 + 0.25 * 2.
    assert at(1.0 + 0.625, -1.0 + 0.625) == pytest.approx(0.75)
    assert at(1.0 + 0.875, -1.0 + 0.875) == pytest.approx(0.75)
    # On the diagonal both triangles agree (0.5 * 2 + 0.5 * 1); the other split would read 0 at the centre.
    assert at(1.0 + 0.75, -1.0 + 0.75) == pytest.approx(1.5)
    assert at(-5.0, 50.0) == pytest.approx(0.0) and at(50.0, -0.5) == pytest.approx(2.0)  # outside: nearest edge


def test_scan_points_turn_with_the_robot_heading():
    """Bug: the scan taken in the world frame (a robot facing +y scans to the side of its path)."""
    points = torch.tensor([[0.5, 0.0], [0.0, 0.25]])  # ahead, and to the left
    base = torch.tensor([[2.0, 3.0], [2.0, 3.0]])
    yaw = yaw_of(torch.tensor([quat_of_yaw(0.0), quat_of_yaw(math.pi / 2)]))
    world = scan_points_world(base, yaw, points)
    torch.testing.assert_close(world[0], torch.tensor([[2.5, 3.0], [2.0, 3.25]]))
    torch.testing.assert_close(world[1], torch.tensor([[2.0, 3.5], [1.75, 3.0]]))


def test_scan_grid_is_legged_gyms_187_points_x_major():
    grid = scan_grid(1.6, 1.0, 0.1)
    assert grid.shape == (187, 2)
    torch.testing.assert_close(grid[0], torch.tensor([-0.8, -0.5]))
    torch.testing.assert_close(grid[1], torch.tensor([-0.8, -0.4]))  # y runs fastest
    torch.testing.assert_close(grid[-1], torch.tensor([0.8, 0.5]))


def test_layout_puts_levels_along_x_and_types_along_y():
    layout = TileLayout(3, TERRAIN_TYPES, tile_size=4.0, border=1.0, horizontal_scale=0.1)
    assert layout.shape == (3 * 40 + 20, 7 * 40 + 20)
    centres = layout.tile_centres()
    np.testing.assert_allclose(centres[0, 0], [3.0, 3.0])
    np.testing.assert_allclose(centres[2, 6], [1.0 + 2.5 * 4.0, 1.0 + 6.5 * 4.0])
    with pytest.raises(ValueError, match="unknown terrain type"):
        TileLayout(3, ("flat", "lava"), 4.0, 1.0, 0.1)
    with pytest.raises(ValueError, match="tile_size"):
        TileLayout(3, ("flat",), 4.05, 1.0, 0.1)


# ---------------------------------------------------------------- the curriculum's rule (no simulator)
def test_curriculum_moves_levels_exactly_by_the_rule():
    """Bugs: a level moved the wrong way, down after a long walk, up past the top instead of to a random level,
    below level 0, or moved before the env ever walked (a NaN distance)."""
    levels = torch.tensor([1, 1, 1, 0, 2, 2, 1])
    walked = torch.tensor([2.5, 0.4, 1.5, 0.1, 2.1, 1.0, float("nan")])
    commanded = torch.tensor([10.0, 10.0, 2.0, 8.0, 0.0, 0.0, 5.0])
    random_levels = torch.tensor([7, 7, 7, 7, 0, 7, 7])
    moved = next_levels(levels, walked, commanded, half_tile=2.0, num_levels=3, random_levels=random_levels)
    # up (walked > 2 m, though short of half the command), down (0.4 < 5), stays (1.5 >= 1), stays at 0,
    # past the top (level 3 of 3) to its random level, stays, stays.
    assert moved.tolist() == [2, 0, 1, 0, 0, 2, 1]


# ---------------------------------------------------------------- the task in the simulator
def test_registered_tasks_observe_proprioception_commands_and_the_scan(rough, blind):
    assert isinstance(rough, Go2RoughVecEnv) and isinstance(blind, Go2RoughVecEnv)
    assert rough.single_observation_space.shape == (48 + 187,)
    assert blind.single_observation_space.shape == (48,)
    # The critic: Go2Walk-v0's 52, friction and added mass drawn, and the scan (the blind policy's critic too).
    assert rough.single_critic_observation_space.shape == blind.single_critic_observation_space.shape == (52 + 2 + 187,)
    rough_obs, rough_info = rough.reset(seed=1)
    blind_obs, blind_info = blind.reset(seed=1)
    torch.testing.assert_close(rough_obs[:, :48], blind_obs)
    torch.testing.assert_close(rough_obs[:, 48:], rough_info["critic_obs"][:, 54:])
    torch.testing.assert_close(blind_info["critic_obs"], rough_info["critic_obs"])


def test_scan_reads_the_terrain_under_a_yawed_robot(monkeypatch):
    """Bugs: the scan in the world frame instead of the robot's yaw frame, read off another part of the field, or
    observed without legged_gym's offset, clip and scale; the base's height (its reward term) taken over another
    point than the one under it. The field is built by hand: a plane rising 0.02 m per cell along x and 0.05 m along
    y, so every point of it has a known height and a turned scan reads others."""
    def plane(layout, vertical_scale, seed):
        i, j = np.meshgrid(np.arange(layout.shape[0]), np.arange(layout.shape[1]), indexing="ij")
        return ((0.02 * i + 0.05 * j) / vertical_scale).astype(np.float32)

    monkeypatch.setattr(TileLayout, "height_field", plane)
    vec = envs.make("Go2Rough-v0", num_envs=2, seed=0, **SMALL, **CLEAN, terrain_types=("flat",))
    try:
        vec.reset(seed=0)
        yaws = [0.3, 2.0]
        base = torch.tensor([[3.0, 2.5, 0.0], [5.0, 3.5, 0.0]])
        ground = lambda x, y: 0.2 * x + 0.5 * y  # noqa: E731  (metres: 0.02 m per 0.1 m cell along x, 0.05 along y)
        base[:, 2] = ground(base[:, 0], base[:, 1]) + torch.tensor([0.35, 0.1])  # above, and a little low (clipped)
        qpos = vec.robot.get_qpos().clone()
        qpos[:, :3], qpos[:, 3:7] = base, torch.tensor([quat_of_yaw(yaw) for yaw in yaws])
        vec.robot.set_qpos(qpos, zero_velocity=True)
        vec._read_state()
        obs = vec._observe()
        torch.testing.assert_close(vec.base_height, torch.tensor([0.35, 0.1]), atol=1e-4, rtol=1e-4)
        for env, yaw in enumerate(yaws):
            local = scan_grid(1.6, 1.0, 0.1)
            x = base[env, 0] + math.cos(yaw) * local[:, 0] - math.sin(yaw) * local[:, 1]
            y = base[env, 1] + math.sin(yaw) * local[:, 0] + math.cos(yaw) * local[:, 1]
            expected = (base[env, 2] - 0.3 - ground(x, y)).clamp(-1, 1) * SCAN_OBS_SCALE
            torch.testing.assert_close(obs[env, 48:], expected, atol=1e-4, rtol=1e-4)
            assert expected.max() - expected.min() > 1.0  # the plane's tilt shows across the scan
    finally:
        vec.close()


def tile_of(vec, xy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (level row, type column) of the tile under each (x, y), from the layout's numbers."""
    layout = vec.layout
    border = layout.border_cells * layout.horizontal_scale
    return ((xy[:, 0] - border) // layout.tile_size).long(), ((xy[:, 1] - border) // layout.tile_size).long()


def test_each_robot_starts_on_its_own_levels_tile_and_a_subset_reset_keeps_the_others(rough):
    """Bugs: robots spawned on another level's (or another type's) tile, all at the origin, or a per-env reset
    that moves the other robots."""
    rough.reset(seed=2)
    level, column = tile_of(rough, rough.robot.get_pos()[:, :2])
    assert level.tolist() == rough.terrain_level.tolist()
    assert column.tolist() == [i % len(TERRAIN_TYPES) for i in range(NUM_ENVS)]
    for action in actions(NUM_ENVS, 3, seed=2):
        rough.step(action)
    before = rough.robot.get_pos().clone()
    mask = torch.tensor([False, True, False, False, False, False, True, False])
    rough.reset(options={"reset_mask": mask})
    after = rough.robot.get_pos()
    torch.testing.assert_close(after[~mask], before[~mask])
    level, column = tile_of(rough, after[:, :2])
    assert level.tolist() == rough.terrain_level.tolist() and column.tolist()[1] == 1 and column.tolist()[6] == 6
    centres = rough.tile_centres[rough.terrain_level, rough.type_column]
    assert ((after[:, :2] - centres).abs() <= 1.0 + 1e-5).all()  # within 1 m of the centre: on the platform


def test_ending_episodes_move_the_levels_by_the_rule(rough):
    """Bug: the simulator's positions and the commands' distance not reaching the rule (levels never move, or
    move on every reset whatever the robot did)."""
    rough.reset(seed=3)
    rough.terrain_level[:4] = torch.tensor([1, 1, 1, 2])
    where = rough.robot.get_pos()[:, :2]
    rough.spawn_xy[:] = where
    rough.spawn_xy[0, 0] -= 2.5  # walked 2.5 m (more than half a 4 m tile): up
    rough.commanded_distance[:] = torch.tensor([10.0, 10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # env 1: down
    rough.spawn_xy[3, 0] -= 3.0  # at the top level (2 of 0-2), up: to a random level
    rough.reset(options={"reset_mask": torch.tensor([True, True, True, True, False, False, False, False])})
    assert rough.terrain_level[:3].tolist() == [2, 0, 1] and 0 <= rough.terrain_level[3] <= 2
    level, _ = tile_of(rough, rough.robot.get_pos()[:, :2])
    assert level[:4].tolist() == rough.terrain_level[:4].tolist()


def test_start_level_puts_every_robot_on_that_level_and_without_the_curriculum_they_stay():
    """Bug: `start_level` ignored (random levels), or the level lost when an episode ends, so that an evaluation of
    one level (benchmarks/terrain_eval.py) plays others."""
    vec = envs.make("Go2Rough-v0", num_envs=NUM_ENVS, seed=0, **SMALL, **CLEAN, start_level=1, curriculum=False)
    try:
        vec.reset(seed=4)
        for action in actions(NUM_ENVS, EPISODE + 1, seed=4, scale=1.0):  # every episode ends once (truncated)
            assert vec.terrain_level.tolist() == [1] * NUM_ENVS
            level, _ = tile_of(vec, vec.robot.get_pos()[:, :2])
            assert level.tolist() == [1] * NUM_ENVS
            vec.step(action)
        assert vec.terrain_level.tolist() == [1] * NUM_ENVS
    finally:
        vec.close()


def test_commanded_distance_sums_the_commanded_speed_over_the_episode(rough):
    rough.reset(seed=4)
    total = torch.zeros(NUM_ENVS)
    for action in actions(NUM_ENVS, 4, seed=4, scale=0.1):
        total += rough.commands[:, :2].norm(dim=-1) * rough.dt
        rough.step(action)
    torch.testing.assert_close(rough.commanded_distance, total)


def test_episode_metrics_report_the_level_and_falls_per_terrain_type(rough):
    """Bug: per-type metrics that average over every episode (a type's level diluted by the others')."""
    rough.reset(seed=5)
    types = torch.arange(NUM_ENVS) % len(TERRAIN_TYPES)
    ended_any = torch.zeros(NUM_ENVS, dtype=torch.bool)
    for action in actions(NUM_ENVS, EPISODE, seed=5):
        levels = rough.terrain_level.clone()  # the levels being played (a reset may move them)
        _, _, terminated, truncated, info = rough.step(action)
        ended = terminated | truncated
        metrics = info["episode_metrics"]
        for column, kind in enumerate(TERRAIN_TYPES):
            here = ended & (types == column)
            assert torch.equal(torch.isfinite(metrics[f"terrain_level/{kind}"]), here)
            assert torch.equal(torch.isfinite(metrics[f"fell/{kind}"]), here)
            torch.testing.assert_close(metrics[f"terrain_level/{kind}"][here], levels[here].float())
        torch.testing.assert_close(metrics["terrain_level"][ended], levels[ended].float())
        ended_any |= ended
    assert ended_any.all()


def test_new_episodes_start_on_their_tiles_in_the_state_the_simulator_reads_back(rough):
    """As on flat ground (test_go2.py), with the ground under the scan and the base's height over the new tile.
    Bugs: the scan or the height read over the tile the robot left."""
    names = (*GO2_STATE_READ, "ground_under_scan")
    check_started_state_is_what_a_read_gives(rough, names, actions(NUM_ENVS, 8, seed=2))


def test_the_base_touching_the_ground_is_a_fall(rough):
    """Bug: a robot down on its belly walks on (upright: the 60-degree tilt limit does not end it; the base's
    contact must)."""
    rough.reset(seed=6)
    qpos = rough.robot.get_qpos().clone()
    qpos[0, 2] = rough.height_field.height_at(qpos[:1, :2])[0]  # upright, the base's centre at ground level
    joints = [joint.name for joint in rough.robot.joints[1:]]
    for i, name in enumerate(joints):  # legs folded under the body
        qpos[0, 7 + i] = {"hip": 0.0, "thigh": 1.3, "calf": -2.7}[name.split("_")[1]]
    rough.robot.set_qpos(qpos, zero_velocity=True)
    _, _, terminated, truncated, info = rough.step(torch.zeros(NUM_ENVS, 12))
    assert terminated[0] and info["episode_metrics"]["fell"][0] == 1.0
    assert not terminated[1:].any()


def test_a_robot_at_the_fields_edge_ends_its_episode_truncated_not_fallen(rough):
    """Bug: a robot walks off the field (no ground past its edge) and falls forever, its height penalty growing
    without bound (it blew up a critic at 7.4M steps), or the edge counted as a fall (walking far punished)."""
    rough.reset(seed=7)
    qpos = rough.robot.get_qpos().clone()
    far = rough.field_size.tolist()
    for env, xy in ((0, [0.3, 2.0]), (1, [2.0, far[1] - 0.3]), (2, [0.7, 2.0])):  # margin 0.5: out, out, in
        qpos[env, :2] = torch.tensor(xy)
        qpos[env, 2] = rough.height_field.height_at(qpos[env:env + 1, :2])[0] + 0.42
    rough.robot.set_qpos(qpos, zero_velocity=True)
    _, _, terminated, truncated, info = rough.step(torch.zeros(NUM_ENVS, 12))
    assert truncated[:2].all() and not terminated[:2].any()
    assert info["episode_metrics"]["fell"][:2].tolist() == [0.0, 0.0]
    assert not (truncated[2:] | terminated[2:]).any()


# ---------------------------------------------------------------- domain randomisation
def test_friction_and_mass_drawn_per_episode_reach_the_simulator_and_the_critic(rough):
    """Bugs: draws that never reach Genesis (the robot's mass unchanged), out of their ranges, the same for every
    env, or missing from the critic's observation."""
    rough.reset(seed=7)
    friction, added_mass = rough.dynamics.unbind(-1)
    assert ((0.5 <= friction) & (friction <= 1.25)).all() and ((-1 <= added_mass) & (added_mass <= 1)).all()
    assert friction.std() > 0.05 and added_mass.std() > 0.1
    mass = rough.robot.get_links_mass([rough.base_link]).reshape(NUM_ENVS)
    torch.testing.assert_close(mass, rough.base_mass + added_mass)
    critic_obs = rough.step(torch.zeros(NUM_ENVS, 12))[4]["critic_obs"]
    torch.testing.assert_close(critic_obs[:, 52:54], rough.dynamics)


def test_pushes_set_every_base_velocity_on_the_push_step():
    """Bug: pushes never applied, or applied every step."""
    vec = envs.make("Go2Rough-v0", num_envs=4, seed=0, **SMALL, **CLEAN, push_interval_s=0.06, max_push_velocity=3.0)
    try:
        vec.reset(seed=0)
        speeds = []
        for _ in range(3):
            vec.step(torch.zeros(4, 12))
            speeds.append(vec.robot.get_vel()[:, :2].norm(dim=-1).max().item())
        assert speeds[0] < 0.5 and speeds[1] < 0.5 and speeds[2] > 1.0  # the third step (0.06 s) pushes
    finally:
        vec.close()


def test_a_new_terrain_does_not_spend_minutes_on_a_signed_distance_field_the_steps_never_read(monkeypatch):
    """Bug: the terrain built with Genesis's default SDF resolution (128 nodes an axis), which the first build of each
    new field spent minutes computing (about 170 s for the default field on 2 CPU cores) for a field Genesis does not
    collide with: a body meets the terrain through its height field. A finer grid steps the same, to the bit: should
    a Genesis release read the SDF, this fails and the coarse grid must go."""
    def rollout(sdf_res):
        monkeypatch.setattr(go2_rough, "TERRAIN_SDF_RES", sdf_res)
        vec = envs.make("Go2Rough-v0", num_envs=NUM_ENVS, seed=0, **SMALL, **CLEAN)
        try:
            assert vec.ground.material.sdf_max_res == sdf_res
            seen = [vec.reset(seed=0)[0]]
            for action in actions(NUM_ENVS, 2 * EPISODE, scale=1.0):  # the robots stumble on their tiles
                obs, reward, terminated, truncated, _ = vec.step(action)
                seen += [obs, reward[:, None], terminated[:, None], truncated[:, None]]
            return torch.cat(seen, dim=1), obs[:, 48:]
        finally:
            vec.close()

    assert go2_rough.TERRAIN_SDF_RES == 16  # Genesis's smallest
    (coarse, scan), (fine, _) = rollout(16), rollout(32)
    assert (scan.amax(1) - scan.amin(1)).max() > 0.25  # the field's relief (5 cm) under a robot, not a flat floor
    assert torch.equal(coarse, fine)


def test_observation_noise_is_the_policys_alone_and_off_on_the_flat_tasks():
    """Bugs: noise on the critic's observation, noise beyond legged_gym's scale, or noise on Go2Walk-v0 by default."""
    vec = envs.make("Go2Rough-v0", num_envs=4, seed=0, **SMALL)
    try:
        obs, info = vec.reset(seed=0)
        noise = obs[:, :48] - info["critic_obs"][:, :48]
        assert noise[:, 6:9].abs().max() > 0.01 and (noise[:, 6:9].abs() <= 0.05 + 1e-6).all()  # gravity's 0.05
        assert (noise[:, 9:12] == 0).all()  # commands are exact
        scan_noise = obs[:, 48:] - info["critic_obs"][:, 54:]
        assert 0.1 < scan_noise.abs().max() <= 0.5 + 1e-5
    finally:
        vec.close()
    flat = envs.make("Go2Walk-v0", num_envs=2, sim_device="cpu")
    try:
        assert flat.observation_noise == 0 and not flat.randomise_dynamics and flat.push_steps == 0
        assert flat.single_critic_observation_space.shape == (52,)
    finally:
        flat.close()


# ---------------------------------------------------------------- the envs/ contract
def test_episode_statistics_are_raw_returns_and_lengths(either):
    either.reset(seed=8)
    assert check_episode_statistics(either, actions(NUM_ENVS, 25, seed=8, scale=1.0)) >= 16


def test_same_seed_reproduces_the_trajectory_and_another_seed_does_not(rough):
    """Bug: levels, spawn points or the randomisation drawn from an unseeded generator."""
    check_seeding([(rough, 3), (rough, 3), (rough, 4)], actions(NUM_ENVS, 4, seed=1), atol=1e-5)


def test_state_dict_resumes_the_same_trajectory(either):
    """Bug: a resumed run forgets the levels, the spawn points (the curriculum's distances) or the draws."""
    either.reset(seed=10)
    for action in actions(NUM_ENVS, 3, seed=10):
        either.step(action)
    check_resume(either, lambda: envs.make("Go2Rough-v0", num_envs=NUM_ENVS, seed=99, height_scan=either.height_scan,
                                           **SMALL, **CLEAN), actions(NUM_ENVS, EPISODE + 2, seed=11))


def test_nonfinite_state_in_one_env_resets_that_env_only(rough):
    rough.reset(seed=13)
    obs = rough.step(torch.zeros(NUM_ENVS, 12))[0]
    rough.robot.set_dofs_velocity(torch.full((1, 18), float("nan")), envs_idx=[3])
    _, reward, terminated, truncated, info = rough.step(torch.zeros(NUM_ENVS, 12))
    assert info["sim_errors"].tolist() == [False, False, False, True, False, False, False, False]
    assert truncated[3] and torch.isfinite(reward).all()
    torch.testing.assert_close(info["final_obs"][3], obs[3])
    for _ in range(12):
        assert torch.isfinite(rough.step(torch.zeros(NUM_ENVS, 12))[0]).all()


@pytest.mark.parametrize("kwargs,match", [
    ({"max_init_level": 3}, "max_init_level"),
    ({"start_level": 3}, "start_level"),
    ({"edge_margin": 1.0}, "edge_margin"),
    ({"start_level": -2}, "start_level"),
    ({"terrain_types": ("flat", "lava")}, "lava"),
    ({"scan_spacing": 0.0}, "scan_spacing"),
    ({"friction_range": (1.0, 0.5)}, "friction_range"),
    ({"push_interval_s": -1.0}, "push_interval_s"),
])
def test_bad_arguments_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        envs.make("Go2Rough-v0", num_envs=2, **{**SMALL, **kwargs})


# ---------------------------------------------------------------- the scripts on the rough tasks
def scan_task(obs_dim=48 + 187, scan_size=187):
    """What build_agent reads of a task with a height scan (no simulator needed)."""
    import gymnasium as gym
    from types import SimpleNamespace

    return SimpleNamespace(single_observation_space=gym.spaces.Box(-np.inf, np.inf, (obs_dim,)),
                           single_action_space=gym.spaces.Box(-1.0, 1.0, (12,)), single_critic_observation_space=None,
                           scan_size=scan_size)


def mean_action(script, agent, obs):
    if script.name == "ppo_recurrent":
        return agent.actor_step(obs, torch.zeros(len(obs), agent.actor_state_size))[0]
    return agent.mean_action(obs[:, None], torch.ones(len(obs), 1, dtype=torch.bool))[0]


@pytest.mark.parametrize("name", ["ppo_recurrent", "ppo_transformer"])
def test_the_height_scan_goes_through_its_own_encoder_and_reaches_the_actions(name):
    """Bugs: the scan fed raw into the GRU or the step's tokens (the encoder built but bypassed), the encoder fed
    the proprioception instead, --scan-encoder-sizes or --scan-tokens ignored, or a scan that changes no action."""
    from conftest import script_named

    script = script_named(name)
    module = script.module
    torch.manual_seed(0)
    args = module.task_args("Go2Rough-v0")
    agent = module.build_agent(args, scan_task(), torch.device("cpu"))[0]
    if name == "ppo_recurrent":
        assert agent.scan_encoder[0][0].in_features == 187 and agent.trunks[0].input_size == 48 + 64
        moved = module.build_agent(module.task_args("Go2Rough-v0", scan_encoder_sizes=(16,)), scan_task(),
                                   torch.device("cpu"))[0]
        assert moved.trunks[0].input_size == 48 + 16
        assert module.build_agent(args, scan_task(48, 0), torch.device("cpu"))[0].trunks[0].input_size == 48
    else:
        assert agent.embed.in_features == 48 and agent.scan_embed[0].in_features == 187
        assert agent.num_tokens == 4 + 2 and agent.scan_embed[-1].out_features == 2 * args.token_dim
        moved = module.build_agent(module.task_args("Go2Rough-v0", scan_tokens=3, scan_encoder_sizes=(16,)),
                                   scan_task(), torch.device("cpu"))[0]
        assert moved.num_tokens == 4 + 3 and moved.scan_embed[0].out_features == 16
    obs = torch.randn(4, 48 + 187)
    other_scan = obs.clone()
    other_scan[:, 48:] = torch.randn(4, 187)
    encoder = agent.scan_encoder if name == "ppo_recurrent" else agent.scan_embed
    seen = []
    encoder.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].reshape(-1, inputs[0].shape[-1])))
    with torch.no_grad():
        assert not torch.allclose(mean_action(script, agent, obs), mean_action(script, agent, other_scan), atol=1e-6)
    torch.testing.assert_close(seen[0], obs[:, 48:])  # the encoder reads the scan, and only the scan
    if name == "ppo_recurrent":
        torch.testing.assert_close(agent.encode(obs)[:, :48], obs[:, :48])  # beside the untouched proprioception


SMOKE_ENV = dict(max_episode_steps=6, terrain_levels=3, tile_size=4.0, terrain_border=1.0, max_init_level=2,
                 edge_margin=0.5)


@pytest.mark.parametrize("env_id", ["Go2Rough-v0", "Go2RoughBlind-v0"])
@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_recurrent", "ppo_transformer"])
def test_each_scripts_preset_trains_and_reports_the_terrain_level_and_falls_per_type(name, env_id, in_tmp):
    """Bugs: a preset that does not run on the task (sizes, the encoder against a scan-less observation), the
    terrain level or per-type falls lost between the task and the logs or the evaluation's report (eval/*, run while
    training by the loop --eval-checkpoint runs: tests/test_evaluation.py)."""
    from conftest import script_named

    script = script_named(name)
    small = dict(num_envs=8, num_steps=6, num_minibatches=2, update_epochs=1, total_timesteps=8 * 6 * 2,
                 sim_device="cpu", policy_device="cpu", env_kwargs=SMOKE_ENV, progress_bar=False, eval_episodes=8)
    if name == "ppo_recurrent":
        small["bptt_len"] = 0
    args = script.module.task_args(env_id, **small)
    summary = script.module.train(args)
    last = summary["history"][-1]
    assert 0.0 <= last["episode_metrics/terrain_level"] <= 2.0
    assert any(key.startswith("episode_metrics/fell/") for key in last)
    assert args.eval_interval > 0 and 0.0 <= last["eval/terrain_level"] <= 2.0  # evaluated at the last iteration
    assert {f"eval/fell/{kind}" for kind in TERRAIN_TYPES} <= set(last)
