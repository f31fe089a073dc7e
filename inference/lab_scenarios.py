"""The lab's one-click scenarios: deterministic scripts (greedy or fixed seeds) that each show one idea of
PagedAttention, say what to watch, and end with a quiz whose answer is read from the engine, never written
down here.

A `ScenarioRun` adds each scripted request when the engine reaches its step, steps the session, and records
the quiz answer at the quiz's step (or when everything has finished).

A comparison scenario (`Scenario.models`) runs one sandbox per tiny model of inference/lab_models.py, each
with a pool of the same bytes (`pool_bytes`; the engine turns them into blocks), the same arrivals, stepped
together. Its snapshot is one `lanes` entry per model: the sandbox's own snapshot (its counters count the
preemptions) and the figures that compare them (bytes per token, blocks, tokens held, requests running or
waiting), all read from that sandbox's engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from inference.engine import LLMEngine
from inference.lab import LabConfig, LabRequest, LabSession
from inference.lab_models import LAB_MODELS, kv_arithmetic, lab_model_engine

SYSTEM = ("You are a patient teacher who explains how computers manage memory. Answer in one short "
          "paragraph, use plain words, and give one everyday example.")


@dataclass(frozen=True)
class Arrival:
    at_step: int  # added just before this step runs (0: before the first)
    request: LabRequest


@dataclass(frozen=True)
class Quiz:
    question: str
    answer: Callable[[ScenarioRun], int]
    at_step: int | None = None  # None: asked once every request has finished


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    watch: str
    config: LabConfig
    arrivals: tuple[Arrival, ...]
    quiz: Quiz
    models: tuple[str, ...] = ()  # a comparison: one sandbox per lab model, instead of the worker's model
    pool_bytes: int | None = None  # a comparison's pool per sandbox, in bytes (its config's num_blocks unused)

    def __post_init__(self) -> None:
        unknown = [m for m in self.models if m not in LAB_MODELS]
        if unknown or bool(self.models) != bool(self.pool_bytes):
            raise ValueError(f"scenario {self.name}: a comparison names lab models ({sorted(LAB_MODELS)}) and "
                             f"pool_bytes together, got models={self.models} pool_bytes={self.pool_bytes}")

    def describe(self) -> dict:
        """What the page lists (the quiz's answer is not part of it)."""
        return {"name": self.name, "title": self.title, "watch": self.watch, "question": self.quiz.question,
                "config": self.config.__dict__, "quiz_at_step": self.quiz.at_step}


def _blocks_held(label: str) -> Callable[[ScenarioRun], int]:
    def answer(run: ScenarioRun) -> int:
        view = next(r for r in run.session.snapshot_requests() if r["label"] == label)
        return len({b for seq in view["seqs"] for b in seq["block_table"]})
    return answer


def _shared_blocks(run: ScenarioRun) -> int:
    return sum(1 for ref_count in run.session.engine.pool_view().ref_counts if ref_count > 1)


def _cached_tokens(label: str) -> Callable[[ScenarioRun], int]:
    return lambda run: next(r for r in run.session.snapshot_requests() if r["label"] == label)["cached_tokens"]


def _contiguous_admitted(run: ScenarioRun) -> int:
    return run.session.snapshot()["contiguous"]["max_model_len"]["admitted"]


def _capacity_ratio(more: str, fewer: str) -> Callable[[ScenarioRun], int]:
    """Whole times as many tokens as `fewer`'s pool the `more` model's pool holds (blocks x block size, the
    blocks being what each engine made of the same bytes)."""
    def answer(run: ScenarioRun) -> int:
        return _token_slots(run.lane(more)) // _token_slots(run.lane(fewer))
    return answer


def _token_slots(session: LabSession) -> int:
    """Tokens the sandbox's whole pool can hold: its engine's blocks times the block size."""
    return session.engine.runner.num_blocks * session.engine.block_size


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
             lambda run: run.session.engine.metrics(block_map=False)["num_preemptions_total"]),
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
    Scenario(
        "attention_memory", "Same pool bytes: MHA, GQA and latent attention",
        "Three tiny models of the same width (random weights, so the text is gibberish: this is about memory) each "
        "get a 128 KiB KV pool, and the same eight requests arrive. A token's cache entry is smaller with grouped-"
        "query attention and smaller still with latent attention, so the same bytes make more blocks: watch how "
        "many tokens and requests each pool holds, and which one has to preempt.",
        LabConfig(num_blocks=8, block_size=8, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=256),
        tuple(Arrival(0, LabRequest(p, max_tokens=24)) for p in (
            "List three ways to save memory on a computer.", "Explain what a cache is to a child.",
            "Why do programs run out of memory?", "Describe a library that lends books by the page.",
            "What does a parking garage have in common with RAM?", "Name two things a waiter keeps in mind.",
            "How does a desk drawer work like a disk?", "Why is a notebook faster than a bookshelf?")),
        Quiz("The three pools have the same bytes. How many times as many tokens does the latent-attention (MLA) "
             "pool hold as the multi-head (MHA) pool?", _capacity_ratio("mla", "mha"), at_step=1),
        models=("mha", "gqa", "mla"), pool_bytes=128 * 1024,
    ),
)
SCENARIOS_BY_NAME = {s.name: s for s in SCENARIOS}


@dataclass
class ScenarioRun:
    """One scenario being stepped: one sandbox, or a comparison's sandboxes (one per model) in step."""

    scenario: Scenario
    sessions: tuple[LabSession, ...]
    answer: int | None = None
    _pending: list[Arrival] = field(default_factory=list)

    @classmethod
    def start(cls, name: str, shared: LLMEngine | None = None) -> ScenarioRun:
        """`shared`: the engine whose weights a sandbox reuses (a comparison's sandboxes use the lab models')."""
        try:
            scenario = SCENARIOS_BY_NAME[name]
        except KeyError:
            raise ValueError(f"unknown scenario {name!r}; one of {sorted(SCENARIOS_BY_NAME)}") from None
        if scenario.models:
            sessions = tuple(LabSession(scenario.config, shared=lab_model_engine(m), pool_bytes=scenario.pool_bytes)
                             for m in scenario.models)
        else:
            sessions = (LabSession(scenario.config, shared=shared),)
        run = cls(scenario, sessions)
        run._pending = sorted(scenario.arrivals, key=lambda a: a.at_step)
        run._admit_due()
        return run

    @property
    def session(self) -> LabSession:
        """The sandbox (a comparison's first)."""
        return self.sessions[0]

    def lane(self, model: str) -> LabSession:
        return self.sessions[self.scenario.models.index(model)]

    @property
    def step_number(self) -> int:
        return self.session.step_number  # sandboxes stepped together share it (an idle step advances it too)

    @property
    def finished(self) -> bool:
        return not self._pending and all(s.is_idle() for s in self.sessions)

    def step(self) -> dict:
        """One engine step of every sandbox with the script's arrivals; the snapshot after it, with the quiz
        once it is due."""
        snapshots = [s.step() for s in self.sessions]
        quiz = self.scenario.quiz
        if self.answer is None and (quiz.at_step == self.step_number
                                    or (quiz.at_step is None and self.finished)):
            self.answer = quiz.answer(self)
        self._admit_due()
        for snapshot, session in zip(snapshots, self.sessions):
            snapshot["requests"] = session.snapshot_requests()
        return self._shape(snapshots)

    def snapshot(self) -> dict:
        return self._shape([s.snapshot() for s in self.sessions])

    def add(self, request: LabRequest) -> str:
        """A presenter's own request, added to every sandbox (a comparison stays fair); its letter."""
        return [s.add(request) for s in self.sessions][0]

    def abort(self, label: str) -> None:
        for session in self.sessions:
            session.abort(label)

    def recording(self) -> dict:
        if self.scenario.models:
            raise ValueError("a comparison runs one pool per model; recordings are of one pool (open a lab or "
                             "another scenario to record)")
        return self.session.recording()

    def _shape(self, snapshots: list[dict]) -> dict:
        if self.scenario.models:
            snapshot = {"step": self.step_number, "idle": all(s["idle"] for s in snapshots),
                        "lanes": [self._lane(m, s, snap)
                                  for m, s, snap in zip(self.scenario.models, self.sessions, snapshots)]}
        else:
            snapshot = snapshots[0]
        snapshot["quiz_due"] = self.answer is not None
        snapshot["finished"] = self.finished
        return snapshot

    def _lane(self, model: str, session: LabSession, snapshot: dict) -> dict:
        """A comparison's sandbox: its snapshot and the engine's figures the page sets side by side."""
        metrics = session.engine.metrics(block_map=False)
        statuses = [r["status"] for r in snapshot["requests"]]
        return {
            "model": model, "title": LAB_MODELS[model].title, "snapshot": snapshot,
            "kv_bytes_per_token": metrics["kv_bytes_per_token"],
            "kv_arithmetic": kv_arithmetic(session.engine.runner.cfg, session.engine.runner.dtype),
            "pool_bytes": metrics["kv_pool_bytes"], "num_blocks": session.engine.runner.num_blocks,
            "token_slots": _token_slots(session),
            "tokens_held": sum(b["filled"] for b in snapshot["blocks"] if b["state"] == "used"),
            "requests": {k: statuses.count(k) for k in ("running", "waiting", "finished")},
        }

    def _admit_due(self) -> None:
        while self._pending and self._pending[0].at_step <= self.step_number:
            request = self._pending.pop(0).request
            for session in self.sessions:
                session.add(request)

    def check(self, guess: int) -> bool:
        if self.answer is None:
            raise ValueError("the quiz is not due yet: keep stepping")
        return guess == self.answer
