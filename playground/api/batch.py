"""The generations of one API request answered as one response.

A completions request with a list of prompts runs one generation per prompt, side by side (vLLM's batch
prompts); a chat, or a single prompt, is a batch of one. Choice `k * n + i` of the response is sample i of
prompt k, as vLLM numbers them, and the usage is the sum over the prompts.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from playground.serving.web.lifecycle import Generation, GenerationFailed, Job, Update


def renumber(done: dict[str, Any], k: int, n: int) -> dict[str, Any]:
    """Prompt k's `done` with its choices numbered in the whole response."""
    return {**done, "outputs": [{**o, "index": k * n + o["index"]} for o in done["outputs"]]}


def combine(dones: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One `done` for the response: every prompt's outputs (already renumbered), the usage summed. The cache
    receipt describes one prompt, so a batch has none."""
    if len(dones) == 1:
        return dones[0]
    keys = ("prompt_tokens", "completion_tokens", "cached_tokens")
    usage = {key: sum(d["usage"][key] for d in dones) for key in keys}
    return {"outputs": [o for d in dones for o in d["outputs"]], "usage": usage}


class Batch:
    """Admitted generations, one per job; closed together (`async with batch:`)."""

    def __init__(self, generations: list[Generation], n: int) -> None:
        self.generations = generations
        self.n = n
        self._updates = [g.updates() for g in generations]

    async def __aenter__(self) -> Batch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.gather(*(g.close() for g in self.generations))

    async def start(self, jobs: Sequence[Job]) -> list[Update]:
        """Queue every job and wait for each one's first update; raises the first GenerationFailed (a request
        the engine refuses is a 400 even when streaming was asked for)."""
        for generation, job in zip(self.generations, jobs):
            await generation.start(job)
        firsts = await asyncio.gather(*(anext(u) for u in self._updates), return_exceptions=True)
        for first in firsts:
            if isinstance(first, BaseException):
                raise first
        return firsts

    async def result(self, firsts: Sequence[Update]) -> dict[str, Any]:
        """The combined `done` (text deltas skipped: the done event carries the full texts)."""
        dones = await asyncio.gather(*(self._last(k, first) for k, first in enumerate(firsts)))
        return combine([renumber(done, k, self.n) for k, done in enumerate(dones)])

    async def _last(self, k: int, first: Update) -> dict[str, Any]:
        if first.done is not None:
            return first.done
        async for update in self._updates[k]:
            if update.done is not None:
                return update.done
        raise GenerationFailed("the request ended without a result")

    async def updates(self, firsts: Sequence[Update]) -> AsyncIterator[tuple[int, Update]]:
        """(prompt number, update) as they come, each prompt's ending with its `done`; raises GenerationFailed
        as soon as one prompt fails."""
        results: asyncio.Queue[tuple[int, Update | None, GenerationFailed | None]] = asyncio.Queue()

        async def pump(k: int) -> None:
            try:
                async for update in self._updates[k]:
                    await results.put((k, update, None))
                    if update.done is not None:
                        return
                await results.put((k, None, GenerationFailed("the request ended without a result")))
            except GenerationFailed as exc:
                await results.put((k, None, exc))

        for k, first in enumerate(firsts):
            yield k, first
        live = [k for k, first in enumerate(firsts) if first.done is None]
        pumps = [asyncio.create_task(pump(k)) for k in live]
        try:
            unfinished = len(live)
            while unfinished:
                k, update, failure = await results.get()
                if failure is not None:
                    raise failure
                yield k, update
                if update.done is not None:
                    unfinished -= 1
        finally:
            for task in pumps:
                task.cancel()
