"""The playground package sets how long OpenMP's threads spin before they sleep, before PyTorch loads its OpenMP
runtime (playground/__init__.py)."""
import os
import subprocess
import sys
from pathlib import Path

from playground import SPIN_COUNT

ROOT = Path(__file__).resolve().parents[2]


def openmp_settings(code: str, **env: str) -> str:
    """What PyTorch's OpenMP runtime says it read from the environment when it loaded, in a fresh process."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**clean, "OMP_DISPLAY_ENV": "VERBOSE", "DJANGO_SETTINGS_MODULE": "playground.settings", **env})
    assert done.returncode == 0, done.stderr
    return done.stderr


SHORT_SPIN = f"GOMP_SPINCOUNT = '{SPIN_COUNT}'"


def test_a_serving_process_s_openmp_threads_spin_briefly_before_they_sleep() -> None:
    assert SHORT_SPIN in openmp_settings("import playground, torch; torch.ones(4).sum()")


def test_without_the_playground_the_runtime_keeps_its_own_default() -> None:
    # The check above can fail: by default the runtime's threads spin 100 times longer.
    settings = openmp_settings("import torch; torch.ones(4).sum()")
    assert "GOMP_SPINCOUNT = '300000'" in settings and SHORT_SPIN not in settings


def test_an_operator_s_own_policy_or_spin_count_is_kept() -> None:
    active = openmp_settings("import playground, torch", OMP_WAIT_POLICY="ACTIVE")
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in active and SHORT_SPIN not in active
    assert "GOMP_SPINCOUNT = '0'" in openmp_settings("import playground, torch", OMP_WAIT_POLICY="PASSIVE")
    assert "GOMP_SPINCOUNT = '50'" in openmp_settings("import playground, torch", GOMP_SPINCOUNT="50")
