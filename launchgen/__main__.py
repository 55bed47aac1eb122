"""`python -m launchgen`: the same CLI as the `launchgen` console script (for a venv whose bin is not on PATH)."""

from launchgen.cli import main

if __name__ == "__main__":
    main(prog_name="launchgen")
