"""The queues on the PS tasks are a protocol between processes: each message's queue has one name and place.

Tasks meet on a queue by its shared name, so a task of another build (a
restarted chief, a worker of the next release) must make the same queue:
the names, devices and capacities are pinned here, as docs/design.md's
table of the queues gives them. Graph building only: no servers.
"""

import tensorflow as tf

from disttrain.runtime.ps_serving import PsQueues


def _attrs(queue):
    op = queue.queue_ref.op
    return op.get_attr("shared_name").decode(), op.device.split("/device:")[0], op.get_attr("capacity")


def test_each_message_has_its_queue_name_and_place():
    with tf.Graph().as_default():
        queues = PsQueues(num_replicas=3)
        assert _attrs(queues.done(1)) == ("disttrain_done_1", "/job:ps/task:1", 12)
        assert _attrs(queues.finished()) == ("disttrain_finished", "/job:ps/task:0", 12)
        assert _attrs(queues.preempted(2)) == ("disttrain_preempt_2", "/job:ps/task:2", 16)


def test_a_replica_alone_still_has_room_for_its_posts():
    with tf.Graph().as_default():
        assert _attrs(PsQueues(num_replicas=0).done(0))[2] == 4
