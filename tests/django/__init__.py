"""The Django side: @prevent_double_submit on views and DRF (and in a real browser), the admin
Locks page (and in a real browser), system checks, management commands, the registry the
admin and ``redis_locks`` read, model row locks, migrations and the Debug Toolbar panel.
"""
