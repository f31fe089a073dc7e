"""Suite-wide settings: tests run offline, on the CPU, with a fixed number of threads."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Test processes (the two pytest workers bin/test starts, and the servers and workers they start) share two
# cores: one OpenMP thread each avoids the oversubscription that made small torch ops up to 100x slower when
# several spin at once.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# No GPU here or in CI: Triton kernels run under Triton's interpreter on CPU tensors. It must be set
# before triton is first imported, by any test module.
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(tmp_path_factory, django_db_modify_db_settings_parallel_suffix) -> None:
    """SQLite's test database in a file, as the product runs it (a writer waits its turn for the lock), not Django's
    shared-cache in-memory one: there a write that meets another thread's open read fails at once with "database
    table is locked" instead of waiting (the ASGI fuzz test, whose API requests and socket turns write from
    several threads, failed so in one run of two). pytest-django's own hook for changing the test database."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        database.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.mktemp("database") / "test.sqlite3")
