"""The spec checks, one module per code range. `launchgen.checks` imports them all and is the module callers use."""
