"""The end-of-run summary: a table for people, JSON for scripts and CI."""

from __future__ import annotations

from typing import Any

from dbspec.executors.local import RunRecord


def build_summary(record: RunRecord) -> dict[str, Any]:
    """run_id, experiment_id, model name and version, aliases set, gates, metrics, stages."""
    train, evaluate, tune = record.output("train"), record.output("evaluate"), record.output("tune")
    register, promote = record.output("register"), record.output("promote")
    aliases = {}
    if promote.get("decision") == "promoted":
        aliases[promote["alias"]] = promote["version"]
    return {
        "spec": record.spec,
        "target": record.target,
        "run_id": train.get("run_id"),
        "experiment_id": train.get("experiment_id"),
        "tracking_uri": train.get("tracking_uri"),
        "model_uri": train.get("model_uri"),
        "model_name": register.get("name"),
        "model_version": register.get("version"),
        "aliases_set": aliases,
        "previous_alias_holder": promote.get("previous"),
        "promotion": promote.get("decision"),
        "gates": promote.get("gates", []),
        "metrics": evaluate.get("metrics", {}),
        "search": {**{k: tune[k] for k in ("study_name", "storage", "best_value", "best_params",
                                           "best_trial", "trials", "epochs_trained", "metric")
                      if k in tune}, **({"study_run_id": tune["run_id"]} if tune else {})},
        "training": {k: train[k] for k in ("epochs_run", "best_epoch", "train_samples_per_second",
                                           "device", "threads", "batch_size", "world_size", "backend",
                                           "placement") if k in train},
        "diagnosis": train.get("diagnosis", []),
        "batch_predict": record.output("batch_predict"),
        "serve": record.output("serve"),
        "stages": [{"name": s.name, "action": s.action, "seconds": round(s.seconds, 3)}
                   for s in record.stages],
        "state_dir": str(record.run_dir),
    }


def render_summary(summary: dict[str, Any]) -> str:
    """An aligned text table of the summary."""
    rows: list[tuple[str, str]] = []
    ran = [s["name"] for s in summary["stages"] if s["action"] == "ran"]
    cached = [s["name"] for s in summary["stages"] if s["action"] == "cached"]
    rows.append(("stages run", ", ".join(ran) or "none (all unchanged)"))
    if cached:
        rows.append(("stages cached", ", ".join(cached)))
    for key, label in (("run_id", "MLflow run"), ("experiment_id", "experiment"),
                       ("tracking_uri", "tracking URI")):
        if summary.get(key):
            rows.append((label, str(summary[key])))
    if summary.get("model_name"):
        rows.append(("model version", f"{summary['model_name']} v{summary['model_version']}"))
    if summary.get("promotion"):
        moved = ", ".join(f"@{a} -> v{v}" for a, v in summary["aliases_set"].items())
        rows.append(("promotion", summary["promotion"] + (f" ({moved})" if moved else "")))
        for gate in summary["gates"]:
            rows.append(("  gate", gate))
    batch = summary.get("batch_predict") or {}
    if batch:
        written = f"Delta v{batch['output_version']}" if batch.get("output_version") is not None \
            else batch["format"]
        rows.append(("predictions", f"{batch['rows']:,} rows -> {batch['output']} ({written}) "
                                    f"with {batch['model_uri']} (v{batch['model_version']})"))
    serve = summary.get("serve") or {}
    if serve.get("problem"):
        rows.append(("serving", serve["problem"]))
    elif serve:
        rows.append(("serving", f"{serve['model_uri']} (v{serve['model_version']}) answers; "
                                f"start it with: {serve['command']}"))
    search = summary.get("search") or {}
    if search:
        trials = ", ".join(f"{v} {k}" for k, v in search["trials"].items())
        rows.append(("search", f"study {search['study_name']} ({trials}; "
                               f"{search['epochs_trained']} epochs trained)"))
        rows.append(("  storage", search["storage"]))
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in search["best_params"].items())
        rows.append(("  best", f"{search['metric']}={search['best_value']:.6g} (trial "
                               f"{search['best_trial']}): {params}"))
    training = summary.get("training", {})
    if training:
        rows.append(("training", f"{training.get('epochs_run')} epochs (best "
                                 f"{training.get('best_epoch')}), "
                                 f"{training.get('train_samples_per_second', 0):,.0f} samples/s "
                                 f"on {training.get('device')} x{training.get('threads')} "
                                 "threads" + (f", batch size {training['batch_size']}"
                                              if training.get("batch_size") else "")
                                 + (f", {training['world_size']} ranks ({training['backend']}"
                                    f"{', ' + training['placement'] if training.get('placement') else ''})"
                                    if training.get("world_size") else "")))
    for i, finding in enumerate(summary.get("diagnosis") or []):
        rows.append(("diagnosis" if i == 0 else "", finding))
    for name, value in sorted(summary.get("metrics", {}).items()):
        if name.startswith("test_"):
            rows.append((name, f"{value:.6g}"))
    width = max(len(label) for label, _ in rows)
    title = f"dbspec run {summary['spec']}" + (f" --target {summary['target']}"
                                               if summary.get("target") else "")
    return "\n".join([title] + [f"  {label.ljust(width)}  {value}" for label, value in rows])
