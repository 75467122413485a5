"""The scaling planner: predict a cluster before renting it, and say what to change.

    model = plan.models.model_from_config(config, step_time=0.5)       # variables from the gin graph
    shape = plan.Shape(hosts=8, gpus_per_host=8, ps=8, link_gbit=10)
    p = plan.predict(model, shape, plan.Strategy("sync_ps"))
    plan.interval.predict(model, shape, plan.Strategy("sync_ps"))      # low, middle and high
    plan.advice.changes(model, shape, plan.Strategy("sync_ps"))        # ranked by the low end

`cost` is the model (pure arithmetic, bytes per link from disttrain.plan.traffic);
`transports` holds the transports and host buses with the spread of their
constants over the environments found; `interval` predicts at both ends of
it; `links` reads a link file of one's own measured links; `models` reads a
gin experiment's model (TensorFlow, scratch graph); `advice` ranks changes;
`measured` sets predictions against benchmark reports; `runs` reads the
published runs from `data/` (a file per source; `data/sets.json` splits
them into the calibration set and the held-out sets); `published` predicts
them, `calibrate` fits the calibration sources' points; `report` prints,
writes JSON and renders the docs' tables (`calibration_table`).

May import: base, graph, strategies, runtime, launch, api, model_zoo and edges.

(The edges parse gin files as `disttrain-plan` does.) The core never imports the planner.
"""

from disttrain.plan.cost import Constants, Model, PlanError, Prediction, Shape, Strategy, predict

__all__ = ["Constants", "Model", "PlanError", "Prediction", "Shape", "Strategy", "predict"]
