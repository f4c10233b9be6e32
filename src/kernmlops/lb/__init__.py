"""Learning load balancing (MLLB, APSys'20) with kernmlops.

Collect ``can_migrate_task`` decisions (``lb collect``), turn them into
MLLB's 15 features (:mod:`.features`), train the 15 -> 10 -> 1 MLP
(:mod:`.model`), export it in Q20.11 fixed point as a C header and JSON
(:mod:`.fixed`), and run it in the kernel beside the real scheduler in
shadow mode (:mod:`.shadow`). ``kernmlops lb --help`` lists the commands.
"""
