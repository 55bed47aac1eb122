"""Upper bounds on the spec's counts: far above any real allocation, low enough that planning stays cheap.

`check`, `plan` and `render` cost time and memory linear in nodes and replicas (one `NodePlan` per node, one
layout line and one run-record entry per node in the script: benchmarks/scale.py). Without a bound,
`train.nodes: 100000000` took gigabytes before any check ran. The largest machines have about 11,000 nodes
(El Capitan 11,136, Aurora 10,624, Frontier 9,408), so no real allocation comes near 65,536 nodes. The spec's
fields carry these as `le=` bounds: the loader refuses a larger value with LG004, the field and its line, before
anything is derived from it.
"""

from __future__ import annotations

#: nodes of one job: train.nodes, vllm.nodes (LG004), and their sum (LG108)
MAX_NODES = 65_536
#: vllm.replicas as a count (LG222 refuses more than `replicas.MAX_REPLICAS` with its reason, the port window)
MAX_REPLICA_COUNT = 1_024
#: slurm.max_restarts, vllm.max_replica_restarts: requeues and restarts (bash arithmetic compares them)
MAX_RESTARTS = 1_000
#: slurm.cpus_per_task (the largest nodes have well under 1,000 hardware threads)
MAX_CPUS_PER_TASK = 4_096
#: vllm.health_timeout in seconds: a week (SLURM's time limit ends the job before)
MAX_HEALTH_TIMEOUT_S = 7 * 24 * 3600
