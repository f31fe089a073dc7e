"""Fixtures shared by the playground tests."""
import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def _fresh_cache():
    """The worker registry lives in the cache: no heartbeat leaks from one test into the next."""
    cache.clear()
    yield
    cache.clear()
