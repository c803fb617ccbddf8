"""Every training flag does what it says: moved away from its setting, the run learns something else.

A flag that silently does nothing is the quietest PPO bug: the run trains, the curve looks plausible, and the
experiment that "showed the option does not help" compared a run with itself. For every flag of every script's
`Args`, MOVES gives one or more values where it must act (with, in `context`, the other flags it needs, set
alike in both runs); a tiny in-process training runs once as it is and once with the flag moved, and the learnt
parameters or the logged losses must differ. EXEMPT lists, with the reason, the flags that must not change what
is learnt (logging, paths, devices, threads, timeouts); those a tiny run can move (UNCHANGED) must leave the learnt
parameters and losses exactly as they were. A flag in neither list fails
`test_every_flag_is_either_moved_or_exempt_on_purpose`, so a new flag is tested or consciously exempted."""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass

import pytest
import torch

from conftest import SCRIPTS, script_named


def flip(args, flag):
    """A boolean flag's other value."""
    return not getattr(args, flag)


@dataclass(frozen=True)
class Move:
    """`value` (or `value(args, flag)` of the run's settings) where the flag must act; `context`: (flag, value)
    pairs both runs share (those of flags a script does not have are left out for it); `flat_rewards`: both runs on
    a task whose advantages are flat (std far below 1e-4)."""

    value: object = flip
    context: tuple = ()
    flat_rewards: bool = False


SCHEDULES = ("constant", "linear", "cosine", "adaptive_kl")
RNNS = [(("rnn_type", "gru"), ("shared_trunk", False)), (("rnn_type", "lstm"), ("shared_trunk", True))]
MODES = [(("context_len", 8), ("num_tokens", 1)), (("context_len", 1), ("num_tokens", 4))]
MEMORY = (("memory_tokens", 2), ("context_len", 2), ("num_minibatches", 3))  # 3 envs: 3 whole-rollout sequences
# Flat advantages for --robust-adv-norm: observations all zero, so the value is the same at every step (the MLP and
# the RNN start with zero biases; the transformer reads its value from its MLP critic, on the observation alone: from
# its features, which are not zero, identical rows' values differed by a rounding step, on an AVX2 CPU as much as the
# rewards, and the baseline run differed from itself), rewards of about 1e-8, no discount and no reward scaling.
FLAT_CONTEXT = (("gamma", 1.0), ("norm_reward", False), ("context_len", 1), ("critic", "mlp"))

MOVES: dict[str, list[Move]] = {
    "seed": [Move(2)],
    "env_id": [Move("MountainCarContinuous-v0")],
    "env_kwargs": [Move({"max_episode_steps": 5})],
    "num_envs": [Move(4)],
    "total_timesteps": [Move(lambda args, flag: 2 * args.total_timesteps)],
    "learning_rate": [Move(3e-3, (("lr_schedule", schedule),)) for schedule in SCHEDULES],
    "lr_schedule": [Move(schedule, (("lr_schedule", "constant"),)) for schedule in SCHEDULES[1:]],
    "anneal_lr": [Move(False, (("lr_schedule", schedule),)) for schedule in SCHEDULES[1:]],
    "lr_min_fraction": [Move(0.5, (("lr_schedule", "cosine"),))],
    "desired_kl": [Move(1e-6, (("lr_schedule", "adaptive_kl"),))],
    "critic_learning_rate": [Move(3e-3, (("lr_schedule", schedule),)) for schedule in SCHEDULES],
    "optimizer": [Move("adamw", (("weight_decay", 0.1),))],
    "weight_decay": [Move(0.1, (("optimizer", "adam"),)), Move(0.1, (("optimizer", "adamw"), ("weight_decay", 0.01)))],
    "num_steps": [Move(lambda args, flag: 2 * args.num_steps)],
    "gamma": [Move(0.5)],
    "gae_lambda": [Move(0.5)],
    "num_minibatches": [Move(2)],
    "update_epochs": [Move(3)],
    "norm_adv": [Move(False, (("norm_adv_per_minibatch", per_minibatch),)) for per_minibatch in (False, True)],
    "norm_adv_per_minibatch": [Move(context=(("norm_adv", True),))],
    "robust_adv_norm": [Move(True, (*FLAT_CONTEXT, ("norm_adv_per_minibatch", per_minibatch)), flat_rewards=True)
                        for per_minibatch in (False, True)],
    "clip_coef": [Move(0.01, (("clip_vloss", clip_vloss),)) for clip_vloss in (False, True)],
    "clip_vloss": [Move(context=(("clip_coef", 0.001),))],  # the value must move further than the clip
    "value_loss": [Move("huber", (("huber_delta", 0.01), ("clip_vloss", clip_vloss))) for clip_vloss in (False, True)],
    "huber_delta": [Move(0.01, (("value_loss", "huber"),))],
    "ent_coef": [Move(0.1)],
    "vf_coef": [Move(0.1)],
    "max_grad_norm": [Move(0.01, (("clip_grad_per_network", per_network),)) for per_network in (False, True)],
    "clip_grad_per_network": [Move(True, (("max_grad_norm", 0.01),))],
    "target_kl": [Move(1e-8, (("update_epochs", 3),))],
    "target_kl_per_minibatch": [Move(True, (("target_kl", 1e-8), ("num_minibatches", 4)))],
    "hidden_sizes": [Move((8,)), Move((8,), (("critic", "mlp"),))],
    "privileged_critic": [Move(True, (("env_id", "PendulumNoVel-v1"),))],  # a task with a critic observation
    "activation": [Move("relu")],
    "init_log_std": [Move(-2.0)],
    "action_transform": [Move("tanh")],
    "norm_obs": [Move()],
    "norm_obs_until": [Move(10, (("norm_obs", True),))],
    "norm_obs_eps": [Move(0.5, (("norm_obs", True),))],
    "norm_reward": [Move()],
    # ppo_recurrent.py: each option with a GRU and with an LSTM, with two trunks and with a shared one
    "rnn_type": [Move("lstm", (("shared_trunk", shared),)) for shared in (False, True)],
    "rnn_hidden_size": [Move(8, RNN) for RNN in RNNS],
    "rnn_layers": [Move(2, RNN) for RNN in RNNS],
    "shared_trunk": [Move(context=RNN) for RNN in RNNS],
    "heads_see_obs": [Move(context=RNN) for RNN in RNNS],
    # (the transformer's --bptt-len and --recompute-memory act in memory mode: its context, left out for the RNN)
    "bptt_len": [Move(4, (*RNN, *MEMORY)) for RNN in RNNS],
    "recompute_hidden": [Move(True, (("update_epochs", 3), *RNN)) for RNN in RNNS],
    # ppo_transformer.py: each option over the history (one token per step) and over several tokens of one step
    "context_len": [Move(3, (("num_tokens", num_tokens),)) for num_tokens in (1, 4)],
    "num_tokens": [Move(2, (("context_len", context_len),)) for context_len in (1, 8)],
    "token_dim": [Move(4, MODE) for MODE in MODES],
    "num_heads": [Move(4, MODE) for MODE in MODES],
    "num_layers": [Move(1, MODE) for MODE in MODES],
    "ff_mult": [Move(3, MODE) for MODE in MODES],
    "pre_ln": [Move(context=MODE) for MODE in MODES],
    "gated": [Move(context=MODE) for MODE in MODES],
    "small_init": [Move(context=MODE) for MODE in MODES],
    "critic": [Move(lambda args, flag: "mlp" if args.critic == "shared" else "shared", MODE) for MODE in MODES],
    "memory_tokens": [Move(2, (*MODE, ("num_minibatches", 3))) for MODE in MODES],
    "recompute_memory": [Move(True, (*MEMORY, ("bptt_len", 4), ("update_epochs", 3)))],
    "memory_gate": [Move(True, MEMORY)],
}

EXEMPT: dict[str, str] = {
    "exp_name": "names the run directory",
    "torch_deterministic": "cuDNN's algorithm choice: the tests run on the CPU, where it changes nothing",
    "cuda": "a device: the same computation elsewhere",
    "policy_device": "a device: the same computation elsewhere",
    "sim_device": "a device: the same computation elsewhere",
    "track": "logging (W&B)",
    "wandb_project_name": "logging (W&B)",
    "wandb_entity": "logging (W&B)",
    "wandb_group": "logging (W&B)",
    "capture_video": "logging (videos of env 0)",
    "video_interval": "logging (videos of env 0)",
    "progress_bar": "logging (the terminal)",
    "vectorization_mode": "where Gymnasium's envs step (this process or subprocesses): the same numbers",
    "compile": "the same computation compiled: speed only (random draws as eager)",
    "compile_mode": "torch.compile's mode: speed only (test_compile_mode_reaches_torch_compile, and "
                    "test_no_compiled_output_is_read_after_the_next_call for CUDA graphs)",
    "torch_threads": "speed only",
    "update_threads": "speed only",
    "dist_timeout_s": "a torchrun timeout",
    "checkpoint_interval": "when checkpoints are written; resume continues exactly (test_invariants)",
    "resume": "a path: continues a run (test_resume_continues_exactly_like_an_uninterrupted_run)",
    "init_from": "a path: a new run from another's network (test_a_warm_start_takes_the_network_and_normalisers_"
                 "and_nothing_else)",
    "eval_checkpoint": "a path: evaluates instead of training",
    "eval_episodes": "evaluation only",
    "eval_interval": "evaluation while training: never changes the run (tests/test_evaluation.py)",
    "export_checkpoint": "a path: exports instead of training (tests/test_export.py)",
    "scan_encoder_sizes": "acts on a task with a height scan alone (tests/test_go2_rough.py moves it); inert here",
    "scan_tokens": "acts on a task with a height scan alone (tests/test_go2_rough.py moves it); inert here",
}

# Exempt flags a tiny in-process run can move: moved, they must leave what is learnt exactly as it was (an exemption
# that hid a flag acting on the training would fail here). The others need a GPU, W&B, a renderer or a checkpoint to
# read.
UNCHANGED: dict[str, object] = {
    "exp_name": "renamed", "torch_deterministic": False, "wandb_project_name": "elsewhere", "wandb_entity": "someone",
    "wandb_group": "a-group", "video_interval": 1, "progress_bar": True, "vectorization_mode": "async",
    "torch_threads": 2, "update_threads": 2, "dist_timeout_s": 5, "checkpoint_interval": 1, "eval_episodes": 3,
    "eval_interval": 1,
    "scan_encoder_sizes": (8,), "scan_tokens": 3,  # Pendulum has no height scan
    "compile": True,  # about 15 s of compiling per script
}


def is_flag(field: dataclasses.Field) -> bool:
    """Args' fields computed at run time (batch sizes, world size) are not flags."""
    return "Suppress" not in str(field.type)


def flags_of(name: str) -> list[str]:
    return [f.name for f in dataclasses.fields(importlib.import_module(name).Args) if is_flag(f)]


def own_context(name: str, move: Move) -> tuple:
    """The move's context less the flags this script does not have."""
    flags = flags_of(name)
    return tuple((flag, value) for flag, value in move.context if flag in flags)


def cases():
    for name in SCRIPTS:
        for flag in flags_of(name):
            seen = set()
            for move in MOVES.get(flag, ()):
                context = own_context(name, move)
                if repr((move.value, context)) in seen:  # a context only another script's flags tell apart
                    continue
                seen.add(repr((move.value, context)))
                value = getattr(move.value, "__name__", repr(move.value))
                described = f"[{','.join(f'{k}={v}' for k, v in context)}]" if context else ""
                yield pytest.param(name, flag, move, id=f"{name}-{flag}={value}{described}")


class FlatRewards:
    """Wraps a task: every observation zero, rewards scaled by 1e-9 (a task whose advantages are flat)."""

    def __init__(self, vec):
        self.vec = vec

    def __getattr__(self, name):
        return getattr(self.vec, name)

    def reset(self, *args, **kwargs):
        obs, info = self.vec.reset(*args, **kwargs)
        return torch.zeros_like(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.vec.step(action)
        info = {**info, "final_obs": torch.zeros_like(info["final_obs"])}
        return torch.zeros_like(obs), reward * 1e-9, terminated, truncated, info


def settings(script, move: Move):
    """The tiny run's settings with the move's context (the flags of it this script has)."""
    return script.args(**dict(own_context(script.name, move)))


def learnt(script, monkeypatch, move: Move, flag: str | None = None, value=None) -> dict:
    """The tiny run's final parameters and per-iteration losses, with `move.context` and `flag` set to `value`."""
    args = settings(script, move)
    if flag is not None:
        args = dataclasses.replace(args, **{flag: value})
    with monkeypatch.context() as patch:
        if move.flat_rewards:
            make = script.module.envs.make
            patch.setattr(script.module.envs, "make", lambda *a, **k: FlatRewards(make(*a, **k)))
        summary = script.module.train(args)
    model = torch.load(summary["checkpoint"], weights_only=True)["model"]
    losses = [{k: v for k, v in h.items() if k.startswith("losses/")} for h in summary["history"]]
    return {"model": model, "losses": losses}


def same(a: dict, b: dict) -> bool:
    """Whether two runs learnt the same parameters and logged the same losses (to float rounding)."""
    if a["model"].keys() != b["model"].keys() or len(a["losses"]) != len(b["losses"]):
        return False
    # Parameters are compared per tensor, not per element: another thread count or CPU kernel sums in another order,
    # and an element near zero then differs by some 1e-7 absolute, while the tensor moves by under 1e-6 of its norm.
    for key, tensor in a["model"].items():
        other = b["model"][key]
        if tensor.shape != other.shape or not torch.equal(tensor.isnan(), other.isnan()):
            return False
        tensor, other = tensor.double().nan_to_num(), other.double().nan_to_num()
        if not (tensor - other).norm() <= 1e-5 * other.norm() + 1e-7:
            return False
    # A loss is a mean of float32 terms of about one (normalised advantages): its rounding is some 1e-7 however small
    # the mean (the policy loss, the KL), and compiled kernels sum in another order.
    return all(x.keys() == y.keys() and all(abs(x[k] - y[k]) <= 1e-6 + 1e-5 * abs(y[k]) for k in x)
               for x, y in zip(a["losses"], b["losses"]))


_baselines: dict = {}


@pytest.mark.parametrize("name,flag,move", cases())
def test_flag_moved_away_from_its_setting_changes_what_is_learnt(name, flag, move, in_tmp, monkeypatch):
    """Bug: a flag that does nothing (read nowhere, overwritten, or only acting in other combinations)."""
    script = script_named(name)
    setting = getattr(settings(script, move), flag)
    value = move.value(settings(script, move), flag) if callable(move.value) else move.value
    assert value != setting, f"the case does not move --{flag} (it is {setting!r} already)"
    key = (name, own_context(name, move), move.flat_rewards)
    if key not in _baselines:  # once per context, run twice: a run that differs from itself would prove nothing
        _baselines[key] = learnt(script, monkeypatch, move)
        assert same(_baselines[key], learnt(script, monkeypatch, move)), "the tiny run is not deterministic"
    baseline = _baselines[key]
    moved = learnt(script, monkeypatch, move, flag, value)
    assert not same(baseline, moved), f"--{flag} {value!r} (from {setting!r}) changed nothing that was learnt"


@pytest.mark.parametrize("name,flag", [(name, f) for name in SCRIPTS for f in flags_of(name) if f in UNCHANGED])
def test_exempt_flag_moved_leaves_what_is_learnt_unchanged(name, flag, in_tmp, monkeypatch):
    """Bug: a flag exempted as logging or speed that acts on the training (draws random numbers, reorders the data)."""
    script, move = script_named(name), Move()
    assert getattr(settings(script, move), flag) != UNCHANGED[flag]
    baseline = learnt(script, monkeypatch, move)
    assert same(baseline, learnt(script, monkeypatch, move, flag, UNCHANGED[flag])), f"--{flag} changed the run"


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_flag_is_either_moved_or_exempt_on_purpose(name):
    """Bug: a flag added without a test that it acts (nor a reason why it need not)."""
    flags = flags_of(name)
    assert not set(MOVES) & set(EXEMPT)
    untested = [flag for flag in flags if flag not in MOVES and flag not in EXEMPT]
    assert not untested, f"{name}.py: add each of {untested} to MOVES (a value where it acts) or to EXEMPT (why not)"
    known = {flag for script in SCRIPTS for flag in flags_of(script)}
    assert set(UNCHANGED) <= set(EXEMPT)
    stale = sorted((set(MOVES) | set(EXEMPT)) - known)
    assert not stale, f"MOVES or EXEMPT name flags no script has: {stale}"
