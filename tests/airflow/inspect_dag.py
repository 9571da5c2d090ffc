"""Runs INSIDE the Airflow venv: load the DAG folder and write what the test checks as JSON.

    .venv-airflow/bin/python tests/airflow/inspect_dag.py DAG_FOLDER OUT.json

A separate file because the project venv has no Airflow; Airflow's own log lines go to
stdout, so the facts go to OUT.json.
"""
import json
import sys

from airflow.dag_processing.dagbag import DagBag


def facts(dag_folder: str) -> dict:
    bag = DagBag(dag_folder=dag_folder)
    dags = {}
    for dag_id, dag in bag.dags.items():
        dags[dag_id] = {
            "schedule": dag.schedule if isinstance(dag.schedule, str) else repr(dag.schedule),
            "catchup": dag.catchup,
            "max_active_runs": dag.max_active_runs,
            "params": dag.params.dump(),
            "tasks": {
                t.task_id: {
                    "upstream": sorted(t.upstream_task_ids),
                    "downstream": sorted(t.downstream_task_ids),
                    "retries": t.retries,
                    "has_timeout": t.execution_timeout is not None,
                    "template_fields": {f: repr(getattr(t, f)) for f in t.template_fields},
                }
                for t in dag.tasks
            },
        }
    return {"import_errors": {str(k): str(v) for k, v in bag.import_errors.items()}, "dags": dags}


if __name__ == "__main__":
    with open(sys.argv[2], "w") as out:
        json.dump(facts(sys.argv[1]), out, indent=2)
