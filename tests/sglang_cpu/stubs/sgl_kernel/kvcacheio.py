"""CPU-test stub of sgl_kernel.kvcacheio: any name resolves to a function that raises when called."""

from sgl_kernel import __getattr__  # noqa: F401  - PEP 562: the module-level hook serves every name
