"""Self-gated sweeps and lane pipelines.

A sweep (``audiofast sweep configs/sweeps/NAME.yaml``) searches a lane's speed/quality space
with Optuna (two objectives, both minimised: seconds and a quality loss), judges every trial
with the project's own gate (a failed gate makes the trial infeasible, never "best"), selects
on one fixed half of the gate's sentences and confirms the chosen configuration on the other
half plus the real recordings, then writes a report and a preset. Studies live in SQLite by
default (resumable after Ctrl-C or a kill) or in PostgreSQL shared by workers on several
machines (heartbeats fail a dead worker's trial and queue it again).

A pipeline (``audiofast pipeline run pipelines/asr.yaml``) runs a lane's stages in order,
each cached by a hash of its inputs, its code and the stages before it.

Modules: ``params`` (search-space entries), ``config`` (sweep YAML), ``split`` (the gate's
two halves), ``asr_lane`` / ``asr_runtime`` / ``audio_lane`` (what a trial configures, runs
and is judged on), ``storage`` (Optuna storage), ``study`` (workers, resume), ``runner``
(search, then finish), ``report`` (Pareto table, PNG, markdown), ``confirm`` (the held-back
verdict and the side-by-side comparison), ``preset`` (configs/presets), ``pipeline`` and
``stages`` (lane pipelines), ``postgres`` (a throwaway PostgreSQL server).
"""
