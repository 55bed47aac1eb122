"""Jinja templates for rendered job scripts (package data; see launchgen.script.render)."""
