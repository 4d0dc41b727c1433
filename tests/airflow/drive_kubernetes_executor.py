"""Drives Airflow's own KubernetesExecutor (the provider installed in this
venv) the way a scheduler does, for graceguard's Airflow seed
(apache/airflow#68683, #66396). Configured by Airflow's own environment
variables (AIRFLOW__...: the metadata database, the executor, its namespace
and kubeconfig, delete_worker_pods=False, adoption at every sync).

Protocol, one JSON line each way:
  prints {"dead": D, "live": [L1, ...]}: the scheduler job ids (a dead one
         whose pods are to be adopted, and the live executors' own);
  then {"ready": true} once every executor has started;
  reads "sync": every executor runs sync() once, all at once in threads
         (heartbeats first), then prints {"synced": n, "errors": [...]};
  reads "end": every executor ends; exits 0.
"""

import argparse
import importlib
import json
import os
import sys
import threading
from datetime import timedelta

# The protocol has stdout to itself: Airflow (and its executors' child
# processes) log to what was stdout, now stderr.
_PROTOCOL = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr


def emit(obj):
    _PROTOCOL.write(json.dumps(obj) + "\n")
    _PROTOCOL.flush()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--executors", type=int, default=1)
    args = p.parse_args()

    from airflow.jobs.job import Job, JobState
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor
    from airflow.utils import timezone
    from airflow.utils.session import create_session

    with create_session() as session:
        dead = Job()
        dead.job_type = "SchedulerJob"
        dead.state = JobState.FAILED
        dead.latest_heartbeat = timezone.utcnow() - timedelta(hours=1)
        session.add(dead)
        live = []
        for _ in range(args.executors):
            j = Job()
            j.job_type = "SchedulerJob"
            j.state = JobState.RUNNING
            j.latest_heartbeat = timezone.utcnow()
            session.add(j)
            live.append(j)
        session.flush()
        ids = {"dead": dead.id, "live": [j.id for j in live]}
    emit(ids)

    # The class airflow.cfg's [core] executor names, as a user configures it
    # (the provider's, or graceguard_airflow's subclass).
    from airflow.configuration import conf

    named = conf.get("core", "executor")
    cls = KubernetesExecutor
    if "." in named:
        module, _, attr = named.rpartition(".")
        cls = getattr(importlib.import_module(module), attr)
    executors = []
    for jid in ids["live"]:
        ex = cls()
        ex.job_id = jid
        ex.start()
        executors.append(ex)
    emit({"ready": True})

    synced = 0
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "end":
            break
        if cmd != "sync":
            continue
        with create_session() as session:
            for jid in ids["live"]:
                j = session.get(Job, jid)
                j.latest_heartbeat = timezone.utcnow()
        # At once, as schedulers of an HA deployment each run their loop.
        barrier = threading.Barrier(len(executors))
        errors = []

        def one(ex):
            barrier.wait()
            try:
                ex.sync()
            except Exception as e:  # reported, not hidden
                errors.append(repr(e))

        threads = [threading.Thread(target=one, args=(ex,)) for ex in executors]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        synced += 1
        emit({"synced": synced, "errors": errors})
    for ex in executors:
        ex.end()
    return 0


if __name__ == "__main__":
    sys.exit(main())
