"""Beyond the search: the default configuration's point, the chosen configuration's verdict
on what the search never saw, and the two side by side.

- default point: ``audiofast transcribe``'s defaults evaluated exactly like a trial (marked
  on the plot, the "1.00x" of the tables);
- confirmation: the chosen configuration gated on the held-back half of the sentences plus
  the real recordings (ASR), or at other seeds (audio);
- comparison: default and chosen loaded together and timed in alternation on the real clips
  (median of the speed runs), each with its WER there.

Each result is stored in the study's user attributes, so rewriting a report costs nothing.
"""

from __future__ import annotations

import statistics

from audiofast.sweep.config import SweepConfig


def default_point(cfg: SweepConfig, study) -> dict:
    """The default configuration's result: its trial when the space holds it (enqueued as the
    first trial), else evaluated here once, like a trial."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("default") and t.state.name == "COMPLETE":
            return {"config": t.user_attrs["config"], "speed": t.values[0],
                    "quality": t.values[1], "trial": t.number,
                    "passed": all(v <= 0 for v in t.constraints.values()),
                    "checks": t.user_attrs.get("result", {}).get("checks", [])}
    if "default" in study.user_attrs:
        return study.user_attrs["default"]
    module = cfg.lane_module()
    config = module.default_config(cfg.settings)
    result = module.evaluate(config, cfg.settings)
    point = {"config": config, "speed": result["speed"], "quality": result["quality"],
             "passed": result["passed"], "checks": result.get("checks", [])}
    study.set_user_attr("default", point)
    return point


def confirm(cfg: SweepConfig, study, trial: dict) -> dict:
    key = f"confirm:{trial['number']}"
    if key in study.user_attrs:
        return study.user_attrs[key]
    if cfg.lane == "asr":
        result = _confirm_asr(cfg, trial["config"])
    else:
        from audiofast.sweep import audio_lane

        result = audio_lane.confirm(trial["config"], cfg.settings)
    result["trial"] = trial["number"]
    study.set_user_attr(key, result)
    return result


def _confirm_asr(cfg: SweepConfig, config: dict) -> dict:
    from audiofast.eval.gate import gate_asr
    from audiofast.sweep.asr_lane import ASRConfig, gate_halves
    from audiofast.sweep.asr_runtime import set_threads

    settings = cfg.settings
    gcfg, _, held_back = gate_halves(settings)
    spec = ASRConfig(**config).spec()
    set_threads(ASRConfig(config["model"], threads=settings["gate"]["threads"]))
    verdict = gate_asr(spec, settings["baseline"], gcfg, settings["gate"]["threads"],
                       texts=held_back, anchors=True)
    other = "odd" if settings["gate"]["select"] == "even" else "even"
    summary = {role: {k: verdict.details[f"{role}_summary"][k] for k in ("tts_wer", "real_wer")}
               for role in ("candidate", "baseline")}
    return {"passed": verdict.passed, "checks": verdict.checks, "spec": spec,
            "on": f"the {other} half ({len(held_back)} sentences) + real recordings",
            "summary": summary}


def compare(cfg: SweepConfig, study, default: dict, trial: dict) -> dict:
    key = f"compare:{trial['number']}"
    if key in study.user_attrs:
        return study.user_attrs[key]
    if cfg.lane == "asr":
        result = _compare_asr(cfg, default["config"], trial["config"])
    else:
        from audiofast.sweep import audio_lane

        result = audio_lane.compare(default["config"], trial["config"], cfg.settings)
    study.set_user_attr(key, result)
    return result


def _compare_asr(cfg: SweepConfig, default: dict, chosen: dict) -> dict:
    from audiofast.eval.roundtrip import count_errors
    from audiofast.sweep.asr_lane import ASRConfig
    from audiofast.sweep.asr_runtime import build_runtime, set_threads, speed_clips, timed_run

    settings = cfg.settings
    clips = speed_clips(settings)
    runs = max(settings["speed"]["runs"], 1)
    configs = {"default": ASRConfig(**default), "chosen": ASRConfig(**chosen)}
    runtimes = {role: build_runtime(c) for role, c in configs.items()}
    shortest = [min(clips, key=lambda clip: len(clip[1]))]
    times: dict[str, list[float]] = {role: [] for role in configs}
    texts: dict[str, dict[str, str]] = {}
    for role, c in configs.items():  # warm-up
        set_threads(c)
        timed_run(runtimes[role], c, shortest)
    for _ in range(runs):
        for role, c in configs.items():  # alternate, so both see the same machine load
            set_threads(c)
            seconds, texts[role] = timed_run(runtimes[role], c, clips)
            times[role].append(seconds)
    out: dict = {"on": f"the real clips ({', '.join(name for name, _, _ in clips)})",
                 "runs": runs, "metric": "real-clip WER"}
    for role, c in configs.items():
        counted = [count_errors(ref, texts[role][name]) for name, _, ref in clips]
        wer = sum(e for e, _ in counted) / max(1, sum(w for _, w in counted))
        out[role] = {"config": dataclass_dict(c), "seconds": statistics.median(times[role]),
                     "runs": times[role], "wer": wer, "quality_text": f"{100 * wer:.2f}%",
                     "texts": texts[role]}
    out["speed_ratio"] = out["default"]["seconds"] / max(out["chosen"]["seconds"], 1e-9)
    return out


def dataclass_dict(value) -> dict:
    import dataclasses

    return dataclasses.asdict(value)
