"""How a run's PPO updates went, per stretch of training: how many epochs the KL stop let run, the updates' KL (mean,
and the largest with the step it came at), the clip fraction, and the evaluations in the same stretch. It reads the
scalars every script logs (`charts/update_epochs_done`, `losses/approx_kl`, `losses/clipfrac`, `eval/*`), so a
collapse can be matched to the update that caused it:

    python benchmarks/update_stats.py --run-dirs runs/FrankaStackCube-v0__stack_cmdopen__2__<time> \\
        --bin-steps 1000000 --eval-tag eval/success

Prints one Markdown table per run (and writes them to --out if given).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import tyro

EPOCHS, KL, CLIPFRAC = "charts/update_epochs_done", "losses/approx_kl", "losses/clipfrac"


@dataclass
class Args:
    run_dirs: tuple[str, ...]
    """the runs' directories (runs/<run>), each with its TensorBoard events"""
    bin_steps: int = 1_000_000
    """the stretch of environment steps each row covers"""
    eval_tag: str = "eval/success"
    """the evaluation scalar listed per row (eval/return for tasks without success)"""
    out: str | None = None
    """a Markdown file to write the tables to (None: print only)"""


def read_scalars(run_dir: str) -> dict[str, dict[int, float]]:
    """Every scalar of a run's events, as {tag: {step: value}} (the last value where a step was logged twice, as
    after a resume)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not os.path.isdir(run_dir):
        raise SystemExit(f"--run-dirs: {run_dir} is not a directory (pass runs/<run>)")
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {event.step: event.value for event in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def update_rows(scalars: dict[str, dict[int, float]], bin_steps: int, eval_tag: str) -> list[dict]:
    """One row per stretch of `bin_steps` with an update in it: the updates' mean epochs done, mean and largest KL
    (and the step of the largest), mean clip fraction, and the evaluations' values in step order."""
    if KL not in scalars:
        raise SystemExit(f"the run logged no {KL}: not a run of one of the scripts")
    stretches: dict[int, list[int]] = {}
    for step in sorted(scalars[KL]):
        stretches.setdefault(step // bin_steps, []).append(step)
    evaluations = scalars.get(eval_tag, {})
    rows = []
    for index, steps in sorted(stretches.items()):
        kls = [scalars[KL][step] for step in steps]
        largest = max(range(len(steps)), key=kls.__getitem__)
        rows.append({
            "from": index * bin_steps, "updates": len(steps),
            "epochs": sum(scalars.get(EPOCHS, {}).get(step, float("nan")) for step in steps) / len(steps),
            "kl_mean": sum(kls) / len(kls), "kl_max": kls[largest], "kl_max_step": steps[largest],
            "clipfrac": sum(scalars.get(CLIPFRAC, {}).get(step, float("nan")) for step in steps) / len(steps),
            "evals": [evaluations[step] for step in sorted(evaluations)
                      if index * bin_steps <= step < (index + 1) * bin_steps]})
    return rows


def table(run_dir: str, rows: list[dict], eval_tag: str) -> str:
    lines = [f"### {os.path.basename(os.path.normpath(run_dir))}", "",
             f"| from step | updates | epochs done | KL mean | KL max (at step) | clip fraction | {eval_tag} |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        evals = " ".join(f"{value:.2f}" for value in row["evals"]) or "-"
        lines.append(f"| {row['from']:,} | {row['updates']} | {row['epochs']:.2f} | {row['kl_mean']:.3f} | "
                     f"{row['kl_max']:.3f} ({row['kl_max_step']:,}) | {row['clipfrac']:.2f} | {evals} |")
    return "\n".join(lines) + "\n"


def main(args: Args) -> str:
    if args.bin_steps <= 0:
        raise SystemExit(f"--bin-steps must be positive (got {args.bin_steps})")
    text = "\n".join(table(run_dir, update_rows(read_scalars(run_dir), args.bin_steps, args.eval_tag), args.eval_tag)
                     for run_dir in args.run_dirs)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out + ".tmp", "w") as file:
            file.write(text)
        os.replace(args.out + ".tmp", args.out)
    return text


if __name__ == "__main__":
    print(main(tyro.cli(Args)))
