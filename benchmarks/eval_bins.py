"""Trained policies of a randomised task evaluated per bin of its hidden parameters: where memory should matter.

    python benchmarks/run.py --preset push_memory --exp-name pushmem    # FrankaPushCubeRandom-v0, three scripts
    python benchmarks/eval_bins.py --env-id FrankaPushCubeRandom-v0 \\
        --exp-names pushmem pushmem_recurrent pushmem_transformer --stem frankapushcuberandom_bins

Each run's last periodic checkpoint is evaluated by its own script's evaluate() (mean action, frozen normaliser,
fresh episodes) once per bin, with the task's randomisation ranges narrowed to that bin (its `env_kwargs`, as
`--eval-checkpoint ... --env-kwargs` takes them: on top of the run's own options). A memoryless policy
has to act the same whatever the hidden parameters are; one with memory can adapt, so its gain should show in
the bins far from the average. Writes <stem>.md (success at the end / at any step, and the return, per bin, mean ± std
over seeds); results are cached in the run directories (eval_bins_<episodes>.json).
"""

from __future__ import annotations

import glob
import json
import os
import sys
from dataclasses import dataclass

import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.eval_compare import METRICS, fmt, mean_std, script_module  # noqa: E402
from benchmarks.report import script_of  # noqa: E402

# Per task, bins of its hidden parameters as env kwargs. FrankaPushCubeRandom-v0: the cube slides with the larger
# of the cube's and the table's friction, so both are narrowed; the corners of [0.05, 1] kg x [0.05, 1] friction.
BINS = {
    "FrankaPushCubeRandom-v0": {
        f"{mass_name}, {friction_name}": dict(cube_mass_range=mass, cube_friction_range=friction,
                                              table_friction_range=friction)
        for mass_name, mass in (("light (0.05-0.2 kg)", [0.05, 0.2]), ("heavy (0.8-1 kg)", [0.8, 1.0]))
        for friction_name, friction in (("slippery (friction 0.05-0.2)", [0.05, 0.2]),
                                        ("grippy (friction 0.8-1)", [0.8, 1.0]))
    },
    # FrankaReachDelay-v0: each delay the task draws (0-3 agent steps of 20 ms) alone.
    "FrankaReachDelay-v0": {f"delay {delay} ({20 * delay} ms)": dict(min_action_delay=delay, max_action_delay=delay)
                            for delay in range(4)},
}


@dataclass
class Args:
    env_id: str
    """the randomised task the runs trained on (one with bins in BINS)"""
    exp_names: tuple[str, ...]
    """experiments to compare (run directories runs/<env-id>__<exp-name>__<seed>__<time>)"""
    episodes: int = 500
    """evaluation episodes per bin and run"""
    runs_dir: str = "runs"
    """where the run directories are"""
    out_dir: str = "benchmarks/results/franka_cube"
    """where the Markdown table goes"""
    stem: str = "eval_bins"
    """file name of the table"""


def evaluate_with_env_kwargs(module, checkpoint_path: str, step: int, env_kwargs: dict, episodes: int,
                             capture_video: bool = False) -> dict:
    """The script's evaluate() of the checkpoint at `checkpoint_path` (written at `step`) with `env_kwargs` on top of
    its run's own options (ranges as tuples, as the command line gives them), with the step. `capture_video`: env 0's
    first episode to the run's videos/eval.mp4."""
    env_kwargs = {key: tuple(value) if isinstance(value, list) else value for key, value in env_kwargs.items()}
    result = module.evaluate(checkpoint_path, episodes=episodes, capture_video=capture_video, device="cpu",
                             sim_device="cpu", env_kwargs=env_kwargs)
    return dict(result, step=step)


def evaluate_bins(run_dir: str, module, bins: dict[str, dict], episodes: int) -> dict[str, dict]:
    """{bin: the script's evaluate() of the run's last periodic checkpoint with the bin's env kwargs}, cached."""
    checkpoint_path = sorted(glob.glob(os.path.join(run_dir, "checkpoint_[0-9]*.pt")))[-1]
    cache_path = os.path.join(run_dir, f"eval_bins_{episodes}.json")
    cache = {}
    if os.path.exists(cache_path):
        with open(cache_path) as f:
            cache = json.load(f)
    key = os.path.basename(checkpoint_path)
    results = cache.setdefault(key, {})
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    for name, env_kwargs in bins.items():
        if name in results:
            continue
        results[name] = evaluate_with_env_kwargs(module, checkpoint_path, checkpoint["global_step"], env_kwargs,
                                                 episodes)
        with open(cache_path + ".tmp", "w") as f:
            json.dump(cache, f)
        os.replace(cache_path + ".tmp", cache_path)
    return results


def main(args: Args) -> str:
    if args.env_id not in BINS:
        raise SystemExit(f"error: --env-id {args.env_id} has no bins; choose one of {', '.join(BINS)}")
    bins = BINS[args.env_id]
    groups = {}
    for exp_name in args.exp_names:
        runs = []
        for run_dir in sorted(glob.glob(os.path.join(args.runs_dir, f"{args.env_id}__{exp_name}__*__*"))):
            with open(os.path.join(run_dir, "args.json")) as f:
                saved = json.load(f)
            if glob.glob(os.path.join(run_dir, "checkpoint_[0-9]*.pt")):
                runs.append(dict(seed=saved["seed"], script=script_of(saved),
                                 bins=evaluate_bins(run_dir, script_module(saved), bins, args.episodes)))
        if runs:
            groups[exp_name] = sorted(runs, key=lambda r: r["seed"])
    if not groups:
        raise SystemExit(f"error: no runs of --exp-names {' '.join(args.exp_names)} on {args.env_id} with a periodic "
                         f"checkpoint under --runs-dir {args.runs_dir}; train them first (benchmarks/run.py)")
    metrics = [m for m in ("success_rate", "success_once", "mean_return")
               if all(m in r["bins"][b] for runs in groups.values() for r in runs for b in bins)]

    lines = [f"{args.env_id}: the last checkpoint of each run, {args.episodes} evaluation episodes per bin of the "
             "hidden parameters (mean action). Mean ± std (population) over seeds; per seed in brackets, in seed "
             "order.", ""]
    for metric in metrics:
        lines += [f"Eval {METRICS[metric]}:", "",
                  "| experiment | script | seeds | steps | " + " | ".join(bins) + " |",
                  "|---|---|---:|---:|" + "---|" * len(bins)]
        for exp_name, runs in groups.items():
            steps = sorted({r["bins"][b]["step"] for r in runs for b in bins})
            cells = [f"**{mean_std([r['bins'][b][metric] for r in runs], metric)}** "
                     f"({', '.join(fmt(r['bins'][b][metric], metric) for r in runs)})" for b in bins]
            lines.append(f"| {exp_name} | {runs[0]['script']} | {len(runs)} | {', '.join(f'{s:,}' for s in steps)} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    text = "\n".join(lines)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"{args.stem}.md"), "w") as f:
        f.write(text)
    print(text)
    return text


if __name__ == "__main__":
    main(tyro.cli(Args))
