"""The kernel lab: run kernmlops inside another kernel under QEMU."""
