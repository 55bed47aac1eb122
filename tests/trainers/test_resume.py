"""Re-running into a used output_dir (issue 13): resume only a checkpoint of the same config; a finished run
does nothing. Real tiny CPU training runs (the toy task of toy_runs.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from launchgen.trainers.checkpoint import COMPLETE_MARKER
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.resume import MAY_CHANGE, differences, fingerprint
from toy_runs import read_metrics, run_cfg, toy_cfg

HERE = Path(__file__).parent


def _cfg(tmp_path: Path, model: Path, **over: Any) -> dict[str, Any]:
    base = dict(trainer="grpo", num_generations=4, per_device_train_batch_size=8, max_steps=2, save_steps=1,
                save_total_limit=5)
    return toy_cfg(tmp_path, model, "run", **{**base, **over})


def _steps(out: Path) -> list[int]:
    return [m["step"] for m in read_metrics(out)]


def _snapshot(out: Path) -> dict[str, float]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}


@pytest.fixture(autouse=True)
def _toy_rewards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


def test_a_complete_run_says_so_and_does_not_retrain(tmp_path: Path, tiny_model_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _cfg(tmp_path, tiny_model_dir)
    out = Path(cfg["output_dir"])
    assert run_cfg(cfg) == 0
    before = _snapshot(out)
    capsys.readouterr()
    assert run_cfg(cfg) == 0
    said = capsys.readouterr().out
    assert "already complete" in said and str(out / COMPLETE_MARKER) in said, said
    assert _snapshot(out) == before, "a finished run was touched by its re-run"
    assert _steps(out) == [1, 2]


def test_raised_max_steps_continues_the_finished_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = _cfg(tmp_path, tiny_model_dir)
    out = Path(cfg["output_dir"])
    assert run_cfg(cfg) == 0
    assert run_cfg({**cfg, "max_steps": 4, "logging_steps": 2}) == 0
    assert _steps(out) == [1, 2, 4]
    assert json.loads((out / COMPLETE_MARKER).read_text())["global_step"] == 4


def test_a_different_config_is_refused_naming_the_fields_and_both_ways_out(tmp_path: Path,
                                                                           tiny_model_dir: Path) -> None:
    cfg = _cfg(tmp_path, tiny_model_dir, max_steps=2)
    out = Path(cfg["output_dir"])
    assert run_cfg(cfg) == 0
    before = _snapshot(out)
    changed = {**cfg, "max_steps": 3, "num_generations": 2, "learning_rate": 0.01}
    with pytest.raises(TrainerSetupError) as exc:
        run_cfg(changed)
    msg = str(exc.value)
    assert "num_generations: 4 in the checkpoint, 2 now" in msg and "learning_rate" in msg, msg
    assert "max_steps" not in msg.split("Fields that may change")[0], msg
    assert "new output directory" in msg and "resume: force" in msg, msg
    assert _snapshot(out) == before, "a refused run changed the output directory"
    # forced, it continues that training with the new config
    assert run_cfg({**changed, "resume": "force"}) == 0
    assert _steps(out) == [1, 2, 3]


def test_a_preempted_run_with_another_config_is_refused_before_loading(tmp_path: Path, tiny_model_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import toy_rewards

    cfg = _cfg(tmp_path, tiny_model_dir, max_steps=4, rewards=[{"name": "toy_rewards:target_fraction_signal"}])
    monkeypatch.setattr(toy_rewards, "_calls", 0)  # the reward's call count is per process: any test order
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 1)
    assert run_cfg(cfg) == 75
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 0)
    from launchgen.trainers import modeling

    def no_load(*_: Any, **__: Any) -> Any:
        raise AssertionError("the model was loaded before the config was compared")

    with monkeypatch.context() as m:
        m.setattr(modeling, "load_model", no_load)
        m.setattr(modeling, "load_tokenizer", no_load)
        with pytest.raises(TrainerSetupError, match=r"seed: 42 in the checkpoint, 7 now"):
            run_cfg({**cfg, "seed": 7})
    # the same config resumes exactly as before: every step once
    assert run_cfg(cfg) == 0
    assert _steps(Path(cfg["output_dir"])) == [1, 2, 3, 4]


def test_fields_that_may_change_are_not_compared(tmp_path: Path) -> None:
    base = TrainerConfig.model_validate({"trainer": "grpo", "output_dir": str(tmp_path / "a"),
                                         "model": {"name_or_path": "m"}, "data": {"path": "d.jsonl"}})
    moved = base.model_copy(deep=True, update={"output_dir": str(tmp_path / "b"), "max_steps": 999, "save_steps": 3})
    moved.generation.vllm_server.port = 9999
    assert differences(fingerprint(base), fingerprint(moved)) == []
    assert "max_steps" in MAY_CHANGE and "learning_rate" not in MAY_CHANGE
    other = base.model_copy(update={"learning_rate": 0.5})
    assert differences(fingerprint(base), fingerprint(other)) == [("learning_rate", 1e-06, 0.5)]


def test_a_checkpoint_recording_a_field_that_may_change_now_still_matches(tmp_path: Path) -> None:
    """Checkpoints written before generation.keep_kv_cache and model.logits_chunk_mib joined MAY_CHANGE recorded
    them (keep_kv_cache with its old default, true)."""
    cfg = TrainerConfig.model_validate({"trainer": "grpo", "output_dir": str(tmp_path / "a"),
                                        "model": {"name_or_path": "m"}, "data": {"path": "d.jsonl"}})
    old = fingerprint(cfg)
    old["generation"]["keep_kv_cache"] = True
    old["model"]["logits_chunk_mib"] = 256
    assert differences(old, fingerprint(cfg)) == []
    old["model"]["dtype"] = "float32"
    assert [d[0] for d in differences(old, fingerprint(cfg))] == ["model.dtype"]


def test_term_before_the_first_step_ends_the_trainer_at_once(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The supervisor's TERM reaches a trainer still waiting for a server that never turns healthy: nothing to
    checkpoint yet, so it exits 75 at once instead of waiting out the job's grace (then KILL)."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import yaml

    asked = threading.Event()

    class NeverHealthy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.set()
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NeverHealthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = _cfg(tmp_path, tiny_model_dir, max_steps=5)
    cfg["generation"] = {**cfg["generation"], "backend": "vllm_server",
                         "vllm_server": {"host": "127.0.0.1", "port": server.server_address[1], "health_timeout": 120}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "launchgen.trainers.grpo", "--config", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert asked.wait(90), "the trainer never asked the server's /health"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        server.shutdown()
    assert proc.returncode == 75, err[-3000:]
    assert took < 10, f"took {took:.1f}s to stop"
    assert "Traceback" not in err, err[-3000:]


def test_resume_never_into_a_directory_with_checkpoints_is_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = _cfg(tmp_path, tiny_model_dir)
    out = Path(cfg["output_dir"])
    assert run_cfg(cfg) == 0
    before = _snapshot(out)
    with pytest.raises(TrainerSetupError, match=r"resume: never, but .*checkpoint-2 exists.*new output directory"):
        run_cfg({**cfg, "resume": "never"})
    assert _snapshot(out) == before


def test_a_checkpoint_recorded_with_every_trainers_options_still_resumes(tmp_path: Path) -> None:
    """Before GRPO's options were GRPO's alone, every trainer's resolved config (and so its checkpoint) wrote them
    at their defaults: such a checkpoint of an rloo run still matches; one that changed one of them does not."""
    from launchgen.trainers.checkpoint import STATE_FILE
    from launchgen.trainers.declarations.algorithm_options import AlgorithmOptions
    from launchgen.trainers.resume import decide

    cfg = TrainerConfig.model_validate({"trainer": "rloo", "output_dir": str(tmp_path), "max_steps": 9,
                                        "model": {"name_or_path": "m"}, "data": {"path": "d.jsonl"}})
    older = {**fingerprint(cfg), **{k: f.default for k, f in AlgorithmOptions.model_fields.items()}}
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / STATE_FILE).write_text(json.dumps({"config": older}))
    assert decide(cfg).checkpoint == tmp_path / "checkpoint-3"
    (tmp_path / "checkpoint-3" / STATE_FILE).write_text(json.dumps({"config": {**older, "delta": 2.0}}))
    with pytest.raises(TrainerSetupError, match=r"delta: 2.0 in the checkpoint, \(unset\) now"):
        decide(cfg)


def test_a_checkpoint_older_than_an_option_at_its_default_still_resumes(tmp_path: Path) -> None:
    """An option added after a checkpoint was written (absent from its record) matches while this run leaves it at
    its default, which is how the older version ran; set to anything else it is a difference like any other."""
    from launchgen.trainers.checkpoint import STATE_FILE
    from launchgen.trainers.resume import decide

    base = {"trainer": "grpo", "output_dir": str(tmp_path), "max_steps": 9, "model": {"name_or_path": "m"},
            "data": {"path": "d.jsonl"}}
    cfg = TrainerConfig.model_validate(base)
    older = fingerprint(cfg)
    for gone in ("use_adaptive_entropy", "entropy_target"):  # top-level options, added later
        del older[gone]
    del older["generation"]["top_k"]  # a nested one
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / STATE_FILE).write_text(json.dumps({"config": older}))
    assert decide(cfg).checkpoint == tmp_path / "checkpoint-3"
    for changed, shown in (({"entropy_target": 0.5}, r"entropy_target: \(unset\) in the checkpoint, 0.5 now"),
                           ({"generation": {"top_k": 5}}, r"generation.top_k: \(unset\) in the checkpoint, 5 now")):
        with pytest.raises(TrainerSetupError, match=shown):
            decide(TrainerConfig.model_validate({**base, **changed}))
