"""`python -m bench.serve_cpu`: our serving stack at two commits under vLLM's `vllm bench serve`, in alternating
rounds, with the CPU seconds each process of the stack (and Redis) spent during the measured run.

Why: on two cores every millisecond the web side or Redis spends is taken from the engine's threads, so a change
to the serving path shows in CPU seconds per process before it shows, through the machines' drift, in tokens per
second. `--before` is a checkout of the commit to compare against (`git worktree add /tmp/before REV`); both
sides run from this file's `bench.serve_vs_vllm` (servers, warm-up, client) with only the served code switched,
one stack at a time, the order alternating each round.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench import procfs, serve_vs_vllm

PROCESSES = {"worker": ("celery", "worker"), "web": ("manage.py", "web"), "embedded": ("manage.py", "playground"),
             "redis": ("redis-server",)}


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m bench.serve_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the commit to compare against")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, metavar="JSON")
    args, rest = parser.parse_known_args(argv)
    serve = serve_vs_vllm.parse_args(["--backends", "openai-chat", "--out", str(args.out), *rest])
    return args, serve


def cpu_seconds() -> dict[str, float]:
    """User + system CPU seconds so far of each PROCESSES process running now (all its threads), found by the
    words of its command line."""
    seconds: dict[str, float] = {}
    for proc in Path("/proc").iterdir():
        try:
            command, spent = read_process(proc)
        except (OSError, IndexError):  # not a process, or it ended meanwhile
            continue
        name = process_name(command)
        if name is not None:
            seconds[name] = seconds.get(name, 0.0) + spent
    return seconds


def read_process(proc: Path) -> tuple[str, float]:
    """A /proc/<pid> folder's command line and its user + system CPU seconds so far, all its threads together."""
    command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return command, procfs.cpu_seconds(proc.name)


def process_name(command: str) -> str | None:
    """The PROCESSES name a command line is charged to; None for any other process."""
    return next((name for name, words in PROCESSES.items() if all(w in command for w in words)), None)


def one_side(repo: Path, serve: argparse.Namespace, log: Path) -> dict[str, Any]:
    """Our stack from `repo`, warmed up, then one measured run: the client's figures and the CPU seconds."""
    serve_vs_vllm.REPO = repo
    model = serve_vs_vllm.model_path()
    with serve_vs_vllm.server("ours", serve, model, log):
        serve_vs_vllm.bench_serve("openai-chat", serve, model, log, num_prompts=serve.concurrency, seed=1)
        before = cpu_seconds()
        result = serve_vs_vllm.measured("openai-chat", serve, model, log)
        after = cpu_seconds()
    return {**result, **{f"cpu_{name}_s": after[name] - before.get(name, 0.0) for name in after}}


def main(argv: list[str] | None = None) -> int:
    args, serve = parse_args(argv)
    repos = {"before": args.before.resolve(), "after": serve_vs_vllm.REPO}
    record: dict[str, Any] = {"config": {**{k: v for k, v in vars(serve).items() if k not in ("out", "backend_list")},
                                         "before": str(repos["before"])}, "rounds": []}
    for number in range(args.rounds):
        order = ("before", "after") if number % 2 == 0 else ("after", "before")
        this_round: dict[str, Any] = {"order": list(order)}
        for side in order:
            this_round[side] = one_side(repos[side], serve, args.out.with_suffix(".log"))
            print(f"[serve_cpu] round {number + 1} {side}: {this_round[side]['output_throughput']:.1f} tok/s, "
                  + ", ".join(f"{k} {v:.1f}" for k, v in this_round[side].items() if k.startswith("cpu_")),
                  file=sys.stderr, flush=True)
        record["rounds"].append(this_round)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
