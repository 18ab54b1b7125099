"""The `emulate` backend: FP16 storage emulated on the CPU with cast pairs (DESIGN §4)."""

from bisector.backends.emulate.backend import EmulateBackend

__all__ = ["EmulateBackend"]
