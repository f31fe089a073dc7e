"""Serves tasks on vLLM's CPU backend, INSIDE vLLM's own venv (see setup_vllm.sh): stdlib and vllm only.

`python vllm_runner.py JOB_JSON RESULT_FD`. The job names the model folder, dtype and limits. The runner loads the
model once, warms it up and writes one JSON line to file descriptor RESULT_FD ({"vllm_version", "kv_blocks"});
then it runs the tasks it reads from stdin, one JSON line each, answering each with one JSON line on RESULT_FD,
until stdin closes (vLLM logs to stdout and stderr, so the answers have a channel of their own). A task is a
workload (requests with prompt token ids, max_tokens and arrival times: served greedily with EOS ignored, every
token stamped with its time since the start; with "reset_prefix_cache", from an empty prefix cache) or a
decode-step measurement (a batch of prompts of one length, prefilled, then the median wall time of `steps` decode
steps). The engine is driven step by step through `llm.llm_engine`, in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), exactly as our adapter drives ours.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def make_llm(job: dict):
    from vllm import LLM

    return LLM(model=job["model"], dtype=job["dtype"], max_model_len=job["max_model_len"],
               max_num_seqs=job["max_num_seqs"], max_num_batched_tokens=job["max_num_batched_tokens"],
               block_size=job["block_size"], enable_prefix_caching=True, seed=job["seed"])


def params(max_tokens: int):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                          output_kind=RequestOutputKind.CUMULATIVE)


def serve(engine, requests: list[dict]) -> dict:
    """Add each request at its arrival time; stamp every new token; return per-request token times."""
    pending = sorted(requests, key=lambda r: r["arrival_time"])
    times: dict[str, list[float]] = {r["request_id"]: [] for r in requests}
    start = time.perf_counter()
    cpu_start = time.process_time()
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while pending and pending[0]["arrival_time"] <= now:
            r = pending.pop(0)
            engine.add_request(r["request_id"], {"prompt_token_ids": r["prompt_token_ids"]}, params(r["max_tokens"]))
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0]["arrival_time"] - (time.perf_counter() - start)))
            continue
        outputs = engine.step()
        stamp = time.perf_counter() - start
        for out in outputs:
            got = times[out.request_id]
            got.extend([stamp] * (len(out.outputs[0].token_ids) - len(got)))
    return {"token_times": times, "cpu_s": time.process_time() - cpu_start}


def decode_step(engine, prompts: list[list[int]], steps: int, max_num_batched_tokens: int) -> dict:
    """Prefill every prompt (until each has its first token), two warm-up steps, then time `steps` steps.

    Sequences prefilled first decode while the rest prefill, so max_tokens covers the prefill's steps too; the
    fewest sequences a timed step returned is reported beside the time (it must be the batch), and the requests
    are aborted afterwards.
    """
    batch = len(prompts)
    prefill_steps = -(-sum(map(len, prompts)) // max_num_batched_tokens) + batch
    ids = [f"step-{i}" for i in range(batch)]
    for request_id, prompt in zip(ids, prompts):
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params(prefill_steps + steps + 4))
    started: set[str] = set()
    while len(started) < batch:
        started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
    for _ in range(2):
        engine.step()
    walls, cpus, ran = [], [], []
    for _ in range(steps):
        wall, cpu = time.perf_counter(), time.process_time()
        ran.append(len(engine.step()))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()
    return {"step_s": sorted(walls)[len(walls) // 2], "step_cpu_s": sorted(cpus)[len(cpus) // 2],
            "batch_min": min(ran)}


def main(job: dict, result_fd: int) -> None:
    import vllm

    llm = make_llm(job)
    engine = llm.llm_engine
    # One short request first, so one-off costs stay out of the timings (as our adapter does).
    serve(engine, [{"request_id": "warmup", "prompt_token_ids": list(range(1000, 1040)), "max_tokens": 4,
                    "arrival_time": 0.0}])
    cache_config = getattr(getattr(engine, "vllm_config", None), "cache_config", None)
    with os.fdopen(result_fd, "w") as results:
        def answer(result: dict) -> None:
            results.write(json.dumps(result) + "\n")
            results.flush()

        answer({"vllm_version": vllm.__version__, "kv_blocks": getattr(cache_config, "num_gpu_blocks", None)})
        for line in sys.stdin:
            task = json.loads(line)
            if task["kind"] == "workload":
                if task.get("reset_prefix_cache"):
                    engine.reset_prefix_cache()
                answer(serve(engine, task["requests"]))
            else:
                answer(decode_step(engine, task["prompts"], task["steps"], job["max_num_batched_tokens"]))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), int(sys.argv[2]))
