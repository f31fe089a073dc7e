"""The terminal chat streams replies and its second turn is served from the prefix cache."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_terminal_chat_two_turns():
    result = subprocess.run(
        [sys.executable, "-m", "inference.chat", "--temperature", "0", "--max-tokens", "12"],
        input="Say hello in French.\nAnd in German?\n/quit\n", capture_output=True, text=True, cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    status = re.findall(r"\[(\d+) tokens, ([\d.]+) tok/s, TTFT \d+ ms, (\d+)/(\d+) prompt tokens cached", result.stderr)
    assert len(status) == 2
    assert int(status[0][2]) == 0 and int(status[1][2]) >= 16  # turn 2 re-uses turn 1's blocks
    assert all(float(s[1]) > 0 for s in status)
    assert result.stdout.count("> ") >= 2 and len(result.stdout) > 20
