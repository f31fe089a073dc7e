"""The playground package sets OpenMP's wait policy before PyTorch loads its OpenMP runtime (playground/__init__.py)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def openmp_settings(code: str, **env: str) -> str:
    """What PyTorch's OpenMP runtime says it read from the environment when it loaded, in a fresh process."""
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**clean, "OMP_DISPLAY_ENV": "VERBOSE", "DJANGO_SETTINGS_MODULE": "playground.settings", **env})
    assert done.returncode == 0, done.stderr
    return done.stderr


# libgomp prints an unset policy as PASSIVE too; what tells them apart is how long a thread spins before it sleeps.
SLEEPS_AT_ONCE = "GOMP_SPINCOUNT = '0'"


def test_a_serving_process_s_openmp_threads_sleep_between_parallel_regions() -> None:
    assert SLEEPS_AT_ONCE in openmp_settings("import playground, torch; torch.ones(4).sum()")


def test_without_the_playground_the_runtime_keeps_its_own_default() -> None:
    # The check above can fail: by default the runtime's threads spin a while first.
    assert SLEEPS_AT_ONCE not in openmp_settings("import torch; torch.ones(4).sum()")


def test_an_operator_s_own_policy_is_kept() -> None:
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in openmp_settings("import playground, torch", OMP_WAIT_POLICY="ACTIVE")
