"""A terminal chat on the streaming engine: `python -m inference.chat [--model M] [--temperature T]`.

Replies stream token by token; after each one a status line shows tokens/s, TTFT and how many prompt tokens
came from the prefix cache (a multi-turn chat re-sends its history, which the cache serves). `/reset`
starts a new conversation, `/quit` (or Ctrl-D) leaves.
"""

from __future__ import annotations

import argparse
import sys
import time

from inference.sampling_params import SamplingParams
from inference.streaming import StreamingEngine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--max-tokens", type=int, default=512)
    args = parser.parse_args(argv)

    engine = StreamingEngine(model=args.model)
    engine.start()
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)
    history = _new_history(args.system)
    print("Paged Playground chat — /reset for a new conversation, /quit to leave.", file=sys.stderr)
    try:
        while True:
            try:
                line = input("\n> ").strip()
            except EOFError:
                break
            if line in ("/quit", "/exit"):
                break
            if line == "/reset":
                history = _new_history(args.system)
                continue
            if not line:
                continue
            history.append({"role": "user", "content": line})
            try:
                reply = _stream_reply(engine, history, params)
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                history.pop()
                continue
            history.append({"role": "assistant", "content": reply})
    except KeyboardInterrupt:
        pass
    finally:
        engine.shutdown()


def _new_history(system: str | None) -> list[dict]:
    return [{"role": "system", "content": system}] if system else []


def _stream_reply(engine: StreamingEngine, history: list[dict], params: SamplingParams) -> str:
    start = time.perf_counter()
    stream = engine.add_request(None, params, messages=history)
    try:
        for delta in stream:
            print(delta.text, end="", flush=True)
    except KeyboardInterrupt:  # Ctrl-C stops this reply, not the chat
        engine.abort(stream.request_id)
        list(stream)
    final = stream.final
    completion = final.outputs[0]
    elapsed = time.perf_counter() - start
    ttft = final.metrics.ttft or 0.0
    decode_time = max(elapsed - ttft, 1e-9)
    print(
        f"\n[{len(completion.token_ids)} tokens, {len(completion.token_ids) / decode_time:.1f} tok/s, "
        f"TTFT {ttft * 1000:.0f} ms, {final.num_cached_tokens}/{len(final.prompt_token_ids)} prompt tokens "
        f"cached, {completion.finish_reason}]",
        file=sys.stderr,
    )
    return completion.text


if __name__ == "__main__":
    main()
