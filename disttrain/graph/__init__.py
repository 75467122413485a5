"""Graph building: the pieces a strategy assembles into one replica's graph.

Placement of variables over the PS tasks by bytes and the device setter
(`placement`), a pipeline's share of the data (`input_context`), NumPy
arrays fed at session start (`input_feeds`), steps per `session.run`
(`run_steps`), clipping by the global norm (`clipping`), learning-rate
schedules (`schedules`) and optimizers (`optimizers`). Nothing here knows
which strategy runs, or that a session exists.

May import: base.
"""
