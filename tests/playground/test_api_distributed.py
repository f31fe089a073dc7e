"""The OpenAI API in the distributed mode: daphne and a real Celery GPU worker as separate processes over
the real Redis (channels-redis carries the worker's events to the API view), with the real model. Such a
deployment requires a key, even from this machine."""
import subprocess
import sys

import openai
import pytest
import requests
from api_server import MODEL
from live_stack import REPO, running_stack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack(tmp_path_factory.mktemp("api-distributed"), ("w1@api",)) as live:
        yield live


def test_chat_streamed_and_not_over_redis(stack):
    key = subprocess.run([sys.executable, "manage.py", "create_api_key", "alice"], cwd=REPO, env=stack.env,
                         check=True, capture_output=True, text=True, timeout=120).stdout.strip()
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "Say hello."}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=6)
    streamed = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=6, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == reply.choices[0].message.content != ""
    assert reply.usage.completion_tokens == 6
    stack.wait(lambda: stack.worker_metrics("w1@api")["num_blocks_used"] == 0, 5, "the blocks to be freed")


def test_a_deployment_with_redis_requires_a_key(stack):
    payload = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
    response = requests.post(f"{stack.base_url}/v1/completions", json=payload, timeout=60)
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    placeholder = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="EMPTY", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        placeholder.models.list()
