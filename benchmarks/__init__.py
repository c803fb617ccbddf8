"""Benchmarks, probes and experiment runners: docs/benchmarks.md lists them with the commands that ran them."""

import sys


def choose_variant(variants: dict, doc: str, script) -> str:
    """For the scripts that run ppo_continuous.py (`script`) with one thing changed: the command line's first word
    names the change, taken off it (the rest are the script's flags); `--help` prints `doc`, an unknown word ends with
    one line. The run's last lines then tell the user to evaluate and resume through this command and word, not the
    plain script (which would drop the change)."""
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(doc)
        raise SystemExit(0)
    if len(sys.argv) < 2 or sys.argv[1] not in variants:
        print(f"error: the first word names the variant, one of {', '.join(variants)} (then ppo_continuous.py's "
              "flags)", file=sys.stderr)
        raise SystemExit(2)
    variant = sys.argv.pop(1)
    script.LAUNCHED_AS = f"{sys.argv[0]} {variant}"
    return variant
