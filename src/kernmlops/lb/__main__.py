"""``python -m kernmlops.lb``: the same commands as ``kernmlops lb``."""

from kernmlops.clitools import survive_closed_output
from kernmlops.lb.cli import lb_group

if __name__ == "__main__":
    survive_closed_output()
    lb_group(prog_name="kernmlops lb")
