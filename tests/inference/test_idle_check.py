"""The idle-engine check itself: a test that leaves a request running must fail at teardown.

Runs a small pytest session in a subprocess under the real tests/inference/conftest.py, with a test that
uses the shared engine registry the way engine tests do.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LEAKY_TESTS = '''
from inference import SamplingParams
from tests.inference.engines import get_llm


def test_clean():
    get_llm(num_kv_blocks=64, max_model_len=256).generate("Hi", SamplingParams(temperature=0, max_tokens=2))


def test_leaves_a_request_running():
    engine = get_llm(num_kv_blocks=64, max_model_len=256).llm_engine
    engine.add_request("left", "Hi", SamplingParams(max_tokens=8))
    engine.step()


def test_after_the_leak():
    engine = get_llm(num_kv_blocks=64, max_model_len=256).llm_engine
    engine.abort_request("left")
'''


@pytest.mark.slow
def test_idle_check_fails_a_test_that_leaves_a_request_running(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(REPO / "tests" / "inference" / "conftest.py", suite / "conftest.py")
    (suite / "test_leaky.py").write_text(LEAKY_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"),
                          str(suite)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert "ERROR at teardown of test_leaves_a_request_running" in out.stdout, out.stdout + out.stderr
    assert "requests left in the engine: ['left']" in out.stdout
    assert "3 passed, 1 error" in out.stdout  # the clean test and the one after the leak (it aborts it) pass
