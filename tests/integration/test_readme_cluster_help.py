"""README "Running a cluster": "`python -m disque.tools.cluster --help` has the options: node
timeout, password, directory". The top-level --help lists only the start/stop/status
subcommands; the options are in `start --help`.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests.harness import REPO


def test_the_help_command_the_readme_names_shows_the_options_it_promises() -> None:
    readme = (REPO / "README.md").read_text()
    m = re.search(r"`(python -m disque\.tools\.cluster[^`]*--help)` has the options", readme)
    assert m, "README no longer names a --help command for the cluster tool"
    args = m.group(1).split()[1:]  # drop "python"
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=30,
                         cwd=str(REPO))
    assert out.returncode == 0
    for option in ("--timeout", "--password", "--dir"):
        assert option in out.stdout, f"{option} not in `{m.group(1)}`"
