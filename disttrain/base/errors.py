"""Errors that end a task, each with the exit code an orchestrator acts on.

Kubeflow TFJob's `ExitCode` restart policy treats 1-127 as permanent and
128-255 as retryable, so configuration mistakes (retrying cannot help) and
transient faults (a peer not up yet, a lost parameter server) are kept apart.
The table is documented in docs/faults.md; change both together.
"""

EXIT_OK = 0
EXIT_CONFIG = 2  # bad flags, TF_CONFIG, gin, port in use: permanent
EXIT_DIVERGED = 3  # NaN/Inf loss: permanent, the last good checkpoint is kept
EXIT_STALLED = 4  # steps run but the global step never moves (no update applied): permanent
EXIT_TRANSIENT = 150  # peer unreachable after the wait, PS lost, preempted (SIGTERM): retry


class DisttrainError(Exception):
    """Base class: `str(error)` is the one line shown to the user."""

    exit_code = 1


class ConfigError(DisttrainError):
    """The task was started with input that cannot work; fix it and restart."""

    exit_code = EXIT_CONFIG


class NoFilesError(ConfigError, FileNotFoundError):
    """An input's file pattern matches no file (a FileNotFoundError too, for code that catches that)."""


class DivergedError(DisttrainError):
    """The loss became NaN or Inf."""

    exit_code = EXIT_DIVERGED


class StalledError(DisttrainError):
    """Steps run but the global step does not move: the train op applies no update."""

    exit_code = EXIT_STALLED


class TransientError(DisttrainError):
    """A fault that a restart of this task may cure (a peer down or not yet up)."""

    exit_code = EXIT_TRANSIENT


class PreemptedError(TransientError):
    """The task ended for a preemption (SIGTERM), after the chief checkpointed; a restart resumes."""
