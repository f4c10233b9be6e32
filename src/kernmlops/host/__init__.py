"""The machine as /proc and /sys describe it: CPU lists, meminfo, system facts.

The lowest layer of the package after ``errors``: it imports nothing else of
kernmlops, so collection, hooks, benchmarks and analysis can all use it.
"""
