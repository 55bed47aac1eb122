"""Reading a job back: status, logs, post-mortem, report (the job directory, scontrol/sacct)."""
