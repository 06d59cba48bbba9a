"""Overflow to disk (issue 22): queued jobs past a memory threshold move to disk and come
back in queue order. The subsystem is `disque.overflow.spill.Overflow` (compiled with the
hot path, which a package's `__init__` cannot be), its store `disque.overflow.store`, a
job's row data `disque.overflow.record`."""
