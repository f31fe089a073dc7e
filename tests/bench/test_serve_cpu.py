"""bench.serve_cpu: each process of the stack is charged its own CPU seconds, and the serve bench's warm-up
draws other prompts than the measured run."""
import subprocess
import sys
import time
from pathlib import Path

from bench import serve_cpu, serve_vs_vllm


def test_a_process_is_charged_by_its_command_line():
    """Read from the test's own process: other tests running beside this one may have a web process of their own."""
    busy = "import time; end = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    web = subprocess.Popen([sys.executable, "-c", busy, "manage.py", "web", "--port", "1"])
    try:
        # /proc's utime and stime, whole clock ticks, can read a few ticks under the process's own clock on a
        # loaded VM (0.29 s for a loop that spent 0.3 s and more, a CI run).
        charged = 0.25
        deadline = time.monotonic() + 10
        while (reading := serve_cpu.read_process(Path(f"/proc/{web.pid}")))[1] < charged and time.monotonic() < deadline:
            time.sleep(0.1)
        command, spent = reading
        assert charged <= spent < 2.0
        assert serve_cpu.process_name(command) == "web"  # not "embedded" or "worker" as well
        assert serve_cpu.cpu_seconds()["web"] >= spent  # the sum over every running process counts it
    finally:
        web.kill()
        web.wait()
    assert serve_cpu.process_name("/venv/bin/celery -A playground worker -Q gpu -n w1@h") == "worker"
    assert serve_cpu.process_name("python -m pytest tests") is None


def test_the_warm_up_draws_other_prompts_than_the_measured_run(monkeypatch, tmp_path):
    """With the same seed the warm-up's prompts were the measured run's first ones, answered from the cache."""
    seeds = []

    def run(command, **kwargs):
        seeds.append(command[command.index("--seed") + 1])
        out = Path(command[command.index("--result-dir") + 1]) / command[command.index("--result-filename") + 1]
        out.write_text('{"output_throughput": 1.0}')

    monkeypatch.setattr(serve_vs_vllm.subprocess, "run", run)
    args = serve_vs_vllm.parse_args(["--out", str(tmp_path / "r.json")])
    serve_vs_vllm.bench_serve("openai-chat", args, tmp_path, tmp_path / "log", num_prompts=32, seed=1)
    serve_vs_vllm.bench_serve("openai-chat", args, tmp_path, tmp_path / "log")
    assert seeds == ["1", "0"]
