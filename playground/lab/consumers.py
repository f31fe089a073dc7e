"""LabConsumer: the /ws/lab/ socket of the lab page, a relay between one presenter and one sandbox.

Each socket is one lab (its own id, so two presenters never see each other's pools). The consumer picks a
ready worker with room for another lab, forwards the page's commands to it (`lab.command` on the worker's lab
group) and relays the worker's replies (`lab.reply` on the lab's group) back. The sandbox, its limits and its
scenarios live on the worker (playground/serving/worker/lab_host.py, inference/lab.py): this side checks only
the frame's shape and who may use the lab, and gives an error when the worker does not answer in time.
"""
import asyncio
import uuid
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from playground.accounts.access import may_use_playground
from playground.serving.shared import registry
from playground.serving.shared.naming import LAB_COMMANDS, lab_group, lab_worker_group
from playground.serving.web.edge import CLOSE_CODES, InvalidInput, decode_frame


def pick_worker(workers: list[dict[str, Any]]) -> str | None:
    """The ready worker hosting the fewest labs, among those with room for one more."""
    roomy = [w for w in workers if w.get("state") == "ready"
             and w.get("labs", {}).get("sessions", 0) < w.get("labs", {}).get("max_sessions", 0)]
    return min(roomy, key=lambda w: w["labs"]["sessions"])["name"] if roomy else None


class LabConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        if not may_use_playground(self.scope.get("user")):
            await self.close(code=CLOSE_CODES["login_required"])
            return
        self.lab_id = uuid.uuid4().hex
        self.worker: str | None = None
        self.deadline: asyncio.TimerHandle | None = None
        await self.channel_layer.group_add(lab_group(self.lab_id), self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "lab_id", None) is None:
            return
        self._clear_deadline()
        if self.worker is not None:
            await self._forward("close", {})
        await self.channel_layer.group_discard(lab_group(self.lab_id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            frame = decode_frame(text_data, settings.PLAYGROUND_LIMITS)
            command = frame.pop("type", None)
            if command not in LAB_COMMANDS or command == "close":
                raise InvalidInput(f"type must be one of {', '.join(c for c in LAB_COMMANDS if c != 'close')}")
            if command == "open" or self.worker is None:
                if command != "open":
                    raise InvalidInput("open a lab first")
                self.worker = await self._choose_worker()
            await self._forward(command, frame)
        except InvalidInput as exc:
            await self.send_json({"type": "error", "message": str(exc)})

    async def _choose_worker(self) -> str:
        """Keep this lab's worker while it is alive (the sandbox lives there); else the roomiest one."""
        if self.worker is not None and await registry.aget(self.worker) is not None:
            return self.worker
        worker = pick_worker(await registry.alive_workers())
        if worker is None:
            raise InvalidInput("no worker has room for a lab right now (all busy, loading or at their lab limit)")
        return worker

    async def _forward(self, command: str, args: dict[str, Any]) -> None:
        await self.channel_layer.group_send(
            lab_worker_group(self.worker),
            {"type": "lab.command", "lab_id": self.lab_id, "command": command, "args": args},
        )
        if command != "close":
            self._clear_deadline()
            self.deadline = asyncio.get_running_loop().call_later(
                settings.PLAYGROUND_LAB_REPLY_TIMEOUT_S, lambda: asyncio.ensure_future(self._timed_out()))

    async def _timed_out(self) -> None:
        self.deadline = None
        self.worker = None  # the next open picks a live worker
        await self.send_json({"type": "error", "message": "the lab's worker did not answer in time; open the lab "
                                                          "again", "code": "timeout"})

    def _clear_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    async def lab_reply(self, message: dict[str, Any]) -> None:
        self._clear_deadline()
        reply = message["reply"]
        if reply.get("type") == "closed":
            self.worker = None
        await self.send_json(reply)
