"""The `cpu` target: generated C kernels, compiled by the system C compiler, run through ctypes."""
