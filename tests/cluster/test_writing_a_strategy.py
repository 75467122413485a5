"""docs/writing-a-strategy.md: its example strategy is the shipped one, and its script trains on a cluster.

The page quotes `TFDefault` and gives a script that trains with it through
`disttrain.fit`. The quote must be the class in
disttrain/strategies/tf_default.py, word for word; the script runs as
written (fewer steps, a log directory under the test's) as both tasks of a
real cluster of one PS and one worker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from disttrain.edges.local import free_port, task_env
from tests import REPO

PAGE = os.path.join(REPO, "docs", "writing-a-strategy.md")
SOURCE = os.path.join(REPO, "disttrain", "strategies", "tf_default.py")


def python_blocks() -> list[str]:
    with open(PAGE) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


def test_the_page_quotes_the_shipped_class():
    quoted = next(b for b in python_blocks() if b.startswith("class TFDefault("))
    with open(SOURCE) as f:
        assert quoted in f.read()


@pytest.mark.cluster
def test_the_page_example_trains_on_a_real_two_task_cluster(tmp_path):
    code = next(b for b in python_blocks() if "disttrain.fit(" in b)
    code, n = re.subn(r"steps=\d+", "steps=30", code)
    assert n == 1
    code, n = re.subn(r'logdir="/tmp/\w+"', f'logdir="{tmp_path / "logdir"}"', code)
    assert n == 1
    path = tmp_path / "tf_default_example.py"
    path.write_text(code)
    cluster = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"]}
    procs, logs = {}, {}
    try:
        for job in cluster:
            env = task_env({k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": 0}})
            logs[job] = tmp_path / f"{job}_0.log"
            with open(logs[job], "w") as log:
                procs[job] = subprocess.Popen(
                    [sys.executable, str(path)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path
                )
        codes = {job: p.wait(timeout=240) for job, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    text = "\n".join(f"--- {job}\n{p.read_text()[-3000:]}" for job, p in logs.items())
    assert codes == {"ps": 0, "worker": 0}, text
    assert "finished: 30 local steps to global step 30" in text, text
    assert "/job:ps/task:0 done: 1/1 replicas reported; exiting" in text, text
