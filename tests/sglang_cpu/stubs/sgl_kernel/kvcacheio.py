"""CPU-test stub: the real sgl_kernel cannot load without libcuda.so.1."""

__version__ = "0.4.2"


def _unavailable(name):
    def fn(*args, **kwargs):
        raise RuntimeError(f"sgl_kernel.{name} is a stub in the k26 CPU test environment")

    fn.__name__ = name
    return fn


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _unavailable(name)
