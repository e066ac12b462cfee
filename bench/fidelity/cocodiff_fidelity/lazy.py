"""Modules imported on first use, so that code written against torch loads without it.

    from .lazy import torch, F, dist
    x = torch.randn(4)        # torch is imported here, not when the module above was loaded

A decorator or default argument that touches one of them still imports it at definition time:
keep those inside functions."""
import importlib


class LazyModule:
    """Stands for the module NAME; the first attribute read imports it (then Python's module
    cache serves it)."""

    def __init__(self, name):
        self.__dict__["_name"] = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self.__dict__["_name"]), attr)

    def __repr__(self):
        return f"<lazy module {self.__dict__['_name']}>"


torch = LazyModule("torch")
F = LazyModule("torch.nn.functional")
dist = LazyModule("torch.distributed")
