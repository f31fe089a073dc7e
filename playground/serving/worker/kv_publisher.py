"""The KV dashboard's worker side: publish the engine's KV snapshot a few times a second while it changes.

Each GPU worker runtime owns one SnapshotPublisher. Its thread samples the engine every `interval_s`; it
publishes when the engine's figures changed since the last look, for a short while after the last change
(so tokens/s is seen falling to zero), or when a viewer asked (`kv.refresh`); an idle worker is quiet.
Summaries always go to the chat pages' group; full snapshots (block map, block tables) are built and sent
to the memory view's group only while a memory view holds a watch lease (kv_feed.py).
Request threads report finished requests through `observe`, which feeds the latency percentiles of the
snapshot and the histograms the heartbeat carries to `/metrics`.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from channels.layers import get_channel_layer
from django.core.cache import cache

from ..shared import kv_feed
from . import kv_snapshot
from .stats import LatencyStats, RequestTimes, ThroughputMeter

if TYPE_CHECKING:
    from .bridge import LoopBridge
    from .engine_service import EngineService

logger = logging.getLogger(__name__)

THROUGHPUT_WINDOW_S = 2.0
SEND_TIMEOUT_S = 5.0
ACTIONS = ("start", "stop")  # of a recording (kv_feed.RECORD)


class Publication(NamedTuple):
    """One round's snapshots: the summary for the chat pages, the full one only while a view watches."""

    summary: dict[str, Any]
    full: dict[str, Any] | None


class SnapshotPublisher:
    def __init__(self, worker: str, service: EngineService, bridge: LoopBridge, interval_s: float) -> None:
        self.worker = worker
        self.service = service
        self.bridge = bridge
        self.interval_s = interval_s
        # Publish this long after the last change: long enough for the throughput window to drain to 0.
        self.linger_s = THROUGHPUT_WINDOW_S + 2 * interval_s
        self.latency = LatencyStats()
        self._meter = ThroughputMeter(THROUGHPUT_WINDOW_S)
        self._sampler = kv_snapshot.KvSampler()
        self._last_metrics: dict[str, Any] | None = None
        self._changed_at = float("-inf")
        self._refresh = threading.Event()
        self._lease_asked = threading.Event()
        self._watched_until = float("-inf")
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="kv-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def observe(self, times: RequestTimes) -> None:
        """Record a finished request's timings (any thread)."""
        self.latency.observe(times)

    def control(self, message: dict[str, Any]) -> None:
        """Handle a dashboard message of the control group (see kv_feed.py); other messages are ignored."""
        kind = message.get("type")
        if kind == kv_feed.REFRESH:
            self._refresh.set()
            if message.get("watch"):
                self._lease_asked.set()
        elif kind == kv_feed.WATCH:
            self._lease_asked.set()
        elif kind == kv_feed.RESET_PREFIX_CACHE and message.get("worker") == self.worker:
            self.service.reset_prefix_cache()
            self._refresh.set()
        elif kind == kv_feed.RECORD and message.get("worker") == self.worker and message.get("action") in ACTIONS:
            # Off the event loop: the engine runs the call between two of its steps.
            threading.Thread(target=self._record, args=(message["action"],), name="kv-record", daemon=True).start()

    def _record(self, action: str) -> None:
        """Start or stop the engine's recording; a stopped one goes to the cache for the memory view."""
        answer: dict[str, Any] = {"type": kv_feed.RECORDING, "worker": self.worker}
        try:
            if action == "start":
                self.service.start_recording(kv_feed.RECORDING_LIMIT)
                answer.update(state="recording")
            else:
                recording = self.service.stop_recording()
                if recording is not None:
                    cache.set(kv_feed.recording_key(self.worker), recording, timeout=kv_feed.RECORDING_TTL_S)
                events = len(recording["events"]) if recording else 0
                answer.update(state="ready" if recording else "idle", events=events,
                              truncated=bool(recording and recording["truncated"]))
        except Exception as exc:
            logger.exception("could not %s the recording", action)
            answer.update(state="error", message=f"could not {action} the recording: {exc}")
        try:
            self.bridge.call(get_channel_layer().group_send(kv_feed.KV_GROUP, answer), SEND_TIMEOUT_S)
        except Exception:
            logger.exception("could not announce the recording's state")

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval_s):
            try:
                found = self.poll(time.monotonic())
                if found is not None:
                    self.publish(found)
            except Exception:
                logger.exception("could not publish a KV snapshot")

    def poll(self, now: float) -> Publication | None:
        """The snapshot to publish now (monotonic time `now`): full while a memory view watches, else a
        summary; None when there is nothing to say."""
        metrics = self.service.metrics(block_map=True)
        if not metrics.get("block_map"):
            return None  # no engine yet (loading), so no pool to show
        counters, memory = self._sampler.sample(metrics)  # every round: a map with its tables may pass once
        tokens_per_s = self._meter.sample(now, metrics.get("generation_tokens_total", 0))
        if metrics is not self._last_metrics and metrics != self._last_metrics:
            self._last_metrics = metrics
            self._changed_at = now
        if self._lease_asked.is_set():
            self._lease_asked.clear()
            self._watched_until = now + kv_feed.WATCH_LEASE_S
        asked = self._refresh.is_set()
        self._refresh.clear()
        if not asked and now - self._changed_at > self.linger_s:
            return None
        summary = kv_snapshot.build_summary(self.worker, counters, tokens_per_s, self.latency.summary(), time.time())
        if now > self._watched_until or memory is None:
            return Publication(summary, None)
        return Publication(summary, kv_snapshot.with_block_map(summary, memory))

    def publish(self, publication: Publication) -> None:
        """Send the summary to the chat pages' group and the full snapshot, if any, to the memory view's."""
        layer = get_channel_layer()
        sends = [(kv_feed.SUMMARY_GROUP, publication.summary), (kv_feed.KV_GROUP, publication.full)]
        for group, body in sends:
            if body is not None:
                message = {"type": kv_feed.SNAPSHOT, "snapshot": body}
                self.bridge.call(layer.group_send(group, message), SEND_TIMEOUT_S)
