"""The trainers' declarations: torch-free, safe to import on a login node (check, plan)."""
