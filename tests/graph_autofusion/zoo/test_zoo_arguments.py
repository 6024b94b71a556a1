"""Bad zoo arguments fail up front with a stable code and a sentence naming the argument."""

from __future__ import annotations

from typing import Any

import pytest
from zoo_cases import SMALL

from graph_autofusion import zoo
from graph_autofusion.errors import InvalidConfigError


def test_unknown_name_is_a_key_error_listing_the_names() -> None:
    with pytest.raises(KeyError) as info:
        zoo.build("alexnet")
    assert isinstance(info.value, InvalidConfigError)
    assert info.value.code == "zoo_unknown_model"
    for name in zoo.MODELS:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("name", "kwargs", "argument"),
    [
        ("bert_base", {"hidden": 30, "heads": 4}, "hidden"),
        ("bert_base", {"seq_len": 64, "max_positions": 32}, "seq_len"),
        ("bert_base", {"style": "onnx"}, "style"),
        ("bert_base", {"style": "dynamo", "opset": 17}, "opset"),
        ("gpt2", {"style": "torchscript", "opset": 18}, "opset"),
        ("gpt2", {"opset": 12}, "opset"),
        ("gpt2", {"num_layers": 0}, "num_layers"),
        ("vit_b16", {"image_size": 30, "patch": 16}, "image_size"),
        ("resnet50", {"layers": (0, 0)}, "layers"),
        ("resnet50", {"batch": True}, "batch"),
        ("resnet50", {"width": -8}, "width"),
        ("mobilenet_v2", {"width_mult": 0}, "width_mult"),
        ("mobilenet_v2", {"setting": [(6, 24, 2)]}, "setting"),
        ("mlp", {"hidden": (32, 0)}, "hidden[1]"),
    ],
)
def test_bad_argument_is_rejected_with_its_name(name: str, kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError) as info:
        zoo.build(name, **kwargs)
    error = info.value
    assert isinstance(error, zoo.ZooArgumentError)
    assert error.code == "zoo_invalid_argument"
    assert error.details["argument"] == argument
    assert argument.split("[")[0] in error.message


def test_unknown_keyword_names_the_builder() -> None:
    with pytest.raises(zoo.ZooArgumentError, match="gpt2"):
        zoo.build("gpt2", layers=2)


def test_every_builder_is_reachable_directly_and_through_build() -> None:
    for name, builder in zoo.MODELS.items():
        kwargs = SMALL[name][1]
        assert builder(**kwargs).SerializeToString() == zoo.build(name, **kwargs).SerializeToString()
