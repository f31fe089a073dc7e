"""bench.serve_vs_vllm: both servers get the same KV bytes and scheduler limits, the rounds alternate who goes
first, and vLLM's CLI is run through its own venv with the version lookup it needs."""
import contextlib
import json
import os
import sys

import pytest

from bench import serve_vs_vllm
from tests.playground.live_stack import free_port


def smollm2_like(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "num_key_value_heads": 3,
                                                      "hidden_size": 576, "num_attention_heads": 9}))
    return tmp_path


def test_our_pool_holds_the_bytes_vllm_is_given(tmp_path):
    model = smollm2_like(tmp_path)
    # 30 layers x K and V x 3 KV heads x head_dim 64 = 11,520 values a token; 16 tokens a block.
    assert serve_vs_vllm.kv_blocks(model, "float32", 1024**3) == 1024**3 // (11_520 * 4 * 16)
    assert serve_vs_vllm.kv_blocks(model, "bfloat16", 1024**3) == 2 * serve_vs_vllm.kv_blocks(model, "float32",
                                                                                              1024**3)


def test_both_servers_get_the_same_limits(tmp_path):
    model = smollm2_like(tmp_path)
    args = serve_vs_vllm.parse_args(["--out", str(tmp_path / "r.json"), "--dtype", "bfloat16", "--kv-gib", "0.5"])
    ((ours, ours_env),) = serve_vs_vllm.server_commands("ours", args, model)
    ((vllm, vllm_env),) = serve_vs_vllm.server_commands("vllm", args, model)
    assert ours[-3:] == ["playground", "--port", str(args.port)]
    assert ours_env["ENGINE_DTYPE"] == "bfloat16" and ours_env["ENGINE_MAX_NUM_SEQS"] == "64"
    assert ours_env["PLAYGROUND_ANON_MAX_CONCURRENT_PER_ADDRESS"] == "0"  # one client holds every stream
    assert int(ours_env["ENGINE_NUM_KV_BLOCKS"]) == serve_vs_vllm.kv_blocks(model, "bfloat16", 1024**3 // 2)
    flags = dict(zip(vllm[5::2], vllm[6::2], strict=True))
    assert vllm[3] == "serve" and flags["--dtype"] == "bfloat16" and flags["--max-num-seqs"] == "64"
    assert flags["--kv-cache-memory-bytes"] == str(1024**3 // 2)
    assert vllm_env["VLLM_TARGET_DEVICE"] == "cpu" and vllm_env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_the_distributed_stack_is_the_compose_file_s_processes_over_one_redis(tmp_path):
    model = smollm2_like(tmp_path)
    args = serve_vs_vllm.parse_args(["--out", str(tmp_path / "r.json"), "--stack", "distributed"])
    (migrate, migrate_env), (worker, worker_env), (web, web_env) = serve_vs_vllm.server_commands("ours", args, model)
    assert migrate[-2:] == ["migrate", "--noinput"]
    assert worker[1:5] == ["-m", "celery", "-A", "playground"] and "--pool" not in worker  # the settings' threads pool
    assert web[-3:] == ["web", "--port", str(args.port)]
    assert migrate_env == worker_env == web_env  # one database, one Redis, one secret key
    assert web_env["REDIS_URL"] == args.redis_url and web_env["SECRET_KEY"]
    assert web_env["PLAYGROUND_API_KEYLESS"] == "1"  # vllm bench serve sends no key
    assert web_env["ENGINE_MAX_NUM_SEQS"] == "64"


def test_a_server_that_exits_before_it_is_healthy_is_reported_with_its_log(tmp_path):
    log = tmp_path / "server.log"
    command = [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"]
    with pytest.raises(RuntimeError, match=r"did not become healthy \(exits \[3\]\); see .*server.log"):
        with serve_vs_vllm.running("ours", [(command, dict(os.environ))], free_port(), log):
            pytest.fail("the block ran without a healthy server")
    assert "no model here" in log.read_text()


def test_unknown_backends_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        serve_vs_vllm.parse_args(["--out", str(tmp_path / "r.json"), "--backends", "tgi"])


def test_the_servers_own_means_come_from_two_scrapes_of_its_histograms(monkeypatch):
    """vLLM's server and ours both export vLLM's TTFT, queue and prefill histograms; a run's mean is the
    difference of the sums over the difference of the counts, all label sets (workers) together."""
    import http.server
    import threading

    ttft = "# TYPE vllm:time_to_first_token_seconds histogram\n"
    queue = "# TYPE vllm:request_queue_time_seconds histogram\n"
    scrapes = iter([
        ttft + 'vllm:time_to_first_token_seconds_sum{worker="a"} 1.0\n'
        'vllm:time_to_first_token_seconds_count{worker="a"} 2\n'
        'vllm:time_to_first_token_seconds_sum{worker="b"} 0.5\nvllm:time_to_first_token_seconds_count{worker="b"} 1\n',
        ttft + 'vllm:time_to_first_token_seconds_sum{worker="a"} 4.0\n'
        'vllm:time_to_first_token_seconds_count{worker="a"} 4\n'
        'vllm:time_to_first_token_seconds_sum{worker="b"} 2.5\nvllm:time_to_first_token_seconds_count{worker="b"} 3\n'
        + queue + 'vllm:request_queue_time_seconds_sum 0.25\nvllm:request_queue_time_seconds_count 1\n',
    ])

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = next(scrapes).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        before, after = serve_vs_vllm.server_histograms(port), serve_vs_vllm.server_histograms(port)
    finally:
        server.shutdown()
    assert before["ttft"] == (1.5, 3) and after["ttft"] == (6.5, 7)
    # (6.5 - 1.5) s over 4 requests; the queue histogram appeared only in the second scrape (before: none).
    assert serve_vs_vllm.server_means_ms(before, after) == {"server_mean_ttft_ms": 1250.0,
                                                             "server_mean_queue_ms": 250.0}


@pytest.mark.parametrize("per_request", [False, True])
def test_per_request_first_token_times_are_kept_only_when_asked(tmp_path, monkeypatch, per_request):
    """--per-request passes --save-detailed and keeps each request's TTFT and output length; the long lists
    (every inter-token latency, the texts) are dropped either way, as are all lists without the flag."""
    commands = []

    def fake_run(command, cwd, **kwargs):
        commands.append(command)
        detailed = {"ttfts": [0.5, 2.25], "output_lens": [128, 128], "itls": [[0.1] * 127] * 2,
                    "generated_texts": ["a", "b"]} if "--save-detailed" in command else {}
        (tmp_path / "result.json").write_text(json.dumps({"output_throughput": 12.5, **detailed}))

    monkeypatch.setattr(serve_vs_vllm.subprocess, "run", fake_run)
    monkeypatch.setattr(serve_vs_vllm.tempfile, "TemporaryDirectory", lambda: contextlib.nullcontext(str(tmp_path)))
    args = serve_vs_vllm.parse_args(["--out", str(tmp_path / "r.json"), *(["--per-request"] if per_request else [])])
    result = serve_vs_vllm.bench_serve("openai-chat", args, tmp_path, tmp_path / "log")
    assert ("--save-detailed" in commands[0]) is per_request
    if per_request:
        assert result == {"output_throughput": 12.5, "ttfts": [0.5, 2.25], "output_lens": [128, 128]}
    else:
        assert result == {"output_throughput": 12.5}
