"""`python -m launchgen.trainers.trl --config run.yaml [--set KEY=VALUE ...]`.

Exit codes as the bundled trainers': 0 done (final model and completion marker written), 2 config or setup error
(one line, no traceback), 75 stopped on USR2/TERM after a checkpoint (requeue; the next run resumes), 1 a crash.
"""

from launchgen.trainers.trl import main

if __name__ == "__main__":
    raise SystemExit(main())
