"""disttrain: data-parallel distributed training on TensorFlow (graph mode)."""

from setuptools import find_packages, setup

# TensorFlow is an extra, not a hard requirement: `tensorflow-cpu` and
# `tensorflow` both install the same `tensorflow` module, and installing one
# over the other breaks it. Users pick [cpu] (CI, laptops, PS-only hosts) or
# [gpu] (`tensorflow[and-cuda]`, CUDA libraries from PyPI). See BUILD_NOTES.md.
TF = "2.21.0"

setup(
    name="disttrain",
    version="0.1.0",
    description="Data-parallel distributed training on TensorFlow that scales",
    packages=find_packages(include=["disttrain", "disttrain.*", "model_zoo", "model_zoo.*"]),
    python_requires=">=3.10,<3.14",
    install_requires=[
        "absl-py>=2.1,<3",
        "gin-config>=0.5.0,<0.6",
        "numpy>=1.26,<3",
        "tensorboard>=2.21,<2.22",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu=={TF}"],
        "gpu": [f"tensorflow[and-cuda]=={TF}"],
        "test": ["pytest>=8,<10", "pytest-timeout>=2.3,<3", "ruff>=0.6", "psutil>=5.9,<8", "pyyaml>=6,<7"],
        "bench": ["matplotlib>=3.8,<4"],
    },
)
