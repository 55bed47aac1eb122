"""`launchgen check --live`: probes of this cluster (`probes.live_checks`: sinfo, versions, GPUs, ports, caches,
offline mode, sbatch's release; `setup.probe_setup`: what slurm.setup sources; `probes.cluster_script_limit`: the
max_script_size the LG815 check judges the script against)."""
