"""Task guards and job locks: Celery (eager and with real workers), Django's tasks framework
with a real ``db_worker``, RQ's ``@single_instance``, reservations, and a project with the
``celery`` extra alone. The workers' code is in ``tests/support/``.
"""
