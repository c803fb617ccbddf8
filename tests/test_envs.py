"""The envs/ contract (docs/design.md §3) on Gymnasium tasks and their partially observable variants."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs
from conftest import check_episode_statistics
from envs.core import check_ranges
from envs.partial import POSITION_INDICES, VELOCITY_INDICES, variants


def random_actions(vec, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    low = torch.as_tensor(vec.single_action_space.low)
    high = torch.as_tensor(vec.single_action_space.high)
    return [low + (high - low) * torch.rand(vec.num_envs, len(low), generator=g) for _ in range(steps)]


def test_final_obs_is_the_true_last_obs_not_the_reset_obs():
    """Bug: bootstrapping a truncated episode from the autoreset observation of the next episode."""
    vec = envs.make("Pendulum-v1", num_envs=2, seed=3, max_episode_steps=15)
    single = gym.make("Pendulum-v1", max_episode_steps=15)
    single_obs, _ = single.reset(seed=3)  # env 0 of the batch is seeded with `seed`
    obs, _ = vec.reset()
    np.testing.assert_allclose(obs[0].numpy(), single_obs, rtol=1e-6)
    for t, action in enumerate(random_actions(vec, 15)):
        obs, reward, terminated, truncated, info = vec.step(action)
        single_obs, single_reward, single_term, single_trunc, _ = single.step(action[0].numpy())
        assert truncated[0].item() == single_trunc and not terminated.any()
        np.testing.assert_allclose(info["final_obs"][0].numpy(), single_obs, rtol=1e-6)
        assert reward[0].item() == pytest.approx(single_reward, rel=1e-6)
    assert truncated.all() and t == 14
    reset_obs, _ = single.reset()
    np.testing.assert_allclose(obs[0].numpy(), reset_obs, rtol=1e-6)
    assert not np.allclose(info["final_obs"][0].numpy(), obs[0].numpy())


def test_final_obs_rows_of_running_envs_equal_obs():
    """Bug: a dense final_obs with stale or zero rows for envs that did not finish."""
    vec = envs.make("Pendulum-v1", num_envs=3, seed=0)
    vec.reset()
    for action in random_actions(vec, 5):
        obs, _, _, _, info = vec.step(action)
        torch.testing.assert_close(info["final_obs"], obs)


def test_episode_statistics_are_raw_returns_and_lengths():
    """Bug: logging normalised or partial returns, or lengths off by one."""
    vec = envs.make("InvertedPendulum-v5", num_envs=4, seed=1)
    vec.reset()
    assert check_episode_statistics(vec, random_actions(vec, 60)) > 4  # random actions drop the pole quickly


def test_termination_is_not_reported_as_truncation():
    """Bug: merging terminated and truncated, which bootstraps from terminal states."""
    vec = envs.make("InvertedPendulum-v5", num_envs=2, seed=0)
    vec.reset()
    saw_terminated = False
    for action in random_actions(vec, 100):
        _, _, terminated, truncated, info = vec.step(action)
        assert not (terminated & truncated).any()
        if terminated.any():
            saw_terminated = True
            last = info["final_obs"][terminated]
            assert (last[:, 1].abs() > 0.2).all()  # the pole angle that ends InvertedPendulum episodes
    assert saw_terminated


def test_same_seed_reproduces_trajectories_and_other_seed_does_not():
    """Bug: seeds ignored (irreproducible runs) or every env seeded identically."""

    def rollout(seed):
        vec = envs.make("HalfCheetah-v5", num_envs=2, seed=seed)
        obs, _ = vec.reset()
        trajectory = [obs]
        for action in random_actions(vec, 10):
            trajectory.append(vec.step(action)[0])
        vec.close()
        return torch.stack(trajectory)

    first, second, other = rollout(7), rollout(7), rollout(8)
    assert torch.equal(first, second)
    assert not torch.allclose(first, other)
    assert not torch.allclose(first[:, 0], first[:, 1])


def test_async_vectorization_steps_the_same_trajectories_as_sync():
    """Bug: the async option silently drops seeding or same-step autoreset."""
    trajectories = []
    for mode in ("sync", "async"):
        vec = envs.make("Pendulum-v1", num_envs=2, seed=4, vectorization_mode=mode, max_episode_steps=5)
        obs, _ = vec.reset()
        steps = [obs]
        for action in random_actions(vec, 8):
            obs, _, _, truncated, info = vec.step(action)
            steps += [obs, info["final_obs"]]
        vec.close()
        trajectories.append(torch.stack(steps))
    torch.testing.assert_close(trajectories[0], trajectories[1])


def test_tensors_have_the_contract_dtypes_and_shapes():
    vec = envs.make("Pendulum-v1", num_envs=3, seed=0, device="cpu")
    obs, _ = vec.reset()
    obs, reward, terminated, truncated, info = vec.step(torch.zeros(3, 1))
    assert obs.shape == (3, 3) and obs.dtype == torch.float32
    assert reward.shape == (3,) and reward.dtype == torch.float32
    assert terminated.dtype == truncated.dtype == torch.bool
    assert info["final_obs"].shape == (3, 3)
    assert isinstance(vec.single_action_space, gym.spaces.Box)


@pytest.mark.parametrize("variant_id,base_id,keep", list(variants()), ids=[v for v, _, _ in variants()])
def test_masked_variant_keeps_exactly_the_documented_indices(variant_id, base_id, keep):
    """Bug: a masked variant that leaks a velocity or drops a position (wrong slice)."""
    masked = envs.make(variant_id, num_envs=1, seed=2)
    full = envs.make(base_id, num_envs=1, seed=2)
    assert masked.single_observation_space.shape == (len(keep),)
    masked_obs, _ = masked.reset()
    full_obs, _ = full.reset()
    for action in random_actions(full, 3):
        torch.testing.assert_close(masked_obs, full_obs[:, keep])
        masked_obs = masked.step(action)[0]
        full_obs = full.step(action)[0]
    if variant_id.endswith("NoVel" + variant_id[variant_id.rindex("-") :]):
        assert not set(keep) & set(VELOCITY_INDICES[base_id])
        assert sorted(set(keep) | set(VELOCITY_INDICES[base_id])) == list(range(full_obs.shape[1]))
    else:
        assert keep == POSITION_INDICES[base_id]


@pytest.mark.parametrize("base_id", sorted(VELOCITY_INDICES))
def test_documented_velocity_indices_hold_the_simulator_velocities(base_id):
    """Bug: the documented layout does not match the task (what NoVel hides is not the velocity)."""
    env = gym.make(base_id)
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        obs, *_ = env.step(env.action_space.sample())
    sim = env.unwrapped
    if hasattr(sim, "data"):  # MuJoCo
        velocity = sim.data.qvel.copy()
        if base_id in ("Hopper-v5", "Walker2d-v5", "InvertedDoublePendulum-v5"):
            velocity = np.clip(velocity, -10, 10)  # these tasks clip qvel in their observation
        if base_id == "Humanoid-v5":
            velocity = np.concatenate([velocity, sim.data.cvel[1:].ravel()])
    else:  # classic control: state = (position, velocity)
        velocity = np.asarray(sim.state[1:2])
    np.testing.assert_allclose(obs[VELOCITY_INDICES[base_id]], velocity, rtol=1e-5, atol=1e-6)


def test_variants_work_through_gymnasium_make_vec():
    """Bug: variants only reachable through envs.make, not Gymnasium's registry."""
    vec = gym.make_vec("PendulumNoVel-v1", num_envs=2)
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (2, 2)
    vec.close()


def test_subset_reset_touches_only_the_masked_envs():
    """Bug: resetting one env resets (or reseeds) the others too."""
    vec = envs.make("HalfCheetah-v5", num_envs=3, seed=0)
    vec.reset()
    for action in random_actions(vec, 4):
        obs, *_ = vec.step(action)
    mask = torch.tensor([False, True, False])
    new_obs, _ = vec.reset(options={"reset_mask": mask})
    torch.testing.assert_close(new_obs[~mask], obs[~mask])
    assert not torch.allclose(new_obs[1], obs[1])
    assert new_obs[1, 8:].abs().max() < 0.5  # a fresh HalfCheetah starts nearly at rest
    _, _, _, _, info = vec.step(torch.zeros(3, 6))
    assert vec.episode_lengths.tolist() == [5, 1, 5]


def test_nonfinite_state_truncates_and_resets_only_that_env():
    """Bug: one simulator blow-up kills the batch, or leaks NaN into the next observation."""
    vec = envs.make("Pendulum-v1", num_envs=3, seed=0)
    obs, _ = vec.reset()
    obs, *_ = vec.step(torch.zeros(3, 1))
    vec.env.envs[1].unwrapped.state = np.array([np.nan, np.nan])
    new_obs, reward, terminated, truncated, info = vec.step(torch.zeros(3, 1))
    assert info["sim_errors"].tolist() == [False, True, False]
    assert truncated.tolist() == [False, True, False] and not terminated.any()
    assert torch.isfinite(new_obs).all() and torch.isfinite(reward).all()
    torch.testing.assert_close(info["final_obs"][1], obs[1])  # the last finite observation
    assert info["episode"]["mask"].tolist() == [False, True, False]
    for _ in range(3):
        assert torch.isfinite(vec.step(torch.zeros(3, 1))[0]).all()


class Drifting(gym.Env):
    """Observes `value`, which a test sets to anything (a diverged simulator's state)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    value = 0.5

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.value = 0.5
        return np.array([self.value, 0.0]), {}

    def step(self, action):
        return np.array([self.value, 1.0]), float(self.value), False, False, {}


@pytest.mark.parametrize("max_abs_value,value,blows_up",
                         [(envs.MAX_ABS_VALUE, 1e30, True), (envs.MAX_ABS_VALUE, -2e6, True),
                          (envs.MAX_ABS_VALUE, 9e5, False), (None, 1e30, False), (None, np.inf, True)])
def test_absurd_finite_values_count_as_a_blow_up(max_abs_value, value, blows_up):
    """Bug: a diverged simulator's finite but absurd values (1e30) passed on, poisoning the observation
    normaliser's statistics for the rest of the run; None keeps only the non-finite check."""
    if "DriftingTest-v0" not in gym.registry:
        gym.register("DriftingTest-v0", entry_point=Drifting)
    vec = envs.make("DriftingTest-v0", num_envs=3, seed=0, max_abs_value=max_abs_value)
    obs, _ = vec.reset()
    vec.env.envs[1].unwrapped.value = value
    new_obs, reward, terminated, truncated, info = vec.step(torch.zeros(3, 1))
    assert info["sim_errors"].tolist() == [False, blows_up, False] and truncated.tolist() == [False, blows_up, False]
    if blows_up:
        assert new_obs[1, 0] == 0.5 and reward[1] == 0.0  # env 1 was reset; its reward is not passed on
        torch.testing.assert_close(info["final_obs"][1], obs[1])  # the last sane observation
    else:
        assert new_obs[1, 0] == np.float32(value)


def test_numpy_actions_from_the_action_space_and_a_wrong_shape():
    """Bugs: Gymnasium users' `action_space.sample()` (a numpy array) failing with AttributeError; an action of
    the wrong shape failing deep inside the vector env."""
    vec = envs.make("Pendulum-v1", num_envs=4, seed=0)
    vec.reset()
    obs, reward, *_ = vec.step(vec.env.action_space.sample())
    assert obs.shape == (4, 3) and reward.shape == (4,)
    with pytest.raises(ValueError, match=r"action must have shape \(4, 1\)"):
        vec.step(np.zeros((4, 2)))
    vec.close()


@pytest.mark.parametrize("value,refused", [
    ((np.float32(0.05), np.float64(0.1)), False), ([1, 2], False), ((0.5, 0.5), False),
    ((0.1, float("inf")), True), ((float("nan"), 1.0), True), ((True, 2), True), (("0.1", 0.2), True), ((0.1,), True),
    ((0.0, 0.1), True),  # not above 0
])
def test_a_range_is_a_pair_of_finite_numbers_of_any_kind(value, refused):
    """Bugs: numpy's numbers (a range computed by a script) refused, or a range that would draw inf or NaN, a bool or
    a string accepted, each failing later inside the simulator."""
    if refused:
        with pytest.raises(ValueError, match="mass_range must be "):
            check_ranges(positive=True, mass_range=value)
    else:
        check_ranges(positive=True, mass_range=value)


def test_unknown_env_id_names_the_id_and_suggests_a_fix():
    with pytest.raises(ValueError, match=r"unknown env id 'HalfCheeta-v5'.*Did you mean: `HalfCheetah`"):
        envs.make("HalfCheeta-v5")


def test_discrete_action_task_is_rejected_with_a_clear_error():
    with pytest.raises(ValueError, match="continuous"):
        envs.make("CartPole-v1")


def test_bad_reset_mask_is_rejected():
    vec = envs.make("Pendulum-v1", num_envs=2)
    vec.reset()
    with pytest.raises(ValueError, match="reset_mask"):
        vec.reset(options={"reset_mask": torch.tensor([1, 0])})


def test_episode_recorder_writes_exactly_one_whole_episode_of_env_zero(tmp_path):
    """Bug: a training video that starts mid-episode or runs on into the next one."""
    from envs.video import EpisodeRecorder

    class Frames:
        t = 0

        def render(self):
            return np.full((8, 8, 3), self.t, dtype=np.uint8)

    vec, recorder, written = Frames(), EpisodeRecorder(), []
    recorder.start()
    done_at = {3, 7, 12}  # env 0's episodes end after steps 3, 7 and 12
    for t in range(15):
        vec.t = t
        path = recorder.step(vec, torch.tensor([t in done_at, False]), str(tmp_path / f"v{t}.mp4"))
        if path:
            written.append((t, path))
    assert [t for t, _ in written] == [7]  # the episode of steps 4..7, nothing of the one that was running
    import imageio.v2 as imageio

    frames = imageio.mimread(written[0][1])
    assert len(frames) == 4


def test_memory_cue_shows_the_sign_once_and_rewards_remembering_it():
    """Bug: a cue that stays visible (no memory needed) or a reward that does not depend on the hidden sign."""
    vec = envs.make("MemoryCue-v0", num_envs=64, seed=0)
    obs, _ = vec.reset(seed=0)
    sign = obs[:, 0].clone()
    assert set(sign.tolist()) == {-1.0, 1.0}
    remembered, memoryless = torch.zeros(64), torch.zeros(64)
    for t in range(8):
        obs, reward, terminated, truncated, info = vec.step(sign[:, None] * 0.5)
        remembered += reward
        assert (obs[:, 0] == 0).all() or t == 7
    assert truncated.all() and not terminated.any()
    torch.testing.assert_close(remembered, torch.full((64,), -7 * 0.25))
    torch.testing.assert_close(info["episode"]["r"], remembered)
    assert set(obs[:, 0].tolist()) <= {-1.0, 1.0}  # the next episode's cue, after the same-step reset
    for t in range(8):
        _, reward, *_ = vec.step(torch.zeros(64, 1))
        memoryless += reward
    torch.testing.assert_close(memoryless, torch.full((64,), -7.0))
    vec.close()


# ---------------------------------------------------------------- the critic's observation (docs/design.md §3)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_variant_gives_the_critic_the_whole_observation_and_its_own_final_one(mode):
    """Bugs: the critic's final observation taken after the autoreset (the next episode's first), or its rows out
    of step with the policy's observation (another env's, or a step behind)."""
    keep = [0, 1]
    hidden = envs.make("PendulumNoVel-v1", num_envs=2, seed=3, vectorization_mode=mode, max_episode_steps=6)
    full = envs.make("Pendulum-v1", num_envs=2, seed=3, max_episode_steps=6)
    assert hidden.single_critic_observation_space.shape == full.single_observation_space.shape
    obs, info = hidden.reset()
    full_obs, _ = full.reset()
    torch.testing.assert_close(info["critic_obs"], full_obs)
    truncations = 0
    for action in random_actions(full, 13):
        obs, _, _, truncated, info = hidden.step(action)
        full_obs, _, _, full_truncated, full_info = full.step(action)
        torch.testing.assert_close(info["critic_obs"], full_obs)
        torch.testing.assert_close(info["final_critic_obs"], full_info["final_obs"])
        torch.testing.assert_close(info["critic_obs"][:, keep], obs)
        torch.testing.assert_close(info["final_critic_obs"][:, keep], info["final_obs"])
        truncations += int(truncated.sum())
        assert torch.equal(truncated, full_truncated)
    assert truncations == 4  # two episode ends per env: the final rows differ from the reset rows there
    hidden.close()


def test_a_subset_reset_keeps_the_critic_observation_in_step():
    """Bug: resetting some envs refreshes the policy's observation but leaves the critic's stale (or zeroes the
    rows of the envs that were not reset)."""
    vec = envs.make("HalfCheetahNoVel-v5", num_envs=3, seed=0)
    vec.reset()
    for action in random_actions(vec, 4):
        obs, _, _, _, info = vec.step(action)
    before = info["critic_obs"]
    mask = torch.tensor([False, True, False])
    new_obs, new_info = vec.reset(options={"reset_mask": mask})
    keep = [i for i in range(17) if i not in VELOCITY_INDICES["HalfCheetah-v5"]]
    torch.testing.assert_close(new_info["critic_obs"][:, keep], new_obs)
    torch.testing.assert_close(new_info["critic_obs"][~mask], before[~mask])
    assert not torch.allclose(new_info["critic_obs"][1], before[1])
    _, _, _, _, info = vec.step(torch.zeros(3, 6))
    torch.testing.assert_close(info["critic_obs"][:, keep], info["final_obs"])


def test_a_blow_up_resets_the_critic_observation_with_the_env():
    """Bug: a blown-up env's critic observation passed on non-finite (poisoning the critic's normaliser), or its
    final one not the last finite one."""
    vec = envs.make("PendulumNoVel-v1", num_envs=3, seed=0)
    vec.reset()
    _, _, _, _, info = vec.step(torch.zeros(3, 1))
    last = info["critic_obs"]
    vec.env.envs[1].unwrapped.state = np.array([0.0, np.nan])  # only the hidden velocity is not finite
    obs, _, _, truncated, info = vec.step(torch.zeros(3, 1))
    assert info["sim_errors"].tolist() == [False, True, False] and truncated.tolist() == [False, True, False]
    assert torch.isfinite(info["critic_obs"]).all()
    torch.testing.assert_close(info["final_critic_obs"][1], last[1])
    torch.testing.assert_close(info["critic_obs"][:, :2], obs)


def test_a_task_without_a_critic_observation_says_so():
    """Bug: a task offering a critic observation it does not have (the scripts would train the critic on it)."""
    vec = envs.make("Pendulum-v1", num_envs=2, seed=0)
    obs, info = vec.reset()
    assert vec.single_critic_observation_space is None and "critic_obs" not in info
    assert "critic_obs" not in vec.step(torch.zeros(2, 1))[4]
