"""The host-overhead bench (bench/host_overhead.py): its step split adds up to the step, counts every step,
times each part, and leaves the engine as it found it."""

from inference import model_runner
from inference import engine as engine_module
from bench import host_overhead
from bench.engines import ours


def test_the_split_adds_up_and_the_engine_is_restored(tmp_path):
    folder = host_overhead.tiny_model(tmp_path / "tiny")
    config = host_overhead.run_config(folder, sequences=8, output_tokens=5)
    engine = ours.make_engine(config)
    build, sample = model_runner.StepBatch.__dict__["build"], engine_module.sample
    task = host_overhead.workload(sequences=8, output_tokens=5)

    figures = host_overhead.split(engine, task)

    assert figures["steps"] == 5  # one step prefills all 8 prompts (and samples their first token), then 4 decodes
    parts = figures["ms_per_step"]
    assert set(parts) == set(host_overhead.PHASES) and all(v > 0 for v in parts.values())
    assert abs(sum(parts.values()) - figures["step_ms"]) < 1e-9
    assert 0 < figures["python_share"] < 1
    assert model_runner.StepBatch.__dict__["build"] is build and engine_module.sample is sample
    assert "step" not in engine.__dict__ and "schedule" not in engine.scheduler.__dict__
    assert "forward" not in engine.runner.model.__dict__
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
