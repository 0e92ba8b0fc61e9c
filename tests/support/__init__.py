"""What the tests share and are not tests themselves: helpers, the TCP proxy, the driven
server clock, the topologies' fixtures, connection factories, and the code that runs in child
processes (``workers``, ``semaphore_workers``, ``dead_holder``) or in real task-queue workers
(``celery_app``, ``celery_project``, ``rq_jobs``, ``task_workers``, ``task_evidence``).

Nothing here is collected as a test. The fixtures are in ``tests/conftest.py``.
"""
