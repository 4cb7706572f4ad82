"""workd: a Python client and worker for the workd distributed work queue.

    from workd import Client, Worker

    client = Client("http://127.0.0.1:8080")
    job = client.submit({"n": 7}, queue="squares")
    print(client.wait(job["id"])["result"])

    worker = Worker("http://127.0.0.1:8080", capacity=4)

    @worker.handler("squares")
    def square(job):
        job.progress(0.5, "squaring")
        return job.payload["n"] ** 2

    worker.run()  # until SIGTERM: finishes its jobs, then deregisters

Standard library only; OpenTelemetry is used when it is installed.
"""

from ._http import BadAnswer, Unavailable, WorkdError
from ._sse import Event, EventStream, cursor_le
from .client import Client, work_item
from .worker import Cancelled, Fail, Job, Worker

__version__ = "0.1.0"

__all__ = ["Client", "Worker", "Job", "Event", "EventStream", "WorkdError", "Unavailable",
           "BadAnswer", "Cancelled", "Fail", "cursor_le", "work_item", "__version__"]
