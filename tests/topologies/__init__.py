"""How the locks reach Redis and what each topology adds: the promises every topology keeps
(``test_contract.py``), Sentinel, Redis Cluster (and its failovers), quorum mode, replica
confirmation, TLS, ACL users, Valkey, eviction, and the connection a cache alias gives.
"""
