"""Typer front-end: parse, call a service, render, map to an exit code. No logic lives here."""
