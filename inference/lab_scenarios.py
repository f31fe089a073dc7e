"""The lab's one-click scenarios: deterministic scripts (greedy or fixed seeds) that each show one idea of
PagedAttention, say what to watch, and end with a quiz whose answer is read from the engine, never written
down here.

A `ScenarioRun` adds each scripted request when the engine reaches its step, steps the session, and records
the quiz answer at the quiz's step (or when everything has finished).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from inference.engine import LLMEngine
from inference.lab import LabConfig, LabRequest, LabSession

SYSTEM = ("You are a patient teacher who explains how computers manage memory. Answer in one short "
          "paragraph, use plain words, and give one everyday example.")


@dataclass(frozen=True)
class Arrival:
    at_step: int  # added just before this step runs (0: before the first)
    request: LabRequest


@dataclass(frozen=True)
class Quiz:
    question: str
    answer: Callable[[LabSession], int]
    at_step: int | None = None  # None: asked once every request has finished


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    watch: str
    config: LabConfig
    arrivals: tuple[Arrival, ...]
    quiz: Quiz

    def describe(self) -> dict:
        """What the page lists (the quiz's answer is not part of it)."""
        return {"name": self.name, "title": self.title, "watch": self.watch, "question": self.quiz.question,
                "config": self.config.__dict__, "quiz_at_step": self.quiz.at_step}


def _blocks_held(label: str) -> Callable[[LabSession], int]:
    def answer(session: LabSession) -> int:
        view = next(r for r in session.snapshot_requests() if r["label"] == label)
        return len({b for seq in view["seqs"] for b in seq["block_table"]})
    return answer


def _shared_blocks(session: LabSession) -> int:
    return sum(1 for ref_count in session.engine.pool_view().ref_counts if ref_count > 1)


def _cached_tokens(label: str) -> Callable[[LabSession], int]:
    return lambda session: next(r for r in session.snapshot_requests() if r["label"] == label)["cached_tokens"]


def _contiguous_admitted(session: LabSession) -> int:
    return session.snapshot()["contiguous"]["max_model_len"]["admitted"]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "fragmentation", "Fragmentation vs paging",
        "Four requests with different lengths share a 32-block pool. Paging hands out one block at a time, so all "
        "four run at once; compare the contiguous bar, where each request reserves max_model_len up front.",
        LabConfig(num_blocks=32, block_size=8, max_model_len=128),
        tuple(Arrival(0, LabRequest(p, max_tokens=m)) for p, m in (
            ("Name three colours.", 12), ("Write one line about the moon.", 24),
            ("What is 2 + 2?", 6), ("Describe a cat in five words.", 16))),
        Quiz("With max_model_len reservations, how many of these four requests would a contiguous allocator "
             "admit at once?", _contiguous_admitted, at_step=1),
    ),
    Scenario(
        "parallel_sampling", "Parallel sampling and copy-on-write",
        "One prompt, four samples (n=4). The prompt is computed once; the samples share its blocks by reference "
        "(ref count 4). When each writes its first token into the shared partial block, copy-on-write gives it "
        "a private copy; full blocks stay shared.",
        LabConfig(num_blocks=32, block_size=8, max_model_len=128),
        (Arrival(0, LabRequest("Tell me a very short story about a robot who learns to paint.", max_tokens=12,
                                n=4, temperature=0.9, seed=7)),),
        Quiz("Right after step 2, how many physical blocks do the 4 samples hold together?", _blocks_held("A"),
             at_step=2),
    ),
    Scenario(
        "beam_search", "Beam search shares its history",
        "Beam search keeps the 4 best continuations. Beams chosen twice are forked (shared blocks); a beam "
        "nobody chose is freed at once.",
        LabConfig(num_blocks=48, block_size=8, max_model_len=128),
        (Arrival(0, LabRequest("The best way to learn a language is", max_tokens=12, beam_width=4)),),
        Quiz("At the end of step 5, how many physical blocks are held by more than one beam?", _shared_blocks,
             at_step=5),
    ),
    Scenario(
        "shared_prefix", "A shared system prompt hits the prefix cache",
        "Three users send questions after the same system prompt, a few steps apart. The later ones find the "
        "system prompt's full blocks in the prefix cache (touched, not allocated) and skip computing them.",
        LabConfig(num_blocks=48, block_size=8, max_model_len=128),
        (Arrival(0, LabRequest(SYSTEM + " What is a page?", max_tokens=8)),
         Arrival(3, LabRequest(SYSTEM + " What is a cache?", max_tokens=8)),
         Arrival(6, LabRequest(SYSTEM + " Why free memory?", max_tokens=8))),
        Quiz("How many of request C's prompt tokens were served from the prefix cache?", _cached_tokens("C")),
    ),
    Scenario(
        "preemption", "Memory pressure and preemption",
        "Three long replies in a 12-block pool. When a running request needs a block and none is free, the "
        "newest running request is preempted: its blocks are freed and it is recomputed later.",
        LabConfig(num_blocks=12, block_size=8, max_model_len=96, max_num_seqs=4),
        tuple(Arrival(0, LabRequest(p, max_tokens=40)) for p in (
            "List the planets of the solar system.", "Explain rain to a child.", "Describe your ideal day.")),
        Quiz("How many preemptions did the engine make before all three finished?",
             lambda session: session.engine.metrics(block_map=False)["num_preemptions_total"]),
    ),
    Scenario(
        "lru_eviction", "LRU eviction of cached blocks",
        "Request A finishes and its full blocks stay cached (ref count 0, hashed). B and C then need the room: "
        "the pool hands out never-used blocks first, then evicts cached ones, least recently released first. "
        "D repeats A's prompt and finds only what was not evicted.",
        LabConfig(num_blocks=16, block_size=8, max_model_len=128),
        (Arrival(0, LabRequest(SYSTEM, max_tokens=4)),
         Arrival(6, LabRequest("Count from one to thirty in words, separated by commas.", max_tokens=56)),
         Arrival(6, LabRequest("Spell the word elephant letter by letter.", max_tokens=32)),
         Arrival(70, LabRequest(SYSTEM, max_tokens=4))),
        Quiz("How many of request D's prompt tokens were still in the prefix cache?", _cached_tokens("D")),
    ),
)
SCENARIOS_BY_NAME = {s.name: s for s in SCENARIOS}


@dataclass
class ScenarioRun:
    """One scenario being stepped in its own sandbox."""

    scenario: Scenario
    session: LabSession
    answer: int | None = None
    _pending: list[Arrival] = field(default_factory=list)

    @classmethod
    def start(cls, name: str, shared: LLMEngine | None = None) -> ScenarioRun:
        try:
            scenario = SCENARIOS_BY_NAME[name]
        except KeyError:
            raise ValueError(f"unknown scenario {name!r}; one of {sorted(SCENARIOS_BY_NAME)}") from None
        run = cls(scenario, LabSession(scenario.config, shared=shared))
        run._pending = sorted(scenario.arrivals, key=lambda a: a.at_step)
        run._admit_due()
        return run

    @property
    def finished(self) -> bool:
        return not self._pending and self.session.is_idle()

    def step(self) -> dict:
        """One engine step with the script's arrivals; the snapshot after it, with the quiz once it is due."""
        snapshot = self.session.step()
        quiz = self.scenario.quiz
        if self.answer is None and (quiz.at_step == self.session.step_number
                                    or (quiz.at_step is None and not self._pending and self.session.is_idle())):
            self.answer = quiz.answer(self.session)
        self._admit_due()
        snapshot["requests"] = self.session.snapshot_requests()
        snapshot["quiz_due"] = self.answer is not None
        snapshot["finished"] = self.finished
        return snapshot

    def _admit_due(self) -> None:
        while self._pending and self._pending[0].at_step <= self.session.step_number:
            self.session.add(self._pending.pop(0).request)

    def check(self, guess: int) -> bool:
        if self.answer is None:
            raise ValueError("the quiz is not due yet: keep stepping")
        return guess == self.answer
