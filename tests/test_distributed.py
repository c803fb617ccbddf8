"""Data-parallel training under torchrun, on two gloo processes on the CPU (what CI has): every process keeps the
same network, optimiser and normalisers; two processes with half the data step as one process with all of it;
process 0 alone writes the run and evaluates; a two-process run resumes exactly; a process that dies or hangs stops
the other with one clear line; a KL stop or a divergence stops every process at the same point. Each test starts
real processes (multiprocessing's spawn, with torchrun's environment variables), which call the scripts' own
`train`, `cli` and helpers."""

from __future__ import annotations

import contextlib
import glob
import io
import multiprocessing
import os
import queue
import signal
import socket
import time

import pytest
import torch

from conftest import SCRIPTS, SLOW_MACHINE_S, as_flags, communicate, script_named, wait_until

WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process(rank, port, cwd, task, payload, results):
    os.environ.update(WORLD_SIZE=str(WORLD), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(WORLD))
    os.chdir(cwd)
    torch.set_num_threads(1)
    try:
        answer = task(rank, *payload)
    except BaseException as error:  # noqa: BLE001 - reported to the test, which fails with it
        answer = RuntimeError(f"process {rank}: {type(error).__name__}: {error}")
    # As bytes: torch would pass tensors as shared-memory handles, gone once this process exits.
    serialised = io.BytesIO()
    torch.save(answer, serialised)
    results.put((rank, serialised.getvalue()))


def run_processes(task, *payload, cwd, wait_for=range(WORLD), timeout=SLOW_MACHINE_S) -> dict:
    """Runs task(rank, *payload) in WORLD fresh processes joined as torchrun would; returns {rank: result} for the
    ranks in `wait_for` (the others are killed once those have answered). `timeout`: for a hang, not a slow machine."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_process, args=(rank, port, str(cwd), task, payload, results))
                 for rank in range(WORLD)]
    for process in processes:
        process.start()
    answers, deadline = {}, time.monotonic() + timeout
    try:
        while not set(wait_for) <= answers.keys():
            rank, answer = results.get(timeout=max(1.0, deadline - time.monotonic()))
            answers[rank] = torch.load(io.BytesIO(answer), weights_only=False)
    except queue.Empty:
        pytest.fail(f"{task.__name__}: no answer from processes {sorted(set(wait_for) - answers.keys())} after "
                    f"{timeout} s (the limit is for a hang; each answers when its task returns)")
    finally:
        for process in processes:
            process.join(timeout=5 if set(wait_for) == set(range(WORLD)) else 0)
            if process.is_alive():
                process.kill()
    for rank in wait_for:
        if isinstance(answers[rank], Exception):
            raise answers[rank]
    return answers


def tiny_flags(name: str, **overrides) -> dict:
    """Each script's tiny Pendulum run with both normalisers and the adaptive-KL rate (whose KL must be averaged),
    four iterations of two processes and short episodes (several end in every iteration)."""
    small = script_named(name).small
    return {**small, "total_timesteps": small["num_envs"] * small["num_steps"] * 4 * WORLD,
            "lr_schedule": "adaptive_kl", "norm_obs": True, "norm_reward": True,
            "env_kwargs": {"max_episode_steps": 20}, "checkpoint_interval": 2, "eval_interval": 2, "eval_episodes": 3,
            **overrides}


def _train_and_read_state(rank, name, flags):
    """Trains (every process), and returns what must be identical in all of them, and the summary."""
    script = script_named(name)
    module, captured = script.module, {}
    make_optimizer, build_agent = module.make_optimizer, module.build_agent

    def capture_optimizer(agent, args):
        captured["agent"], captured["optimizer"] = agent, make_optimizer(agent, args)
        return captured["optimizer"]

    def capture_normaliser(*args, **kwargs):
        built = build_agent(*args, **kwargs)
        captured["obs_norm"] = built[1]
        captured["critic_norm"] = built[2] if len(built) > 2 else None  # --privileged-critic's own normaliser
        return built

    module.make_optimizer, module.build_agent = capture_optimizer, capture_normaliser
    summary = module.train(script.args(**flags))
    optimizer = captured["optimizer"]
    return {
        "params": {k: v.detach().clone() for k, v in captured["agent"].state_dict().items()},
        "adam": [v.clone() for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)],
        "lr": [group["lr"] for group in optimizer.param_groups],
        "obs_norm": {k: v.clone() for k, v in captured["obs_norm"].state_dict().items()},
        "critic_norm": {k: v.clone() for k, v in (captured["critic_norm"] or torch.nn.Module()).state_dict().items()},
        "summary": {k: v for k, v in summary.items() if k != "history"},
        "episodes": sum(1 for h in summary["history"] if "charts/episodic_return" in h),
        "evaluations": [(h["iteration"], h["eval/return"]) for h in summary["history"] if "eval/return" in h],
        "epochs_done": [h["charts/update_epochs_done"] for h in summary["history"] if "charts/update_epochs_done" in h],
    }


def assert_same_state(a: dict, b: dict) -> None:
    for key in a["params"]:
        assert torch.equal(a["params"][key], b["params"][key]), key
    assert len(a["adam"]) == len(b["adam"]) > 0
    assert all(torch.equal(x, y) for x, y in zip(a["adam"], b["adam"]))
    assert a["lr"] == b["lr"]
    for group in ("obs_norm", "critic_norm"):
        assert a[group].keys() == b[group].keys()
        for key in a[group]:
            assert torch.equal(a[group][key], b[group][key]), (group, key)


TWO_PROCESS_RUNS: dict = {}


@pytest.fixture
def two_process_run(tmp_path_factory):
    """(final states of both processes, directory) of each script's tiny two-process run with a checkpoint every
    two iterations, trained once for the tests that read it."""

    def run(name: str):
        if name not in TWO_PROCESS_RUNS:
            cwd = tmp_path_factory.mktemp(f"two_processes_{name}")
            TWO_PROCESS_RUNS[name] = run_processes(_train_and_read_state, name, tiny_flags(name), cwd=cwd), cwd
        return TWO_PROCESS_RUNS[name]

    return run


@pytest.mark.parametrize("name", SCRIPTS)
def test_processes_that_skip_the_gradient_kl_or_normaliser_averaging_drift_apart(name, two_process_run):
    """After four iterations on different envs, both processes hold the same network, Adam moments, adaptive
    learning rate and observation statistics; process 0 alone wrote a run directory, and the logs count every
    process's episodes and steps."""
    states, tmp_path = two_process_run(name)
    assert_same_state(states[0], states[1])
    assert states[0]["lr"] != [script_named(name).args().learning_rate] * len(states[0]["lr"])  # the KL moved it
    assert states[1]["summary"]["run_dir"] is None
    runs = glob.glob(str(tmp_path / "runs" / "*"))
    assert len(runs) == 1 and os.path.join(tmp_path, states[0]["summary"]["run_dir"]) == runs[0]
    # Process 0 alone evaluates (every second iteration), the others wait; the best checkpoint gathers them all.
    assert [i for i, _ in states[0]["evaluations"]] == [2, 4] and states[1]["evaluations"] == []
    best = torch.load(os.path.join(runs[0], "checkpoint_best.pt"), weights_only=True)
    assert len(best["other_processes"]) == WORLD - 1 and best["iteration"] == best["best_eval"]["iteration"]
    flags = tiny_flags(name)
    assert states[0]["summary"]["global_step"] == flags["total_timesteps"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(runs[0], size_guidance={"scalars": 0})
    events.Reload()
    steps_per_env = flags["total_timesteps"] // (WORLD * flags["num_envs"])
    ended_per_env = steps_per_env // 20  # 20-step episodes, from the first reset (no staggered starts here)
    assert len(events.Scalars("charts/episodic_return")) >= WORLD * flags["num_envs"] * ended_per_env - 2 * WORLD


@pytest.mark.parametrize("name", SCRIPTS)
def test_processes_stop_their_epochs_after_the_same_minibatch_under_a_per_minibatch_target_kl(name, tmp_path):
    """Bug: --target-kl's stop decided on each process's own minibatch KL: one process stops while another steps
    on into an all-reduce the first never joins (a hang until --dist-timeout-s, or collectives paired wrongly), and
    the networks drift apart. A target inside the spread of the minibatches' KL makes the stop act mid-update."""
    flags = tiny_flags(name, lr_schedule="constant", target_kl=5e-5, target_kl_per_minibatch=True, eval_interval=0,
                       dist_timeout_s=60)
    states = run_processes(_train_and_read_state, name, flags, cwd=tmp_path)
    assert_same_state(states[0], states[1])
    epochs_done = states[0]["epochs_done"]
    assert epochs_done == states[1]["epochs_done"] and len(epochs_done) == 4
    assert min(epochs_done) < flags["update_epochs"], epochs_done  # the stop acted


def _gradient_of_my_half(rank, name, data):
    script = script_named(name)
    agent = script.make_agent(seed=0)
    half = {k: v.chunk(WORLD)[rank] for k, v in data.items()}
    args = script.args(norm_adv=True, clip_vloss=True, ent_coef=0.01)
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        loss, _ = script.loss(agent, half["obs"], half["actions"], half["logprobs"], half["advantages"],
                              half["returns"], half["values"], args)
        loss.backward()
        script.module.average_over_processes([p.grad for p in agent.parameters()])
    finally:
        dist.destroy_process_group()
    return [p.grad.clone() for p in agent.parameters()]


@pytest.mark.parametrize("name", SCRIPTS)
def test_two_processes_with_half_a_minibatch_each_step_like_one_with_all_of_it(name, tmp_path):
    """The averaged gradient of two half minibatches equals one process's gradient on the whole minibatch
    (advantages normalised over both halves, not per process)."""
    torch.manual_seed(3)
    B = 16
    data = {"obs": torch.randn(B, 3), "actions": torch.randn(B, 2), "logprobs": torch.randn(B) - 2.0,
            "advantages": torch.randn(B) * 3 + 1, "returns": torch.randn(B), "values": torch.randn(B)}
    script = script_named(name)
    agent = script.make_agent(seed=0)
    loss, _ = script.loss(agent, data["obs"], data["actions"], data["logprobs"], data["advantages"], data["returns"],
                          data["values"], script.args(norm_adv=True, clip_vloss=True, ent_coef=0.01))
    loss.backward()
    grads = run_processes(_gradient_of_my_half, name, data, cwd=tmp_path)
    for rank in range(WORLD):
        for expected, got in zip([p.grad for p in agent.parameters()], grads[rank]):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def _merged_statistics(rank, name, batches, rewards, dones):
    module = script_named(name).module
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        norm = module.ObsNormalizer(batches.shape[-1])
        for batch in batches:
            norm.update(batch.chunk(WORLD, dim=0)[rank])
        scaler = module.RewardScaler(rewards.shape[2] // WORLD, gamma=0.9)
        scaled = [scaler(r.chunk(WORLD, dim=1)[rank], d.chunk(WORLD, dim=1)[rank]) for r, d in zip(rewards, dones)]
    finally:
        dist.destroy_process_group()
    return norm.state_dict(), torch.cat(scaled), scaler.return_rms.state_dict()


@pytest.mark.parametrize("name", SCRIPTS)
def test_merged_normalisers_equal_the_statistics_of_every_processs_data_together(name, tmp_path):
    """Observation statistics merged over processes each holding half of every batch, and rewards scaled by
    return statistics merged over processes each holding half of the envs, equal one process with all of it."""
    torch.manual_seed(0)
    batches = torch.randn(5, 8, 3) * torch.tensor([1.0, 10.0, 0.1]) + torch.tensor([5.0, -3.0, 0.0])
    rewards = torch.randn(3, 16, 8)  # three rollouts of 16 steps x 8 envs
    dones = torch.rand(3, 16, 8) < 0.1
    module = script_named(name).module
    norm = module.ObsNormalizer(3)
    for batch in batches:
        norm.update(batch)
    scaler = module.RewardScaler(8, gamma=0.9)
    scaled = torch.cat([scaler(r, d) for r, d in zip(rewards, dones)])
    merged = run_processes(_merged_statistics, name, batches, rewards, dones, cwd=tmp_path)
    for rank in range(WORLD):
        obs_stats, got_scaled, return_stats = merged[rank]
        for key, value in norm.state_dict().items():
            torch.testing.assert_close(obs_stats[key], value, rtol=1e-10, atol=1e-12)
        for key, value in scaler.return_rms.state_dict().items():
            torch.testing.assert_close(return_stats[key], value, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got_scaled, scaled.chunk(WORLD, dim=1)[rank], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", SCRIPTS)
def test_two_process_run_resumed_from_its_checkpoint_ends_as_if_never_stopped(name, two_process_run):
    """Resuming a two-process run from its iteration-2 checkpoint (each process's envs, RNG and return scaler)
    ends with the uninterrupted run's network and statistics; a resume with one process is refused clearly."""
    flags = tiny_flags(name)
    straight, tmp_path = two_process_run(name)
    run_dir = straight[0]["summary"]["run_dir"]
    checkpoint = torch.load(os.path.join(tmp_path, run_dir, "checkpoint_000002.pt"), weights_only=True)
    assert checkpoint["world_size"] == WORLD and len(checkpoint["other_processes"]) == WORLD - 1
    resume = os.path.join(run_dir, "checkpoint_000002.pt")
    resumed = run_processes(_train_and_read_state, name, dict(flags, resume=resume), cwd=tmp_path)
    assert resumed[0]["summary"]["global_step"] == straight[0]["summary"]["global_step"]
    assert resumed[0]["evaluations"] == straight[0]["evaluations"][1:]  # iteration 4's, as if never stopped
    for rank in range(WORLD):
        assert_same_state(straight[rank], resumed[rank])

    from conftest import run_cli

    refused = run_cli(name, "--resume", run_dir, cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "written by 2 processes, resumed by 1" in refused.stderr and "--nproc-per-node 2" in refused.stderr


def _cli_with_a_broken_process(rank, name, flags, failure):
    module = script_named(name).module
    if rank == 1:
        step_envs = module.step_envs

        def broken_step(vec, action, env_id, global_step, iteration):
            if iteration == 2:
                if failure == "dies":
                    os._exit(3)
                time.sleep(3600)  # killed once process 0 has answered
            return step_envs(vec, action, env_id, global_step, iteration)

        module.step_envs = broken_step
    return _cli(module, flags)


def _cli(module, flags) -> tuple[int, str, float]:
    """module.cli(flags): its exit status, what it wrote to stderr, and how long it took."""
    stderr, started = io.StringIO(), time.monotonic()
    with contextlib.redirect_stderr(stderr):
        try:
            module.cli(flags)
            code = 0
        except SystemExit as exit_:
            code = exit_.code
    return code, stderr.getvalue(), time.monotonic() - started


@pytest.mark.parametrize("failure", ["dies", "hangs"])
def test_a_process_that_dies_or_hangs_stops_the_other_with_one_line_within_the_timeout(failure, tmp_path):
    """Process 1's env dies (exits) or hangs (for an hour) in the second iteration: process 0 stops, --dist-timeout-s
    after, with exit status 1 and one line saying so, not a traceback (not waiting for the hour: run_processes
    fails if it has not answered within SLOW_MACHINE_S)."""
    script = script_named("ppo_continuous")
    flags = ["--env-id", "Pendulum-v1", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2",
             "--total-timesteps", str(2 * 32 * 2 * 6), "--no-progress-bar", "--dist-timeout-s", "5",
             "--policy-device", "cpu"]
    answers = run_processes(_cli_with_a_broken_process, script.name, flags, failure, cwd=tmp_path, wait_for=[0])
    code, stderr, elapsed = answers[0]
    assert code == 1
    assert "Traceback" not in stderr and "lost the others" in stderr and "--dist-timeout-s 5" in stderr
    assert elapsed < SLOW_MACHINE_S


def _cli_diverging_from_iteration_3(rank, name, flags):
    """The script's cli with a learning rate of 1e30 from iteration 3 (NaN weights within its update)."""
    module = script_named(name).module
    real_fraction = module.lr_fraction
    module.lr_fraction = lambda args, iteration: real_fraction(args, iteration) * (1.0 if iteration < 3 else 1e30)
    return _cli(module, flags)


@pytest.mark.parametrize("name", SCRIPTS)
def test_an_update_that_diverges_stops_every_process_after_the_same_iteration_with_one_line(name, tmp_path):
    """Bug: under torchrun, a divergence noticed by one process only (a check of what is not shared, or made on
    process 0 alone): the others train on with NaN weights, or wait in the next collective and end with 'lost the
    others' after --dist-timeout-s. Every process must stop after iteration 3's update with the one line, process 0's
    last checkpoint left at iteration 2."""
    flags = tiny_flags(name, lr_schedule="linear", eval_interval=0, dist_timeout_s=60)
    answers = run_processes(_cli_diverging_from_iteration_3, name, as_flags(flags), cwd=tmp_path)
    for rank, (code, stderr, _) in answers.items():
        assert code == 1, (rank, stderr)
        assert stderr.strip().startswith("error: training diverged: iteration 3's update"), (rank, stderr)
        assert "\n" not in stderr.strip(), (rank, stderr)
    (checkpoint,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    assert torch.load(checkpoint, weights_only=True)["iteration"] == 2


def _train_with_process_0_slow_to_write_checkpoints(rank, name, flags):
    """Trains with every checkpoint write of process 0 taking two seconds longer; returns when this process's
    train() returned and when its last checkpoint write ended (None on the others, which write none)."""
    script = script_named(name)
    save_checkpoint, written = script.module.save_checkpoint, []

    def slow_save_checkpoint(*args, **kwargs):
        time.sleep(2.0)
        save_checkpoint(*args, **kwargs)
        written.append(time.time())

    script.module.save_checkpoint = slow_save_checkpoint
    script.module.train(script.args(**flags))
    return {"returned": time.time(), "last_written": written[-1] if written else None}


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_process_leaves_train_before_process_0_has_written_the_last_checkpoint(name, tmp_path):
    """Bug: process 1 leaving (and exiting) while process 0 still writes the last checkpoint. A run stopped by a
    signal exits with 128 + its number, a failure to torchrun, which then ends the other processes: process 0 was
    sent SIGTERM in the middle of its checkpoint and logs (seen in CI as a second 'SIGTERM: finishing' line)."""
    flags = tiny_flags(name, eval_interval=0)
    flags["total_timesteps"] = flags["num_envs"] * flags["num_steps"] * WORLD  # one iteration, its checkpoint last
    ends = run_processes(_train_with_process_0_slow_to_write_checkpoints, name, flags, cwd=tmp_path)
    assert ends[0]["last_written"] is not None and ends[1]["last_written"] is None
    assert ends[1]["returned"] >= ends[0]["last_written"]


@pytest.mark.parametrize("target", ["one process", "torchrun"])
def test_torchrun_cli_sigterm_to_one_process_stops_both_after_the_same_iteration_with_one_checkpoint(target, tmp_path):
    """The real entry point: `torchrun ... ppo_continuous.py` trains with two processes; SIGTERM reaching one of
    them stops both after the same iteration, with one checkpoint holding both processes' envs (without the stop
    request shared, the other process would wait for it forever); reaching torchrun (as under `srun torchrun` or
    `timeout`), it is forwarded to both, which stop the same way before torchrun's --shutdown-timeout."""
    import subprocess
    import sys

    from conftest import REPO

    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    command = [torchrun, "--standalone", "--nproc-per-node", "2", os.path.join(REPO, "ppo_continuous.py"),
               "--env-id", "Pendulum-v1", "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2",
               "--update-epochs", "1", "--total-timesteps", "10000000", "--checkpoint-interval", "1",
               "--no-progress-bar", "--policy-device", "cpu"]
    launcher = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: glob.glob(str(tmp_path / "runs" / "*" / "checkpoint_000002.pt")),
                   "torchrun's two processes starting and saving the checkpoint of iteration 2", process=launcher)

        def two_workers():
            workers = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()
            return workers if len(workers) == 2 else None

        workers = wait_until(two_workers, "finding torchrun's two worker processes", process=launcher)
        os.kill(int(workers[-1]) if target == "one process" else launcher.pid, signal.SIGTERM)
        output = communicate(launcher, f"both processes stopping after SIGTERM reached {target}")
    finally:
        launcher.kill()
    assert output.count("SIGTERM: finishing this iteration") == (1 if target == "one process" else 2)
    assert "lost the others" not in output and "error:" not in output  # the other one stopped with it, cleanly
    (run_dir,) = glob.glob(str(tmp_path / "runs" / "*"))
    relative = os.path.relpath(run_dir, tmp_path)
    assert f"resume:   torchrun --standalone --nproc-per-node 2 ppo_continuous.py --resume {relative}" in output
    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
    assert checkpoint["world_size"] == 2 and len(checkpoint["other_processes"]) == 1
    assert checkpoint["global_step"] == checkpoint["iteration"] * 2 * 2 * 64 >= 2 * 2 * 2 * 64
    saved = sorted(glob.glob(os.path.join(run_dir, "checkpoint_[0-9]*.pt")))
    assert saved[-1].endswith(f"checkpoint_{checkpoint['iteration']:06d}.pt")
    assert not checkpoint["other_processes"][0]["next_obs_raw"].equal(checkpoint["next_obs_raw"])  # its own envs


@pytest.mark.parametrize("world,per_node,launcher", [
    (1, 1, "python {}"),
    (2, 2, "torchrun --standalone --nproc-per-node 2 {}"),
    (16, 8, "torchrun --nnodes 2 --nproc-per-node 8 <rendezvous flags as before> {}"),
])
def test_a_stopped_torchrun_run_is_told_to_resume_with_as_many_processes(script, monkeypatch, capsys, world,
                                                                         per_node, launcher):
    """Bug: a run of two processes stopped by SIGTERM told to resume with `python script.py --resume`, which one
    process refuses (the checkpoint holds two processes' envs)."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))
    script.module.print_run_end({"run_dir": "runs/a", "checkpoint": "runs/a/checkpoint.pt", "history": [],
                                 "iteration": 3, "global_step": 96, "mean_recent_return": -1.0,
                                 "stopped_by": signal.SIGTERM, "best_eval": None})
    out = capsys.readouterr().out
    assert f"resume:   {launcher.format(script.name + '.py')} --resume runs/a\n" in out + "\n"


@pytest.mark.parametrize("name", SCRIPTS)
def test_two_processes_with_a_privileged_critic_keep_one_network_and_one_critic_normaliser(name, tmp_path):
    """Bug: the critic observation's normaliser left out of the processes' merge (each normalises the critic's
    input by its own envs' statistics, and the processes' critics drift apart)."""
    flags = tiny_flags(name, env_id="PendulumNoVel-v1", privileged_critic=True)
    states = run_processes(_train_and_read_state, name, flags, cwd=tmp_path)
    assert states[0]["critic_norm"]["count"].item() > 1
    assert_same_state(states[0], states[1])


@pytest.mark.parametrize("gpus,cuda,device,backend", [
    (1, True, 0, "gloo"),  # two processes, one GPU: both on it, and NCCL would refuse the pair
    (2, True, 1, "nccl"),  # a GPU each: process 1 on the second
    (2, False, 1, "gloo"),  # a CPU policy: gloo whatever the GPUs
    (0, False, None, "gloo"),
])
def test_more_processes_than_gpus_share_them_and_reduce_through_gloo(monkeypatch, gpus, cuda, device, backend):
    """Bugs: process 1 of two asking for GPU 1 on a one-GPU machine (torch.cuda.set_device(1) there raises 'invalid
    device ordinal'), or NCCL chosen for two processes on one GPU (it refuses a GPU shared by two ranks)."""
    import torch.distributed as dist

    module = script_named("ppo_continuous").module  # init_distributed is the same in all three (test_copies)
    chosen = {}
    for key, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1", "RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: chosen.setdefault("device", index))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda name, **kw: chosen.setdefault("backend", name))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    args = module.Args(cuda=cuda, policy_device="cuda" if cuda else "cpu")
    assert module.init_distributed(args) == 1
    assert (chosen.get("device"), chosen["backend"]) == (device, backend)
