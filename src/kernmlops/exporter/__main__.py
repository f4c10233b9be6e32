"""``python -m kernmlops.exporter`` runs ``kernmlops export``."""

from kernmlops.clitools import survive_closed_output
from kernmlops.exporter.cli import export_command

survive_closed_output()
export_command(prog_name="kernmlops export")
