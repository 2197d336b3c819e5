"""Prometheus metrics of every process.

* ``registry``: the metric objects. Imported lazily: a Celery worker must point
  ``PROMETHEUS_MULTIPROC_DIR`` at its folder (``worker.prepare_multiproc_dir``) before they exist.
* ``http``: the APIs' request middleware and their ``/metrics`` route.
* ``broker``: queue depth and oldest-message age read from Redis (also ``p2p queues``).
* ``backlog``: queue and job gauges collected at scrape time, cached briefly.
* ``jobs``: the durable-job observer (``Runtime.job_observers``).
* ``worker``: Celery signal handlers and the worker's metrics server.
"""
