"""launchgen.jobside.rank: records each trainer rank's pid and exit status for the job script, passes signals on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from launchgen.shared.jobdir import EXIT_PREEMPTED

TRAINER = '''
import os, signal, sys, time
mode = sys.argv[1]
if mode == "crash":
    os._exit(int(sys.argv[2]))
signal.signal(signal.SIGUSR2, lambda *_: sys.exit(75))
open(sys.argv[2], "w").write("ready")
time.sleep(60)
'''


def _start(tmp: Path, *args: str, ignore_usr2: bool = False) -> subprocess.Popen[bytes]:
    (tmp / "fake_trainer_mod.py").write_text(TRAINER)
    env = dict(os.environ, LAUNCHGEN_PID_DIR=str(tmp / "pids"), LAUNCHGEN_NODE_NAME="n1", RANK="3",
               PYTHONPATH=f"{tmp}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")

    def pre() -> None:
        if ignore_usr2:  # what the trainer step's `trap '' USR2` leaves to its children
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)

    return subprocess.Popen([sys.executable, "-m", "launchgen.jobside.rank", "fake_trainer_mod", *args], env=env,
                            preexec_fn=pre)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 20
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_exit_status_of_a_hard_crash_is_recorded_and_returned(tmp_path: Path) -> None:
    proc = _start(tmp_path, "crash", "3")
    assert proc.wait(timeout=30) == 3
    rank_dir = tmp_path / "pids" / "n1"
    assert (rank_dir / "rank3.exit").read_text().strip() == "3"
    pid = int((rank_dir / "rank3.pid").read_text())
    assert pid != proc.pid  # the trainer's own pid, the process USR2 must reach


def test_usr2_by_pid_file_reaches_the_trainer_despite_an_inherited_ignore(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = _start(tmp_path, "wait", str(ready), ignore_usr2=True)
    _wait_for(ready)
    _wait_for(tmp_path / "pids" / "n1" / "rank3.pid")
    os.kill(int((tmp_path / "pids" / "n1" / "rank3.pid").read_text()), signal.SIGUSR2)
    # a clean preemption is 0 to accelerate launch (no CalledProcessError traceback); the 75 is in the exit file
    assert proc.wait(timeout=30) == 0
    assert (tmp_path / "pids" / "n1" / "rank3.exit").read_text().strip() == str(EXIT_PREEMPTED)


def test_a_preempted_trainer_leaves_no_accelerate_traceback(tmp_path: Path) -> None:
    """The real `accelerate launch -m launchgen.jobside.rank ...`, as the trainer step runs it, with a trainer exiting 75."""
    (tmp_path / "fake_trainer_mod.py").write_text(TRAINER)
    env = dict(os.environ, LAUNCHGEN_PID_DIR=str(tmp_path / "pids"), LAUNCHGEN_NODE_NAME="n1",
               PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    accelerate = Path(sys.executable).with_name("accelerate")
    p = subprocess.run([str(accelerate), "launch", "--num_processes", "1", "--num_machines", "1", "--cpu",
                        "-m", "launchgen.jobside.rank", "fake_trainer_mod", "crash", str(EXIT_PREEMPTED)], env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "CalledProcessError" not in p.stderr, p.stderr
    assert (tmp_path / "pids" / "n1" / "rank0.exit").read_text().strip() == str(EXIT_PREEMPTED)


def test_term_is_passed_on(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = _start(tmp_path, "wait", str(ready))
    _wait_for(ready)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert (tmp_path / "pids" / "n1" / "rank3.exit").read_text().strip() == str(128 + signal.SIGTERM)
