"""An executor in 40 lines: launch a task, wait out whatever happens to its
pods (a preemption included), print the result, acknowledge it.

    GRACEGUARD_SOCKET=/run/graceguard.sock python executor.py NS TASK TEMPLATE.json
"""

import json
import os
import sys

from graceguard_client import Client, ResultEvent, TransitionEvent


def main() -> int:
    namespace, task, template_file = sys.argv[1:4]
    with open(template_file) as f:
        template = json.load(f)
    c = Client(socket=os.environ["GRACEGUARD_SOCKET"])
    c.put_task(namespace, task, template, retries=1)
    cursor = c.cursor()
    while True:
        batch = cursor.next(wait=20)
        if batch.restarted:  # the sidecar restarted: submit again, it resumes
            c.put_task(namespace, task, template, retries=1)
        for e in batch.events:
            if isinstance(e, TransitionEvent) and e.task == task:
                print(e.pod, e.phase, flush=True)
            elif isinstance(e, ResultEvent) and e.task == task:
                cursor.ack(e)
                print("result:", e.outcome.pod, str(e.outcome.succeeded).lower(), flush=True)
                return 0 if e.outcome.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
