"""The two daemon threads of a process, and what they read: the renewal watchdog
(``renewal.py``), which keeps held leases alive, and the watch for dead holders
(``dead_holders.py``), which ends the lease of a holder whose process is known to be dead, from
the records processes leave in Redis (``process_records.py``).

Each starts on first need and runs for the process's life; nothing here runs on a caller's
thread but the few calls that hand it work (a hold to renew, a holder to look up).
"""
