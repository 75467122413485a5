"""Naming lost peers from TF's real error texts and a probe of the peers.

Every text below is real TensorFlow 2.21 output (tensorflow-cpu, gRPC), captured
on surviving tasks of local clusters started with disttrain.edges.local.LocalCluster
(the fault tests' setup: gin/mlp_async.gin, mlp_allreduce.gin, mlp_sync.gin
with gin/testing/tiny.gin) after SIGKILL of one or two tasks mid-training,
recorded by a wrapper around bin/train.py: the messages of the
UnavailableErrors that `Session.run` raised and the `tf` logger's "may be due
to a preemption" record of MonitoredSession. Only
irrelevant middle parts are cut, marked "...": TF's rendezvous and queue
chatter under "Recent warning and error logs" (the "File" lines under
"Detected at node" are where the capture harness built the op). No
AbortedError came up in these runs.
"""
# TF's lines are as long as TF made them, its "\t [[node]]" lines start with a tab:
# ruff: noqa: E501, E101

import logging
import re
import socket

import pytest
import tensorflow as tf

from disttrain.base.cluster import Cluster
from disttrain.base.errors import EXIT_TRANSIENT, TransientError
from disttrain.base.tf_errors import LostPeers, failed_in_tf_text, first_error_line, lost_peers
from disttrain.edges import cli
from disttrain.runtime import peers, trainer

PS0, PS1 = "/job:ps/task:0", "/job:ps/task:1"
W0, W1, W2 = "/job:worker/task:0", "/job:worker/task:1", "/job:worker/task:2"

# 2 PS + 2 workers, async; ps/task:1 killed. Raised on the chief (worker 0).
PS_LOST_CHIEF = r"""Graph execution error:

=====================
UNAVAILABLE: From /job:worker/replica:0/task:0:
recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}
	 [[{{node logits/MatMul/ReadVariableOp_S187}}]]
UNAVAILABLE: From /job:ps/replica:0/task:1:
recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RunGraph:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}
UNAVAILABLE: From /job:ps/replica:0/task:0:
recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}
	 [[{{node Adam/update_fc2/weights/part_0/ResourceApplyAdam/ReadVariableOp_S211}}]]
====================="""

# The same kill, raised on worker 1: ps/task:0 passes ps/task:1's failure on (it is alive).
PS_LOST_RELAYED = r"""Graph execution error:

=====================
UNAVAILABLE: From /job:worker/replica:0/task:1:
recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}
	 [[{{node Adam/update_fc2/weights/part_0/ResourceApplyAdam/ReadVariableOp_1_S173}}]]
Additional GRPC error information from remote target /job:ps/replica:0/task:0 while calling /tensorflow.WorkerService/RecvTensor:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer\nAdditional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:\n:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:\"recvmsg:Connection reset by peer\"}\n\t [[{{node Adam/update_fc2/weights/part_0/ResourceApplyAdam/ReadVariableOp_1_S173}}]]"}
	 [[Adam/update/NoOp_S194]]
UNAVAILABLE: From /job:ps/replica:0/task:1:
recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RunGraph:
:UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", grpc_status:14}
UNAVAILABLE: From /job:ps/replica:0/task:0:
recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}
	 [[{{node Adam/update_fc2/weights/part_0/ResourceApplyAdam/ReadVariableOp_1_S173}}]]
====================="""

# 1 PS + 2 workers, sync; ps/task:0 killed. Raised on the chief while its new session
# registered its graph, before the PS was back.
PS_DOWN_AT_SESSION = r"""Graph execution error:

failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:59443: Failed to connect to remote host: Connection refused
Additional GRPC error information from remote target /job:ps/replica:0/task:0 while calling /tensorflow.WorkerService/RegisterGraph:
:UNKNOWN:Error received from peer  {grpc_message:"failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:59443: Failed to connect to remote host: Connection refused", grpc_status:14}"""

# MonitoredSession's log record (the `tf` logger) before it re-creates the session.
TF_LOG_PREFIX = (
    "An error was raised. This may be due to a preemption in a connected worker or parameter "
    "server. The current session will be closed and a new session will be created. This error "
    "may also occur due to a gRPC failure caused by high memory or network bandwidth usage in "
    "the parameter servers. If this error occurs repeatedly, try increasing the number of "
    "parameter servers assigned to the job. Error: "
)

# The incident: 2 PS + 2 workers, async with overlap; ps/task:1 killed. The chief's
# record names the chief itself (/job:worker/replica:0/task:0, the last remote target):
# ps/task:0 called RecvTensor on the chief, whose answer relayed ps/task:1's failure.
INCIDENT_ERROR = r"""
=====================
UNAVAILABLE: From /job:worker/replica:0/task:0:
recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:
:UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", grpc_status:14}
	 [[{{node pull/Read_7/ReadVariableOp_S185}}]]
Recent warning and error logs:
  ...
  E0000 00:00:1795434040.638573   14439 master_session.cc:1972] Cleanup partition error: UNAVAILABLE: recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/CleanupGraph:
:UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", grpc_status:14}
UNAVAILABLE: From /job:ps/replica:0/task:1:
recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RunGraph:
:UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", grpc_status:14}
UNAVAILABLE: From /job:ps/replica:0/task:0:
recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:
:UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", grpc_status:14}
	 [[{{node pull/Read_7/ReadVariableOp_S185}}]]
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/RecvTensor:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer\nAdditional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:\n:UNKNOWN:Error received from peer  {grpc_message:\"recvmsg:Connection reset by peer\", grpc_status:14}\n\t [[{{node pull/Read_7/ReadVariableOp_S185}}]]"}
	 [[Adam/update_S214]]
Recent warning and error logs:
  ...
Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}
	 [[{{node Adam/update_fc1/weights/part_1/ResourceApplyAdam/ReadVariableOp_S157}}]]
=====================
"""
INCIDENT_LOG = TF_LOG_PREFIX + INCIDENT_ERROR

# 3 workers, ring all-reduce; worker/task:2 killed. Raised on worker 1: worker 0 relays.
WORKER_LOST = r"""Graph execution error:

Detected at node 'allreduce/allreduce_bucket_1/CollectiveReduceV2' defined at (most recent call last):
    File "/tmp/lostcap/train_capture.py", line 58, in <module>
    File "<frozen runpy>", line 291, in run_path
    File "<frozen runpy>", line 98, in _run_module_code
    File "<frozen runpy>", line 88, in _run_code
    File "/work/main/bin/train.py", line 15, in <module>
    File "/work/main/disttrain/scripts/train.py", line 38, in run
    File "/tmp/venv1/lib/python3.11/site-packages/absl/app.py", line 410, in run
    File "/tmp/venv1/lib/python3.11/site-packages/absl/app.py", line 355, in _run_main
    File "/work/main/disttrain/scripts/train.py", line 34, in main
    File "/work/main/disttrain/cli.py", line 137, in run
    File "/work/main/disttrain/launch.py", line 461, in run
    File "/work/main/disttrain/launch.py", line 401, in _run_replica
    File "/work/main/disttrain/trainer.py", line 208, in train
    File "/work/main/disttrain/trainer.py", line 60, in build
    File "/work/main/disttrain/strategies/base.py", line 220, in minimize
    File "/work/main/disttrain/strategies/allreduce.py", line 190, in apply_gradients
    File "/work/main/disttrain/strategies/allreduce.py", line 100, in all_reduce_mean
Node: 'allreduce/allreduce_bucket_1/CollectiveReduceV2'
From /job:worker/replica:0/task:1:
Collective ops is aborted by: Collective ops is aborted by: recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:worker/replica:0/task:2 while calling /tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}
The error could be from a previous operation. Restart your program to reset.
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error information from remote target /job:worker/replica:0/task:2 while calling /tensorflow.WorkerService/RecvBuf:\n:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:\"recvmsg:Connection reset by peer\"}\nThe error could be from a previous operation. Restart your program to reset."}
The error could be from a previous operation. Restart your program to reset.
	 [[{{node allreduce/allreduce_bucket_1/CollectiveReduceV2}}]]"""

# 3 workers, ring all-reduce; worker/task:1 and worker/task:2 killed at once. Raised on
# worker 0: TF names only worker/task:2; the probe finds both gone.
TWO_LOST = r"""Graph execution error:

Detected at node 'allreduce/allreduce_bucket_1/CollectiveReduceV2' defined at (most recent call last):
    File "/tmp/lostcap/train_capture.py", line 58, in <module>
    File "<frozen runpy>", line 291, in run_path
    File "<frozen runpy>", line 98, in _run_module_code
    File "<frozen runpy>", line 88, in _run_code
    File "/work/main/bin/train.py", line 15, in <module>
    File "/work/main/disttrain/scripts/train.py", line 38, in run
    File "/tmp/venv1/lib/python3.11/site-packages/absl/app.py", line 410, in run
    File "/tmp/venv1/lib/python3.11/site-packages/absl/app.py", line 355, in _run_main
    File "/work/main/disttrain/scripts/train.py", line 34, in main
    File "/work/main/disttrain/cli.py", line 137, in run
    File "/work/main/disttrain/launch.py", line 461, in run
    File "/work/main/disttrain/launch.py", line 401, in _run_replica
    File "/work/main/disttrain/trainer.py", line 208, in train
    File "/work/main/disttrain/trainer.py", line 60, in build
    File "/work/main/disttrain/strategies/base.py", line 220, in minimize
    File "/work/main/disttrain/strategies/allreduce.py", line 190, in apply_gradients
    File "/work/main/disttrain/strategies/allreduce.py", line 100, in all_reduce_mean
Node: 'allreduce/allreduce_bucket_1/CollectiveReduceV2'
From /job:worker/replica:0/task:0:
Collective ops is aborted by: recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:worker/replica:0/task:2 while calling /tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", grpc_status:14}
The error could be from a previous operation. Restart your program to reset.
	 [[{{node allreduce/allreduce_bucket_1/CollectiveReduceV2}}]]"""


# ---- what TF's texts name ----------------------------------------------------


def test_tf_text_names_the_task_that_failed_not_those_that_relayed():
    assert failed_in_tf_text([PS_LOST_CHIEF]) == [PS1]
    assert failed_in_tf_text([PS_LOST_RELAYED]) == [PS1]  # not ps/task:0
    assert failed_in_tf_text([INCIDENT_LOG]) == [PS1]  # not the chief itself
    assert failed_in_tf_text([WORKER_LOST]) == [W2]  # not worker/task:0
    assert failed_in_tf_text([PS_DOWN_AT_SESSION]) == [PS0]
    assert failed_in_tf_text([]) == []


def test_first_error_line_skips_tf_framing_and_the_reporting_task():
    assert first_error_line([PS_LOST_CHIEF]) == "UNAVAILABLE: recvmsg:Connection reset by peer"
    assert first_error_line([INCIDENT_LOG]) == "UNAVAILABLE: recvmsg:Connection reset by peer"
    assert first_error_line([WORKER_LOST]).startswith("Collective ops is aborted by: ")
    assert first_error_line([PS_DOWN_AT_SESSION]).startswith("failed to connect to all addresses")
    assert first_error_line([]) == ""


# ---- the decision: probe first, TF's text for detail, never this task --------


def test_ps_lost_and_still_down():
    lost = lost_peers(W0, [PS_LOST_CHIEF], {PS0: True, PS1: False})
    assert lost == LostPeers(gone=(PS1,), error="UNAVAILABLE: recvmsg:Connection reset by peer")
    assert str(lost) == "/job:ps/task:1 is gone"


def test_ps_lost_and_already_restarted_when_probed():
    # An orchestrator may restart the PS before this task probes: TF's text still names it.
    assert str(lost_peers(W0, [PS_LOST_CHIEF], {PS0: True, PS1: True})) == "/job:ps/task:1 restarted"


def test_a_ps_that_only_relayed_the_failure_is_not_named():
    assert str(lost_peers(W1, [PS_LOST_RELAYED], {PS0: True, PS1: False})) == "/job:ps/task:1 is gone"
    assert str(lost_peers(W1, [PS_LOST_RELAYED], {PS0: True, PS1: True})) == "/job:ps/task:1 restarted"


def test_the_incident_the_chief_never_names_itself():
    # Before: "lost its session: /job:ps/task:1, /job:worker/task:0 is gone or restarted".
    lost = lost_peers(W0, [INCIDENT_LOG, INCIDENT_LOG], {PS0: True, PS1: False})
    assert str(lost) == "/job:ps/task:1 is gone"
    # Even a probe that lists this task, or a text that only names it, never makes it lost.
    assert W0 not in str(lost_peers(W0, [INCIDENT_LOG], {W0: False, PS1: True}))
    assert W0 not in str(lost_peers("/job:worker/replica:0/task:0", [INCIDENT_LOG], {}))


def test_worker_lost():
    assert str(lost_peers(W1, [WORKER_LOST], {W0: True, W2: False})) == "/job:worker/task:2 is gone"
    assert str(lost_peers(W0, [WORKER_LOST], {W1: True, W2: True})) == "/job:worker/task:2 restarted"


def test_two_lost_the_probe_names_what_tf_does_not():
    lost = lost_peers(W0, [TWO_LOST], {W1: False, W2: False})
    assert str(lost) == "/job:worker/task:1, /job:worker/task:2 are gone"
    mixed = lost_peers(W0, [PS_LOST_CHIEF, WORKER_LOST], {PS0: True, PS1: True, W1: True, W2: False})
    assert str(mixed) == "/job:worker/task:2 is gone and /job:ps/task:1 restarted"


def test_unprobed_tasks_are_named_without_guessing_their_state():
    assert str(lost_peers(W0, [PS_LOST_CHIEF], {})) == "/job:ps/task:1 is gone or restarted"


def test_nothing_to_name_says_so_with_tfs_first_error_line():
    # The only task this text shows failing is the one asking: nothing left to name.
    lost = lost_peers(PS1, [PS_LOST_CHIEF], {PS0: True})
    assert str(lost) == "a peer is gone or restarted (TF: UNAVAILABLE: recvmsg:Connection reset by peer)"
    assert str(lost_peers(W0, [], {})) == "a peer is gone or restarted (TF: no error text)"


# ---- the probe and where the texts come from -----------------------------------


@pytest.fixture
def listening_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def closed_port():
    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probe(listening_port):
    up, down = f"127.0.0.1:{listening_port}", f"127.0.0.1:{closed_port()}"
    assert peers.probe([(PS0, up), (PS1, down)]) == {PS0: True, PS1: False}
    assert peers.probe([]) == {}


def test_lost_peer_log_keeps_tf_records_for_the_next_reconnection():
    log = trainer._LostPeerLog(logging.WARNING)
    record = logging.LogRecord("tensorflow", logging.INFO, __file__, 1, INCIDENT_LOG, None, None)
    assert log.filter(record) is False  # INFO stays hidden where the logger hid it
    calls = []

    class Inner:
        def create_session(self):
            return "session"

    creator = trainer._Reconnecting(Inner(), calls.append, log)
    assert creator.create_session() == "session" and calls == []  # the first session is no reconnection
    log.filter(record)
    creator.create_session()
    creator.create_session()
    assert calls == [[INCIDENT_LOG], []]


def _exit_of(error, text, ps_0_port=None) -> int:
    """The exit code of `errors_to_exit` on worker 1 of 2 PS + 2 workers (only PS 0 may listen)."""
    cluster = Cluster(
        jobs={
            "ps": [f"127.0.0.1:{ps_0_port or closed_port()}", f"127.0.0.1:{closed_port()}"],
            "worker": [f"127.0.0.1:{closed_port()}", f"127.0.0.1:{closed_port()}"],
        },
        task_type="worker",
        task_index=1,
    )
    with pytest.raises(SystemExit) as e, cli.errors_to_exit(cluster):
        raise error(None, None, text)
    return e.value.code


def test_errors_to_exit_names_the_lost_peer_never_this_task(listening_port, capsys):
    assert _exit_of(tf.errors.UnavailableError, PS_LOST_RELAYED, listening_port) == EXIT_TRANSIENT
    assert capsys.readouterr().err.strip() == "disttrain: error: lost contact: /job:ps/task:1 is gone"


def test_errors_to_exit_without_a_cluster_still_names_what_tf_shows(capsys):
    with pytest.raises(SystemExit) as e, cli.errors_to_exit():
        raise tf.errors.UnavailableError(None, None, WORKER_LOST)
    assert e.value.code == EXIT_TRANSIENT
    assert (
        capsys.readouterr().err.strip()
        == "disttrain: error: lost contact: /job:worker/task:2 is gone or restarted"
    )


def test_waiting_for_a_peer_says_whom_since_when_and_until_when(caplog):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    caplog.set_level(logging.INFO, logger="disttrain")
    with pytest.raises(TransientError, match=r"/job:ps/task:1 at .* is unreachable after 3 s"):
        peers.wait_for_peers([(PS1, address)], timeout_secs=2.6, poll_secs=0.1, say_every_secs=1.0)
    said = [r.getMessage() for r in caplog.records if "waiting for /job:ps/task:1" in r.getMessage()]
    assert len(said) >= 3, said  # at 0, 1 and 2 s: never silent for longer than say_every_secs
    assert all(re.search(r"waiting since \d\d:\d\d:\d\d \(\d+ s\), giving up in \d+ s", m) for m in said), (
        said
    )
    assert said[0].endswith("giving up in 3 s (peer_wait_secs=3)") and "giving up in 1 s" in said[-1], said


# 2 workers, all-reduce, in the 20-minute chaos soak: worker 0 failed a step ("The same RunGraph
# (Worker) request was received twice", TF's gRPC retry after a restart) and tore down its side of
# the collective; worker 1's Session.run raised this InternalError (it exited 1 with a traceback).
COLLECTIVE_ABORTED = r"""Graph execution error:

Detected at node 'allreduce/allreduce_bucket_1/CollectiveReduceV2' defined at (most recent call last):
Node: 'allreduce/allreduce_bucket_1/CollectiveReduceV2'
From /job:worker/replica:0/task:1:
Collective ops is aborted by: Delete called on non-empty BufRendezvous
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_status:13, grpc_message:"Delete called on non-empty BufRendezvous"}
The error could be from a previous operation. Restart your program to reset.
	 [[{{node allreduce/allreduce_bucket_1/CollectiveReduceV2}}]]
"""


# 2 PS + 2 workers, sync PS, the short chaos soak in CI: soon after ps/task:0 was preempted and
# restarted, worker 1's step failed with its own part cancelled beside the PS's ABORTED, and
# Session.run raised this CancelledError (it exited 1 with a traceback).
CANCELLED_BESIDE_ABORTED = r"""Graph execution error:

=====================
CANCELLED: From /job:worker/replica:0/task:1:
RecvFromRemoteAsync is cancelled.
	 [[{{node fc1/weights/ConcatPartitions/concat/ReadVariableOp_1_S163}}]]
ABORTED: From /job:ps/replica:0/task:1:
The same RunGraph (Worker) request was received twice. goo.gle/debugproto    graph_handle: "0000000000000003" step_id: 7435026372466409 exec_opts { } session_handle: "30a814211b393e53" store_errors_in_response_body: true create_worker_session_called: true request_id: 1490832322823896584
=====================
"""


# All-reduce, 2 workers (tests/cluster/test_promises.py): worker 1 SIGKILLed and restarted while
# worker 0, the group's leader, still waited in the step it had begun with worker 1's first life.
# The restarted worker 1's broadcast of the initial variables raised this, and it exited 1 with a
# traceback, a code no orchestrator restarts.
INCARNATION = r"""Graph execution error:

Detected at node 'broadcast_variables/CollectiveBcastRecvV2_1' defined at (most recent call last):
Node: 'broadcast_variables/CollectiveBcastRecvV2_1'
From /job:worker/replica:0/task:1:
Collective ops is aborted by: Device /job:worker/replica:0/task:1/device:CPU:0 current incarnation \
doesn't match with one in the group. This usually means this worker has restarted but the collective \
leader hasn't, or this worker connects to a wrong cluster.
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling \
/tensorflow.WorkerService/CompleteGroup:
:UNKNOWN:Error received from peer  {grpc_status:9, grpc_message:"Device /job:worker/replica:0/task:1/\
device:CPU:0 current incarnation doesn't match with one in the group."}
The error could be from a previous operation. Restart your program to reset.
	 [[{{node broadcast_variables/CollectiveBcastRecvV2_1}}]]
""".replace("\\\n", "")


@pytest.mark.parametrize(
    "error, text, lost",
    [
        (tf.errors.InternalError, COLLECTIVE_ABORTED, "/job:worker/task:0 is gone"),
        (tf.errors.FailedPreconditionError, INCARNATION, "/job:worker/task:0 is gone"),
        # "From /job:..." names where TF saw an error, not whom it lost: no task is guessed.
        (
            tf.errors.CancelledError,
            CANCELLED_BESIDE_ABORTED,
            "a peer is gone or restarted (TF: CANCELLED: RecvFromRemoteAsync is cancelled.)",
        ),
    ],
)
def test_a_peer_failure_tf_passes_on_as_another_error_is_transient_and_names_the_peer(
    capsys, error, text, lost
):
    assert _exit_of(error, text) == EXIT_TRANSIENT
    assert capsys.readouterr().err.strip() == f"disttrain: error: lost contact: {lost}"


def test_any_other_internal_or_cancelled_error_stays_an_error():
    mismatch = COLLECTIVE_ABORTED.replace(
        "Delete called on non-empty BufRendezvous", "Shape mismatch in the collective instance 100"
    )
    for error, text in [
        (tf.errors.InternalError, "Graph execution error: something TF did not expect"),
        (tf.errors.InternalError, mismatch),
        (tf.errors.CancelledError, "Graph execution error:\n\nCANCELLED: Session has been closed."),
        (tf.errors.FailedPreconditionError, "Graph execution error: Attempting to use uninitialized value w"),
    ]:
        with pytest.raises(error), cli.errors_to_exit():
            raise error(None, None, text)
