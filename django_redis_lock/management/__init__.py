"""Management-command guards: :class:`SingleInstanceCommand` and :class:`SingleInstanceMixin`
(in ``base``), and the ``run_locked`` command, which guards any command without code changes."""
