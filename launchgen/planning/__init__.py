"""Spec -> Plan: every node, GPU, port, host, env var and command, decided once."""
