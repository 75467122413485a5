"""disttrain's tests: unit/ (no servers), cluster/ (real processes), netem/ (root), bench/, slow/."""

import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout under test


def extended_beyond(values, in_ci) -> list:
    """`values` as pytest params; those not in `in_ci` are marked for the extended tier, which CI leaves
    out (`-m extended` runs them): heavier repeats of paths the ones in `in_ci` already take."""
    return [pytest.param(v, marks=[] if v in in_ci else [pytest.mark.extended]) for v in values]
