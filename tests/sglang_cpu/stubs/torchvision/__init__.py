"""CPU-test stub: sglang imports torchvision at module level, but no CPU torchvision wheel matches."""
import sys
import types

__version__ = "0.0.0+k26stub"


class _AnyMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls


class _Any(metaclass=_AnyMeta):
    def __init__(self, *a, **k):
        raise RuntimeError("torchvision is a stub in the k26 CPU test environment")


def _module(name):
    mod = types.ModuleType(name)
    mod.__path__ = []
    mod.__getattr__ = lambda attr: _Any if not attr.startswith("__") else (_ for _ in ()).throw(AttributeError(attr))
    sys.modules[name] = mod
    return mod


for _sub in ("io", "transforms", "transforms.v2", "transforms.v2.functional", "transforms.functional", "ops", "models", "utils", "datasets"):
    _module(f"{__name__}.{_sub}")


def __getattr__(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Any
