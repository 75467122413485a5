"""Replica strategies: how gradients of many replicas reach the variables."""

from disttrain.strategies.allreduce import SyncAllReduce
from disttrain.strategies.async_ps import AsyncParameterServer
from disttrain.strategies.base import Strategy
from disttrain.strategies.sync_ps import SyncParameterServer

__all__ = ["AsyncParameterServer", "Strategy", "SyncAllReduce", "SyncParameterServer"]
