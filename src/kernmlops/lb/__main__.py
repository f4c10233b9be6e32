"""``python -m kernmlops.lb``: the same commands as ``kernmlops lb``."""

from kernmlops.lb.cli import lb_group

if __name__ == "__main__":
    lb_group(prog_name="kernmlops lb")
