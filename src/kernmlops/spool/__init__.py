"""The spool: ring records waiting on disk, what keeps the collector light on a
saturated machine.

A BPF hook's rings are copied, as they lie (record headers included), into the
collection's ``.spool/`` every poll: one ``write`` per piece of ring, no decoding.
Rows are made from the spool (decode, the hook's own columns, Parquet) while the
machine has CPU to spare and the sink keeps up, and all of what is left at stop. On
a machine with idle CPU the spool is read back within a poll; under a storm that
keeps every CPU busy the collector takes only the copy's few percent of a core from
the workload, and its memory does not grow with the backlog (the page cache holds
it, the disk keeps it). Durability is the collection's (README, "A collection
survives its collector"): the spool is fsync'd at every flush, and ``kernmlops
recover`` (kernmlops.collect.recovery) turns what a killed collector left into
parts.

Two halves, and the files of each:

- the ring copy, while the collection runs: ``copy`` (RingSpool: a ring's records
  to segment files, a writer thread, read back at the head), ``native`` (its side
  of the C copier, kernmlops.ebpf.copier), ``segment`` (one segment file: its
  json, its frames written and read back), ``memory`` (SpoolMemory: the first
  ``collector.spool_memory_mib`` on a tmpfs, ``/dev/shm``, linked from the spool as
  ``mem``: no disk write, and they outlive a killed collector, not a reboot),
  ``pacing`` (Pacer: when rows are made);
- what is on disk, after: ``frames`` (the files' format: frames, checksums,
  codecs), ``recovery`` (finding a killed collection's spools, reading their
  segments whatever the damage, removing them), ``collection`` (where the spool
  lies in its collection, and what it reads of the manifest).

Nothing here imports the collection layer (kernmlops.collect) or the hooks: the
hooks' RingSpool sits on it. Import the modules, not this package: each one loads
only what it needs (the collector's start-up time counts).
"""
