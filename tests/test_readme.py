"""README.md and docs/: the documentation keeps up with the scripts' flags, the README's commands run, the README
stays short, and nothing points outside the repository."""

import importlib
import os
import re
import shlex
from dataclasses import fields

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILLED_AT_RUN_TIME = {"world_size", "batch_size", "minibatch_size", "num_iterations", "num_sequences",
                      "init_from_steps"}


def readme_section(script: str) -> str:
    """The script's section of docs/scripts.md (what each flag does; the README links to it)."""
    with open(os.path.join(REPO, "docs", "scripts.md")) as f:
        text = f.read()
    start = text.index(f"## `{script}.py`")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def readme() -> str:
    with open(os.path.join(REPO, "README.md")) as f:
        return f.read()


def test_readme_fits_on_a_few_screens():
    """Bug: the README growing back into the manual (it was 70 KB; the rest lives in docs/)."""
    assert len(readme().encode()) <= 15_000


def test_every_script_command_in_the_readme_parses():
    """Bug: a README command with a renamed or removed flag, which a newcomer copies and sees fail."""
    commands = re.findall(r"^(?:.*&& )?python (ppo_\w+)\.py([^#\n]*)", readme(), flags=re.M)
    assert len(commands) >= 5
    for script, flags in commands:
        argv = shlex.split(flags.replace("<", "").replace(">", ""))
        args = importlib.import_module(script).parse_args(argv)  # tyro exits (status 2) on an unknown flag
        assert args.env_id, (script, argv)


@pytest.mark.parametrize("script", ["ppo_continuous", "ppo_recurrent", "ppo_transformer"])
def test_every_flag_is_documented_in_the_readme(script):
    """Bug: a flag added to a script (or renamed) without its entry in docs/scripts.md. The recurrent and transformer
    sections document their own flags and refer to ppo_continuous.py's for the shared ones."""
    documented = readme_section(script) + readme_section("ppo_continuous")
    flags = [f.name for f in fields(importlib.import_module(script).Args) if f.name not in FILLED_AT_RUN_TIME]
    missing = [name for name in flags if f"`--{name.replace('_', '-')}" not in documented]
    assert not missing, f"flags of {script}.py missing from docs/scripts.md: {missing}"


def test_nothing_in_the_repository_points_outside_it():
    """Bug: a clone that cites a design file or a checklist kept beside the repository (in a shared folder next to
    it), which a researcher who clones it does not have; the design is docs/design.md."""
    markers = ("../" + "shared", "DESIGN" + ".md")  # spelt apart, so that this file does not match itself
    assert os.path.isfile(os.path.join(REPO, "docs", "design.md"))
    outside = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("runs", "wandb", "__pycache__")]
        for name in files:
            if name.endswith((".py", ".md", ".txt", ".ini", ".sh")):
                with open(os.path.join(root, name), errors="replace") as f:
                    text = f.read()
                if any(marker in text for marker in markers):
                    outside.append(os.path.relpath(os.path.join(root, name), REPO))
    assert not outside, f"these point outside the repository: {outside}"
