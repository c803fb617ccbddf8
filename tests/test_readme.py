"""README.md: the documentation keeps up with the scripts' flags."""

import importlib
import os
from dataclasses import fields

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILLED_AT_RUN_TIME = {"world_size", "batch_size", "minibatch_size", "num_iterations", "num_sequences"}


def readme_section(script: str) -> str:
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    start = readme.index(f"## `{script}.py`")
    return readme[start : readme.index("\n## ", start + 1)]


@pytest.mark.parametrize("script", ["ppo_continuous", "ppo_recurrent", "ppo_transformer"])
def test_every_flag_is_documented_in_the_readme(script):
    """Bug: a flag added to a script (or renamed) without its README entry. The recurrent and transformer
    sections document their own flags and refer to ppo_continuous.py's for the shared ones."""
    documented = readme_section(script) + readme_section("ppo_continuous")
    flags = [f.name for f in fields(importlib.import_module(script).Args) if f.name not in FILLED_AT_RUN_TIME]
    missing = [name for name in flags if f"`--{name.replace('_', '-')}" not in documented]
    assert not missing, f"flags of {script}.py missing from README.md: {missing}"


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
