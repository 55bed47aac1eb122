"""The shared layer: torch-free modules both the login-node code and the trainers import."""
