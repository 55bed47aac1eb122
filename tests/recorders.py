"""Recording stand-ins for `vllm` and `accelerate`: what a rendered script hands them, written to $REC_DIR.

The quoting tests install them on PATH and compare the recorded argv, environment and parsed trainer config with
the spec byte for byte. `server.json` holds the full argv (argv[0] is the executable's path, so a test can check
`vllm.executable`); `trainer.json` the arguments after `accelerate`. With REC_WAIT_SERVER=1 the trainer waits
(up to 20 s) for the server's record, as a real trainer waits for /health.
"""

from __future__ import annotations

import sys
from pathlib import Path

RECORD_VLLM = """\
import json, os, sys, time
if "--help=all" in sys.argv:  # the preflight's flag probe: no flags listed, so it notes and moves on
    sys.exit(0)
rec = os.environ["REC_DIR"]
json.dump({"argv": sys.argv, "env": dict(os.environ)}, open(os.path.join(rec, "server.tmp"), "w"))
os.replace(os.path.join(rec, "server.tmp"), os.path.join(rec, "server.json"))
time.sleep(60)
"""

RECORD_ACCELERATE = """\
import json, os, sys, time
from launchgen.trainers.declarations.config import TrainerConfig
rec = os.environ["REC_DIR"]
args = sys.argv[1:]
tail = args[args.index("-m") + 2:]
config = tail[tail.index("--config") + 1]
sets = [tail[i + 1] for i, a in enumerate(tail) if a == "--set"]
cfg = TrainerConfig.from_yaml(config, sets).model_dump(mode="json")
if os.environ.get("REC_WAIT_SERVER") == "1":
    deadline = time.time() + 20
    while not os.path.exists(os.path.join(rec, "server.json")) and time.time() < deadline:
        time.sleep(0.05)
json.dump({"argv": args, "env": dict(os.environ), "config": cfg}, open(os.path.join(rec, "trainer.json"), "w"))
"""


def install_recorders(bindir: Path, vllm_name: str = "vllm") -> None:
    """Write the two stand-ins into `bindir` (created), run by this test interpreter."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name, body in ((vllm_name, RECORD_VLLM), ("accelerate", RECORD_ACCELERATE)):
        path = bindir / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
