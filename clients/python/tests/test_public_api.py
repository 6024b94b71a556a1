"""The facade: everything public comes from `graph_autofusion_client`, nothing else is needed."""

import inspect

import graph_autofusion_client as gac
from graph_autofusion_client import _exceptions, _models


def test_all_is_sorted_and_importable() -> None:
    assert gac.__all__ == sorted(gac.__all__)
    for name in gac.__all__:
        assert hasattr(gac, name), name


def test_every_error_and_resource_is_exported() -> None:
    for module in (_exceptions, _models):
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__ and not name.startswith("_"):
                assert name in gac.__all__, f"{module.__name__}.{name} is not exported"


def test_every_error_derives_from_the_base() -> None:
    errors = [getattr(gac, n) for n in gac.__all__ if n.endswith("Error")]
    assert errors and all(issubclass(e, gac.AutofusionError) for e in errors)
    tree = _exceptions.__doc__ or ""
    assert all(e.__name__ in tree for e in errors), "the exception tree in the docstring is out of date"
