"""The lock engine's decisions, without I/O: what a lease value says (``lease.py``) and what
each operation asks of Redis and makes of the answers (``flows.py``). Nothing here imports redis;
``backends/`` carries the requests out, sync or async.

**One concept, one name, in every layer that has a part of it.** ``core/X.py`` decides (pure:
what to send, what a reply means, when something is due); ``backends/X.py`` carries X to Redis,
each topology its way; ``primitives/X.py`` is what a primitive does with it in the caller's
thread, and ``primitives/background/X.py`` what a daemon thread does with it. A concept never
takes a second name in another layer, so its halves are found by its name:

- uncontended: ``core/uncontended.py`` (a bare ``SET``, a flat release) and
  ``primitives/uncontended.py``;
- group (``lock_many``): ``core/group.py`` (its one script) and ``primitives/group.py``;
- renewal: ``core/renewal.py`` (the watchdog's schedule), ``backends/renewal.py`` (many leases
  at once) and ``primitives/background/renewal.py`` (the watchdog);
- dead holders: ``core/dead_holders.py`` (the rules) and ``primitives/background/dead_holders.py``
  (the watch);
- replicas: ``core/replicas.py`` (what confirmed grants need) and ``backends/replicas.py`` (a
  write, then ``WAIT``);
- eviction: ``backends/eviction.py`` (what a server says) and ``primitives/eviction.py`` (the
  advice a process logs once);
- acl: ``backends/acl.py`` (the commands and the rule) and ``primitives/acl.py`` (the rule for
  the settings' keys).
"""
