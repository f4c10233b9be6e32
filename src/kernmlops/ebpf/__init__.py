"""The user side of libbpf: objects, programs, maps, links, ring buffers, BTF."""
