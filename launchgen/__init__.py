"""launchgen: one typed topology file -> a validated plan -> an sbatch or bash script for vLLM-server RL jobs."""

__version__ = "0.1.0"
