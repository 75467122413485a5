"""Replica strategies: how gradients of many replicas reach the variables."""

from disttrain.strategies.async_ps import AsyncParameterServer
from disttrain.strategies.base import Strategy

__all__ = ["AsyncParameterServer", "Strategy"]
