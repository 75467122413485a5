"""disttrain as an installed package, not a checkout: a fresh virtual environment, then its console scripts.

`pip install '<checkout>[cpu]'` (not editable: the package is built and
copied into site-packages), then every command runs from a directory outside
the checkout with no PYTHONPATH, so nothing can come from the checkout by
accident. matplotlib (the `bench` extra) is not installed, so the benchmark's
one-line notice about the missing plot is checked here too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin directory of a fresh venv with disttrain[cpu] installed, a working directory elsewhere)."""
    root = tmp_path_factory.mktemp("install")
    # Built from a copy, so the build writes nothing into the checkout (and finds nothing stale there).
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    bin_dir = venv / "bin"
    pip = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--disable-pip-version-check", f"{source}[cpu]"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return bin_dir, elsewhere


def run(installed, *argv, timeout=300) -> subprocess.CompletedProcess:
    bin_dir, elsewhere = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_CONFIG", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=elsewhere, env=env)


def explain(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"


def test_the_package_is_imported_from_site_packages_not_the_checkout(installed):
    bin_dir, _ = installed
    done = run(installed, str(bin_dir / "python"), "-c", "import disttrain, sys; print(disttrain.__file__)")
    assert done.returncode == 0, explain(done)
    # REPO as a directory: a checkout at /tmp/x and a venv under /tmp/x_tmp are not one place.
    assert "site-packages" in done.stdout and not done.stdout.startswith(REPO.rstrip("/") + "/"), done.stdout


def test_train_dry_run_and_one_process_run_find_the_shipped_gin_files(installed, tmp_path):
    dry = run(
        installed, "disttrain-train", "--gin_file=mlp_async.gin", "--gin_file=testing/tiny.gin", "--dry_run"
    )
    assert dry.returncode == 0, explain(dry)
    assert "role: local" in dry.stdout and "TrainConfig.train_steps = 30" in dry.stdout
    assert "tensorflow" not in dry.stderr.lower(), dry.stderr  # TF's start-up noise stays quiet

    # A file of the user's own, which includes shipped files, still works by its path.
    own = tmp_path / "own.gin"
    own.write_text("include 'gin/mlp_async.gin'\ninclude 'testing/tiny.gin'\nTrainConfig.train_steps = 12\n")
    done = run(installed, "disttrain-train", f"--gin_file={own}", f"--logdir={tmp_path / 'run'}")
    assert done.returncode == 0, explain(done)
    assert "finished: 12 local steps" in done.stdout, explain(done)
    assert not [line for line in done.stdout.splitlines() if "deprecated" in line], done.stdout


def test_launch_local_runs_a_cluster_from_the_installed_package(installed, tmp_path):
    done = run(
        installed,
        "disttrain-launch-local",
        "--gin_file=mlp_async.gin",
        "--gin_file=testing/tiny.gin",
        "--num_ps=1",
        "--num_workers=1",
        f"--logdir={tmp_path}",
        "--timeout=240",
    )
    assert done.returncode == 0, explain(done)
    assert "summary:" in done.stdout and "exit codes: /job:ps/task:0 0, /job:worker/task:0 0" in done.stdout


def test_benchmark_without_matplotlib_writes_json_and_table_and_says_how_to_get_the_plot(installed, tmp_path):
    out = tmp_path / "report.json"
    done = run(
        installed,
        "disttrain-benchmark",
        "--gin_file=bench/mlp.gin",
        "--gin_file=testing/tiny.gin",
        "--workers=1",
        "--ps=1",
        "--systems=disttrain",
        "--warmup_steps=10",
        "--measure_steps=20",
        f"--logdir={tmp_path / 'logs'}",
        f"--out={out}",
        timeout=600,
    )
    assert done.returncode == 0, explain(done)
    report = json.loads(out.read_text())
    assert report["runs"] and report["runs"][0]["steps_per_sec"] > 0
    notice = [line for line in done.stdout.splitlines() if line.startswith("plot:")]
    assert notice == [
        "plot: matplotlib is not installed, so no plot was written: pip install 'disttrain[bench]' adds it"
    ]
    assert not (tmp_path / "report.png").exists()


def test_plan_from_any_directory_with_a_shipped_config(installed, tmp_path):
    out = tmp_path / "plan.json"
    done = run(
        installed,
        "disttrain-plan",
        "--gin_file=mlp_async.gin",
        "--hosts=4",
        "--ps=4",
        "--link_gbit=10",
        "--step_time_ms=50",
        f"--out={out}",
    )
    assert done.returncode == 0, explain(done)
    assert "scaling efficiency" in done.stdout and "what to change" in done.stdout
    assert json.loads(out.read_text())


def test_link_probe_is_installed_with_its_host_program(installed):
    # Bad input is refused before any host is built (no root needed); the per-host
    # program it starts by path must ship inside the package.
    done = run(installed, "disttrain-link-probe", "--methods=udp")
    assert done.returncode == 2, explain(done)
    assert "--methods entry 'udp'" in done.stderr.strip().splitlines()[-1]
    bin_dir, _ = installed
    done = run(
        installed,
        str(bin_dir / "python"),
        "-c",
        "import os; from disttrain.bench import link_probe as p; print(os.path.isfile(p.TASK))",
    )
    assert done.stdout.strip() == "True", explain(done)


def test_the_digits_ship_with_the_accuracy_tool(installed):
    # disttrain-accuracy's digits are package data (no scikit-learn, no download).
    bin_dir, _ = installed
    code = (
        "from disttrain.bench import accuracy as a; print(sum(len(part) for part in a.digits_data()[1::2]))"
    )
    done = run(installed, str(bin_dir / "python"), "-c", code)
    assert done.stdout.strip() == "1797", explain(done)


def test_the_tf2_peers_ship_with_the_module_they_import_by_path(installed):
    # tf2_pss.py and tf2_mwms.py run by file path and import tf2_common from beside them.
    bin_dir, _ = installed
    code = (
        "import os, disttrain.bench as b; d = os.path.join(os.path.dirname(b.__file__), 'peers'); "
        "print(sorted(f for f in os.listdir(d) if f.endswith('.py')))"
    )
    done = run(installed, str(bin_dir / "python"), "-c", code)
    assert done.stdout.strip() == "['tf2_common.py', 'tf2_heldout.py', 'tf2_mwms.py', 'tf2_pss.py']", explain(
        done
    )
