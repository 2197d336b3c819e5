"""Composition: which services each process runs (API apps, Celery workers).

The one layer that may import several services. Services never import each other; where a process
serves more than one (the embedding API also answers ``/v1/training-runs``; a worker or the
embedded profile runs every service's tasks), the parts are put together here. See ARCHITECTURE.md.
"""
