"""A scripted stand-in for `inference.StreamingEngine`, for consumer and worker tests that must not load a
model. It answers a chat with "echo<i>: <last user message>" ("<adapter name><i>: ..." under a LoRA adapter), one
character per token, `delay` seconds apart
(with prompt_logprobs, the last message's characters after the first get logprob -position, rank 1)
(a message starting "REJECT" is refused, as is a logit_bias id past its vocabulary of VOCAB; one
starting "SLOW" takes `slow_admission_s` to submit; one starting "SILENT" is answered after SILENT_TOKENS
tokens without text, as special tokens skipped in the text are),
and returns the engine's real output types, so `EngineService.summarize` runs on the real shapes.
`fail_loop(message)` plays the engine loop raising: every in-flight stream ends with an error and
`health()` reports the loop dead, as StreamingEngine does.
"""
import queue
import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

from inference import EngineDeadError, EngineHealth
from inference.outputs import CompletionOutput, Logprob, RequestOutput, StreamDelta
from inference.sampling_params import SamplingParams
from inference.sequence import RequestMetrics


MESSAGE_OVERHEAD = 4  # tokens the fake chat template adds around each message
VOCAB = 1000  # token ids of the fake tokenizer: a character's code point modulo this
SILENT_TOKENS = 10  # text-less tokens before the reply to a message starting "SILENT"


class FakeTokenizer:
    """What the worker reads of a HF tokenizer for /tokenize and /detokenize: a token is a character."""

    def __len__(self) -> int:
        return VOCAB

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [f"<{chr(t)}>" for t in ids]


class FakeStream:
    def __init__(self, request_id: str, num_prompt_tokens: int) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.final: RequestOutput | None = None
        self.error: str | None = None
        self.on_put = None  # as RequestStream: the reader's wake-up, called after each delta
        self._queue: queue.Queue = queue.Queue()

    def get(self, timeout: float | None = None) -> StreamDelta | None:
        return self._queue.get(timeout=timeout)

    def put(self, item: StreamDelta | None) -> None:
        self._queue.put(item)
        if self.on_put is not None:
            self.on_put()


class FakeStreamingEngine:
    def __init__(self, delay: float = 0.005, max_model_len: int = 2048, suggested_sampling: dict | None = None,
                 **engine_kwargs) -> None:
        self.delay = delay
        self.slow_admission_s = 1.5
        self.live: dict[str, threading.Event] = {}
        self.aborted: list[str] = []
        self.requests: list[dict] = []
        # What the service reads of the real LLMEngine.
        self.engine = SimpleNamespace(block_size=16, max_model_len=max_model_len,
                                      generation=SimpleNamespace(sampling=dict(suggested_sampling or {})))
        self.tokenizer = FakeTokenizer()
        self.error: str | None = None
        self.last_step_at: float | None = None

    def health(self) -> EngineHealth:
        return EngineHealth(self.error is None, self.error, self.last_step_at)

    def fail_loop(self, message: str) -> None:
        self.error = message
        for stop in list(self.live.values()):
            stop.set()

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        for stop in list(self.live.values()):
            stop.set()

    def call_in_background(self, fn):
        """Run `fn` on the fake's engine at once (the real loop runs it between steps): the lab host's idle
        sweep calls it every 30 s, and failed so in every scripted server that lived that long."""
        future = Future()
        try:
            future.set_result(fn(self.engine))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def add_request(self, prompt, sampling_params: SamplingParams, request_id=None, messages=None, cache_salt=None,
                    lora_request=None, chat_options=None):
        last = messages[-1]["content"] if messages is not None else prompt
        if isinstance(last, list) and last[:MESSAGE_OVERHEAD] == [0] * MESSAGE_OVERHEAD:
            last = self.last_message(last)  # a chat rendered by `encode_chat` (the chat page's, fitted to the window)
        elif isinstance(last, list):  # token ids: answered as their text
            last = " ".join(map(str, last))
        if self.error is not None:
            raise EngineDeadError(self.error)
        if sampling_params.logit_bias and max(sampling_params.logit_bias) >= VOCAB:  # as InputProcessor
            raise ValueError(f"logit_bias: token id(s) {max(sampling_params.logit_bias)} are out of the vocabulary")
        if last.startswith("REJECT"):
            raise ValueError("prompt is longer than max_model_len (fake engine)")
        if last.startswith("SLOW"):  # a slow admission: a long prompt to tokenise, an adapter read from disk
            time.sleep(self.slow_admission_s)
        self.requests.append({"request_id": request_id, "messages": messages, "params": sampling_params,
                              "lora_request": lora_request, "prompt": prompt, "chat_options": chat_options})
        # The prompt's length as the engine counts it: the fake chat template's, or one token per character.
        n_prompt = len(self.encode_chat(messages) if messages is not None else
                       prompt if isinstance(prompt, list) else self.encode(prompt))
        stream = FakeStream(request_id, n_prompt)
        stop = self.live[request_id] = threading.Event()
        speaker = "echo" if lora_request is None else lora_request.lora_name  # an adapter answers in its own name
        replies = [f"{speaker}{i}: {last}"[: sampling_params.max_tokens] for i in range(sampling_params.n)]
        full = [len(f"{speaker}{i}: {last}") for i in range(sampling_params.n)]
        prompt_logprobs = None
        if sampling_params.prompt_logprobs is not None:
            prompt_logprobs = [None] + [{self.encode(c)[0]: Logprob(-float(p), 1, c)} for p, c in enumerate(last) if p]
        silent = SILENT_TOKENS if last.startswith("SILENT") else 0
        threading.Thread(target=self._run, args=(stream, stop, replies, full, n_prompt, prompt_logprobs, silent),
                         daemon=True).start()
        return stream

    def _run(self, stream: FakeStream, stop: threading.Event, replies: list[str], full: list[int], n_prompt: int,
             prompt_logprobs: list | None = None, silent: int = 0):
        metrics = RequestMetrics(arrival_time=time.perf_counter())
        emitted = [0] * len(replies)
        reason = None
        steps = 0
        while reason is None:
            if stop.wait(self.delay):
                reason = "abort"
                break
            self.last_step_at = time.time()
            if metrics.first_token_time is None:
                metrics.first_token_time = time.perf_counter()
            steps += 1
            for i, reply in enumerate(replies):
                if steps <= silent:
                    stream.put(StreamDelta(stream.request_id, i, "", [0]))
                elif emitted[i] < len(reply):
                    stream.put(StreamDelta(stream.request_id, i, reply[emitted[i]], [emitted[i]]))
                    emitted[i] += 1
            if all(e == len(r) for e, r in zip(emitted, replies)):
                reason = "done"
        metrics.finished_time = time.perf_counter()
        if self.error is not None:  # the loop died: the stream ends with the error, no final output
            stream.error = self.error
            stream.put(StreamDelta(stream.request_id, 0, "", [], True, "error"))
            self.live.pop(stream.request_id, None)
            stream.put(None)
            return
        outputs = []
        for i, reply in enumerate(replies):
            finish = "abort" if reason == "abort" else ("length" if len(reply) < full[i] else "stop")
            outputs.append(CompletionOutput(i, reply[: emitted[i]], [0] * min(steps, silent) + list(range(emitted[i])),
                                            finish))
        stream.final = RequestOutput(stream.request_id, None, list(range(n_prompt)), outputs, True, metrics, 0,
                                     prompt_logprobs)
        self.live.pop(stream.request_id, None)
        stream.put(None)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """One token per character, as the replies are; the special tokens are one BOS (id 1)."""
        return [1] * add_special_tokens + [ord(c) % VOCAB for c in text]

    def encode_chat(self, messages: list[dict], **chat_options) -> list[int]:
        """A chat template of its own: MESSAGE_OVERHEAD tokens around each message, one token per character."""
        return [t for m in messages for t in [0] * MESSAGE_OVERHEAD + self.encode(m["content"])]

    @staticmethod
    def last_message(ids: list[int]) -> str:
        """The last message's text of a chat `encode_chat` rendered (its characters' code points below VOCAB)."""
        marker = [0] * MESSAGE_OVERHEAD
        start = max(i for i in range(len(ids) - MESSAGE_OVERHEAD + 1) if ids[i:i + MESSAGE_OVERHEAD] == marker)
        return "".join(map(chr, ids[start + MESSAGE_OVERHEAD:]))

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        stop = self.live.get(request_id)
        if stop is not None:
            stop.set()

    def metrics(self) -> dict:
        return {"num_requests_running": len(self.live), "num_requests_waiting": 0, "block_map": []}
