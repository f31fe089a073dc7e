"""bin/test-postgres (what bin/setup --test runs): a private PostgreSQL where none answers, and
test_postgres failing (an error in its fixture), not skipping, under CI=true when there is none."""
import os
import re
import socket
import subprocess
import sys
import tempfile

import psycopg
import pytest
from live_stack import REPO

pytestmark = pytest.mark.slow
SCRIPT = REPO / "bin" / "test-postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_starts_a_private_cluster_with_a_test_database_and_reuses_it():
    port = free_port()
    datadir = tempfile.mkdtemp(prefix="pg-", dir="/tmp")  # the cluster's owner (postgres when root) must reach it
    try:
        first = subprocess.run([SCRIPT, str(port), datadir], capture_output=True, text=True, timeout=120)
        assert first.returncode == 0, first.stderr
        assert f"starting a private cluster in {datadir} on 127.0.0.1:{port}" in first.stdout
        with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=test", connect_timeout=5) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("test",)
        again = subprocess.run([SCRIPT, str(port), datadir], capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "starting" not in again.stdout  # one that answers is used as it is
    finally:
        subprocess.run([SCRIPT, "--stop", datadir], capture_output=True, timeout=60)
        subprocess.run(["rm", "-rf", datadir], check=True)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=test", connect_timeout=2)


@pytest.mark.parametrize("ci, outcome", [("true", "error"), ("", "skipped")])
def test_postgres_test_fails_under_ci_where_no_server_answers(ci, outcome):
    env = {**os.environ, "CI": ci, "TEST_POSTGRES_DSN": f"host=127.0.0.1 port={free_port()} user=postgres dbname=test"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/playground/test_postgres.py"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    # Every test of the module ends so (errors under CI, skips elsewhere), none passes or fails otherwise.
    summary = out.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"\d+ {outcome}s? in [\d.]+s", summary) and "no PostgreSQL at" in out.stdout, out.stdout[-2000:]
    assert (out.returncode == 0) == (ci != "true")
