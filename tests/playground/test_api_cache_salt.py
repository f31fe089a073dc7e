"""The per-user cache salt (PLAYGROUND_CACHE_SALT=user) on the running embedded playground: a user's
repeated prompt still hits their prefix cache, another user's identical prompt does not."""
import openai
import pytest
from api_server import MODEL, start

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "system", "content": "You are a helpful assistant who answers in exactly one short sentence, "
                                          "without lists, without greetings and without any follow-up question."},
            {"role": "user", "content": "What is a page table?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = start(tmp_path_factory.mktemp("salt"), {"PLAYGROUND_CACHE_SALT": "user"})
    yield live
    live.stop()


def cached_tokens(server, key: str) -> int:
    client = openai.OpenAI(base_url=server.api_base, api_key=key, max_retries=0, timeout=300)
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=2)
    return reply.usage.prompt_tokens_details.cached_tokens


def test_users_share_cached_blocks_only_with_themselves(server):
    alice, bob = server.api_key("alice"), server.api_key("bob")
    assert cached_tokens(server, alice) == 0
    assert cached_tokens(server, alice) > 0  # her own prompt again: served from the cache
    assert cached_tokens(server, bob) == 0  # the same prompt from someone else: no hit, nothing leaks
    assert cached_tokens(server, bob) > 0
