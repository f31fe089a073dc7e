"""The worker's lab sandboxes (inference.lab): one per presenter, sharing this worker's weights, never its pool.

Commands arrive on the channel-layer group `lab_worker_group(worker)` as `lab.command` {lab_id, command,
args} (sent by playground.lab.consumers). The `lab` thread hands them, one at a time, to the engine loop as
background calls (StreamingEngine.call_in_background): a sandbox's forward runs on the loop's own thread,
in the gaps the live requests leave (at most a few percent of a busy loop's time), so a lab never competes
with the live batch for the cores and the event loop never runs a forward. Each command answers the lab's
own group `lab_group(lab_id)` with `lab.reply` {lab_id, reply}; a reply is a snapshot, a quiz verdict, a
recording or an error. A lab unused for `idle_s` is closed; a worker hosts at most `max_sessions` labs.

Commands (their arguments are checked by inference.lab, whose limits `open` sends to the page):
    open {config: {...}} | {scenario: name}    start a fresh sandbox (replacing this lab's previous one)
    add {prompt, max_tokens, n, temperature, seed, beam_width}
    step                                      one engine step (with a scenario's scripted arrivals)
    abort {label}
    answer {guess}                            check the scenario's quiz against the engine's figure
    recording                                 the event log as a replayable JSON recording
    close
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from channels.layers import get_channel_layer

from ..shared.naming import LAB_COMMANDS, WORKER_CHANNEL_PREFIX, lab_group, lab_worker_group
from .bridge import LoopBridge
from .coalesce import SEND_TIMEOUT_S
from .engine_service import EngineService, EngineUnavailable

if TYPE_CHECKING:
    from inference.lab import LabSession
    from inference.lab_scenarios import ScenarioRun

logger = logging.getLogger(__name__)



@dataclass
class Lab:
    session: LabSession
    scenario: ScenarioRun | None
    last_used: float

    @property
    def driver(self) -> LabSession | ScenarioRun:
        """What answers add, abort, snapshot and recording: the scenario's run (a comparison has several
        sandboxes) or the plain sandbox."""
        return self.scenario or self.session


class LabHost:
    def __init__(self, worker: str, service: EngineService, bridge: LoopBridge, idle_s: float,
                 max_sessions: int) -> None:
        self.worker = worker
        self.service = service
        self.bridge = bridge
        self.idle_s = idle_s
        self.max_sessions = max_sessions
        self.labs: dict[str, Lab] = {}  # touched only on the engine loop thread
        self._inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="lab", daemon=True)
        self._listener = None

    def start(self) -> None:
        self._thread.start()
        self._listener = self.bridge.submit(self._listen())

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
        self._inbox.put(None)

    @property
    def num_sessions(self) -> int:
        return len(self.labs)

    # --- the event loop side: receive and queue -------------------------------------------------
    async def _listen(self) -> None:
        layer = get_channel_layer()
        while True:
            try:
                channel = await layer.new_channel(WORKER_CHANNEL_PREFIX)
                await layer.group_add(lab_worker_group(self.worker), channel)
                while True:
                    message = await layer.receive(channel)
                    if message.get("type") == "lab.command":
                        self._inbox.put(message)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("lab listener failed; joining its group again")
                await asyncio.sleep(1)

    # --- the lab thread: pass commands to the engine loop, send the replies --------------------------
    def _run(self) -> None:
        from inference import EngineDeadError

        while True:
            try:
                message = self._inbox.get(timeout=min(self.idle_s, 30.0))
            except queue.Empty:
                message = {}
            if message is None:
                return
            lab_id = message.get("lab_id")

            def on_loop(_engine: Any) -> tuple[list[str], dict[str, Any] | None]:
                closed = self._sweep()
                if not message:
                    return closed, None
                try:
                    return closed, self.handle(lab_id, message.get("command"), message.get("args") or {})
                except ValueError as exc:  # a bad command: the sweep's closures still go out
                    return closed, {"type": "error", "message": str(exc)}

            try:
                closed, reply = self.service.wait_ready(0).call_in_background(on_loop).result()
            except (ValueError, EngineUnavailable, EngineDeadError) as exc:
                closed, reply = [], {"type": "error", "message": str(exc)}
            except Exception as exc:
                logger.exception("lab %s: %s failed", lab_id, message.get("command"))
                closed, reply = [], {"type": "error", "message": f"the lab failed: {type(exc).__name__}"}
            for idle_lab in closed:
                self._send(idle_lab, {"type": "closed", "message": "this lab was idle too long and was closed"})
            if message and reply is not None:
                self._send(lab_id, reply)

    # --- the engine loop thread (background calls): the sandboxes themselves ------------------------
    def _sweep(self) -> list[str]:
        """Close the labs unused for idle_s; their ids."""
        now = time.monotonic()
        closed = [k for k, lab in self.labs.items() if now - lab.last_used > self.idle_s]
        for lab_id in closed:
            del self.labs[lab_id]
        return closed

    def _send(self, lab_id: str, reply: dict[str, Any]) -> None:
        layer = get_channel_layer()
        try:
            self.bridge.call(layer.group_send(lab_group(lab_id), {"type": "lab.reply", "reply": reply}),
                             SEND_TIMEOUT_S)
        except Exception:
            logger.exception("lab %s: could not send its reply", lab_id)

    def handle(self, lab_id: str, command: str, args: dict[str, Any]) -> dict[str, Any] | None:
        """Run one command for one lab (engine loop thread only); the reply for the lab's page."""
        from inference.lab import LAB_LIMITS, LabConfig, LabRequest, LabSession
        from inference.lab_scenarios import SCENARIOS, ScenarioRun

        if not isinstance(lab_id, str) or command not in LAB_COMMANDS:
            raise ValueError(f"unknown lab command {command!r}")
        if command == "close":
            self.labs.pop(lab_id, None)
            return None
        if command == "open":
            if lab_id not in self.labs and len(self.labs) >= self.max_sessions:
                raise ValueError(f"this worker already hosts {self.max_sessions} labs; try again later")
            shared = self.service.wait_ready(0).engine  # this runs on its loop thread: the weights' owner
            if args.get("scenario"):
                run = ScenarioRun.start(str(args["scenario"]), shared=shared)
                lab = Lab(run.session, run, time.monotonic())
            else:
                lab = Lab(LabSession(LabConfig(**_fields(args.get("config") or {}, LabConfig)), shared=shared),
                          None, time.monotonic())
            self.labs[lab_id] = lab
            return {"type": "ready", "worker": self.worker, "limits": LAB_LIMITS,
                    "scenarios": [s.describe() for s in SCENARIOS],
                    "scenario": lab.scenario.scenario.describe() if lab.scenario else None,
                    "snapshot": lab.driver.snapshot()}
        lab = self.labs.get(lab_id)
        if lab is None:
            raise ValueError("this lab is not open (it may have been closed while idle): open it again")
        lab.last_used = time.monotonic()
        if command == "add":
            lab.driver.add(LabRequest(**_fields(args, LabRequest)))
            return {"type": "snapshot", "snapshot": lab.driver.snapshot()}
        if command == "step":
            snapshot = lab.scenario.step() if lab.scenario else lab.session.step()
            return {"type": "snapshot", "snapshot": snapshot}
        if command == "abort":
            lab.driver.abort(str(args.get("label")))
            return {"type": "snapshot", "snapshot": lab.driver.snapshot()}
        if command == "answer":
            if lab.scenario is None:
                raise ValueError("only a scenario has a quiz")
            guess = args.get("guess")
            if isinstance(guess, bool) or not isinstance(guess, int):
                raise ValueError("the answer must be a whole number")
            return {"type": "quiz", "correct": lab.scenario.check(guess), "answer": lab.scenario.answer}
        return {"type": "recording", "recording": lab.driver.recording()}


def _fields(args: Any, cls: type) -> dict[str, Any]:
    """Only the dataclass's own fields; anything else is an error naming it (no silent ignoring)."""
    if not isinstance(args, dict):
        raise ValueError(f"expected an object of {cls.__name__} fields")
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(map(str, unknown))}")
    return args
