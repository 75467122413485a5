"""disttrain: data-parallel distributed training on TensorFlow (graph mode)."""

import os

from setuptools import find_packages, setup

# TensorFlow is an extra, not a hard requirement: `tensorflow-cpu` and
# `tensorflow` both install the same `tensorflow` module, and installing one
# over the other breaks it. Users pick [cpu] (CI, laptops, PS-only hosts) or
# [gpu] (`tensorflow[and-cuda]`, CUDA libraries from PyPI). See BUILD_NOTES.md.
TF = "2.21.0"

# The shipped .gin files travel inside the package as `disttrain/gin/...`, so an
# installed disttrain finds `mlp_async.gin` (and the `gin/...` includes) without
# a checkout. gin/ itself has no __init__.py: `import gin` must stay gin-config.
GIN_PACKAGES = {
    "disttrain." + root.replace(os.sep, "."): root
    for root, _, files in os.walk("gin")
    if any(f.endswith(".gin") for f in files)
}

setup(
    name="disttrain",
    version="0.1.0",
    description="Data-parallel distributed training on TensorFlow that scales",
    packages=find_packages(include=["disttrain", "disttrain.*", "model_zoo", "model_zoo.*"])
    + sorted(GIN_PACKAGES),
    package_dir=GIN_PACKAGES,
    # The TF 2 peers of the benchmark are programs run by path, not modules (disttrain/bench/tf2.py).
    package_data={
        **{name: ["*.gin"] for name in GIN_PACKAGES},
        "disttrain.bench": ["peers/*.py", "data/*.csv.gz"],
        "disttrain.plan": ["data/*.json"],  # the planner's published and measured runs, by source
    },
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
        # The benchmark's plot; without it the benchmark writes its JSON and table and says so.
        "bench": ["matplotlib>=3.8,<4"],
        # Time to accuracy: nothing more. Its digits ship inside the package (disttrain/bench/data);
        # the extra stays so that `.[accuracy]` in existing commands still installs.
        "accuracy": [],
        # The test tools; the suite also checks the benchmark's plot, so the README's
        # test command installs .[cpu,bench,test].
        # keras: TensorFlow installs Keras 3 itself; the tests import it by name, so it is named here.
        "test": [
            "pytest>=8,<10",
            "pytest-timeout>=2.3,<3",
            "pytest-xdist>=3.5,<4",  # two test files at a time (README's test command)
            "pytest-randomly>=3.15,<5",  # every run in a new order, its seed printed: no order dependency
            "ruff>=0.6",
            "psutil>=5.9,<8",
            "pyyaml>=6,<7",
            "keras>=3.10,<4",
        ],
    },
    entry_points={
        "console_scripts": [
            "disttrain-train=disttrain.scripts.train:run",
            "disttrain-launch-local=disttrain.scripts.launch_local:run",
            "disttrain-benchmark=disttrain.scripts.benchmark:run",
            "disttrain-plan=disttrain.scripts.plan:run",
            "disttrain-link-probe=disttrain.scripts.link_probe:run",
            "disttrain-accuracy=disttrain.scripts.accuracy:run",
            "disttrain-export=disttrain.scripts.export:run",
            "disttrain-tables=disttrain.scripts.tables:run",
            "disttrain-diagnose=disttrain.scripts.diagnose:run",
        ]
    },
)
