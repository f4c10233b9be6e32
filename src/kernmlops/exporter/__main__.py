"""``python -m kernmlops.exporter`` runs ``kernmlops export``."""

from kernmlops.exporter.cli import export_command

export_command(prog_name="kernmlops export")
