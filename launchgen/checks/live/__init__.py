"""`launchgen check --live`: probes of this cluster (`probes.live_checks`: sinfo, versions, GPUs, ports, caches,
offline mode; `setup.probe_setup`: what slurm.setup sources)."""
