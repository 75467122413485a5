"""Models for disttrain, found by name: `model_zoo.get("mlp")(**params)`.

May import: base and graph.
"""

from model_zoo import alexnet, cifar10, dlrm, inception_v3, mlp, resnet, vgg16  # noqa: F401  (registers the models)
from model_zoo.base import Model
from model_zoo.registry import get, names, register

__all__ = ["Model", "get", "names", "register"]
